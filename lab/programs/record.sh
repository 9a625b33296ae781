#!/bin/bash
# record.sh: record the policy lab's shipped traces (lab/traces).
#
#   lab/programs/record.sh OUTDIR [NAME...]
#
# NAME is sort, zstd, sqlite3, stencil, pointer_chase or pingpong (default:
# all, in that order). For each it writes OUTDIR/NAME.uvmtrace and
# OUTDIR/NAME.uvmtrace.gz (gzip -9), OUTDIR/NAME.summary.txt (uvm trace
# summary) and a line in OUTDIR/record.log with the plain and recorded run
# times. The programs, the generated inputs and their outputs go in
# OUTDIR/work; the inputs are made by gen.c from fixed seeds, so they are
# the same on every machine. Run it as root (userfaultfd), on an idle
# machine, from a checkout built with `make build`.
#
# Environment: UVM (the uvm binary; default bin/uvm of this checkout),
# ATTEMPTS (1), RECORD_TIMEOUT (seconds per recording, 180), PIN_CPU (the
# CPU every process of a run is pinned to with taskset; default the last
# one; "none" to leave them unpinned).
#
# Why one CPU: the server evicts over the host budget after it has woken
# the faulting thread. With a CPU of its own the program's next fault then
# races with that eviction, and the live run evicts and faults in ways a
# replay, which serves one event after another, does not reproduce (sort
# at 80 MiB: a replay finds 0.28-0.30 of the faults unpinned, 0.999
# pinned). On one CPU the eviction finishes before the program runs on.
#
# The server's policies are its defaults: every UVM_* variable of the
# caller is unset. Where the uvm binary has `uvm trace replay` (the lab),
# each trace is replayed with its own policies, and the log says how
# close the replay came to the recorded faults and bytes moved. A trace
# that misses by more than 5% is recorded again only where ATTEMPTS asks
# for more than one recording (the shipped traces each took one); the
# last attempt is kept either way, and the log says so.
set -euo pipefail

if [ $# -lt 1 ]; then
	echo "usage: $0 OUTDIR [sort|zstd|sqlite3|stencil|pointer_chase|pingpong ...]" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(sort zstd sqlite3 stencil pointer_chase pingpong)
UVM=$(realpath "${UVM:-$repo/bin/uvm}")
ATTEMPTS=${ATTEMPTS:-1}
PIN_CPU=${PIN_CPU:-$(($(nproc) - 1))}
pin=()
[ "$PIN_CPU" = none ] || pin=(taskset -c "$PIN_CPU")
RECORD_TIMEOUT=${RECORD_TIMEOUT:-180}
work=$out/work
log=$out/record.log
mkdir -p "$work"

for v in $(compgen -e | grep '^UVM_' || true); do unset "$v"; done
export LC_ALL=C

say() { echo "$*" | tee -a "$log" >&2; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

say "# $(date -u +%Y-%m-%dT%H:%M:%SZ) record.sh ${names[*]} on $(nproc) CPUs, Linux $(uname -r); pinned to CPU $PIN_CPU"
say "# uvm: $UVM (commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet HEAD -- . 2>/dev/null || echo ", with changes"))"

# The programs and the inputs.
gcc -O2 -Wall -Wextra -o "$work/gen" "$here/gen.c"
gcc -O2 -Wall -Wextra -o "$work/stencil" "$here/stencil.c"
gcc -O2 -Wall -Wextra -o "$work/pointer_chase" "$here/pointer_chase.c"
cp "$here/sqlite3.sql" "$work/sqlite3.sql"
cd "$work"
need() { # need FILE gen-args...: make FILE once
	local f=$1
	shift
	[ -s "$f" ] || ./gen "$@" > "$f"
}

# replay_ok TRACE: true if the replay of TRACE's own policies finds its
# faults and bytes within 5%, or if this uvm has no replay.
fidelity=""
replay_ok() {
	local line
	if ! line=$("$UVM" trace replay "$1" 2>/dev/null | grep 'replayed/recorded'); then
		fidelity="(no replay)"
		return 0
	fi
	fidelity=$(echo "$line" | sed 's/.*(replayed\/recorded: //; s/)$//')
	echo "$fidelity" | awk '{ f = $2 + 0; b = $4 + 0; exit !(f >= 0.95 && f <= 1.05 && b >= 0.95 && b <= 1.05) }'
}

# record NAME KIND ARGS... : time the plain run, then record.
#   KIND run:      ARGS are uvm trace record's flags, --, the command
#   KIND pingpong: ARGS are environment assignments, --, the command
# Standard input comes from $stdin; standard output goes to NAME.plain.out
# and NAME.out, which must be the same.
record() {
	local name=$1 kind=$2
	shift 2
	local flags=() cmd=()
	while [ "$1" != -- ]; do flags+=("$1"); shift; done
	shift
	cmd=("$@")
	local t0 t1 plain rec attempt rc
	t0=$(now)
	if [ "$kind" = pingpong ]; then
		"${pin[@]}" env UVM_SERVER=private "${cmd[@]}" < "$stdin" > "$name.plain.out"
	else
		"${pin[@]}" "${cmd[@]}" < "$stdin" > "$name.plain.out"
	fi
	t1=$(now)
	plain=$(secs "$t0" "$t1")
	for attempt in $(seq 1 "$ATTEMPTS"); do
		sleep 3 # the VM hands freed memory back to its host
		rm -f "$out/$name.uvmtrace"
		t0=$(now)
		rc=0
		# Eviction lru, not the default clock: clock watches the
		# program's page table (hint faults), and a trace holds only the
		# touches that faulted or that its access mode sampled, so a
		# replay of clock cannot follow the server's choices.
		if [ "$kind" = pingpong ]; then
			timeout "$RECORD_TIMEOUT" "${pin[@]}" env UVM_SERVER=private UVM_EVICTION=lru "${flags[@]}" \
				UVM_TRACE="$out/$name.uvmtrace" "${cmd[@]}" < "$stdin" > "$name.out" || rc=$?
		else
			timeout "$RECORD_TIMEOUT" "${pin[@]}" "$UVM" trace record --quiet --out "$out/$name.uvmtrace" --eviction lru "${flags[@]}" \
				-- "${cmd[@]}" < "$stdin" > "$name.out" 2> "$name.err" || rc=$?
		fi
		t1=$(now)
		rec=$(secs "$t0" "$t1")
		if [ $rc -ne 0 ]; then
			say "$name: attempt $attempt exited $rc after ${rec}s"
			continue
		fi
		cmp -s "$name.plain.out" "$name.out" || { say "$name: output differs from the plain run's"; exit 1; }
		if replay_ok "$out/$name.uvmtrace"; then
			say "$name: plain ${plain}s, recorded ${rec}s (attempt $attempt); replay $fidelity"
			break
		fi
		say "$name: attempt $attempt, recorded ${rec}s: replay $fidelity, outside 5%"
	done
	[ -s "$out/$name.uvmtrace" ] || { say "$name: no trace"; exit 1; }
	"$UVM" trace summary "$out/$name.uvmtrace" > "$out/$name.summary.txt"
	gzip -9 -n -c "$out/$name.uvmtrace" > "$out/$name.uvmtrace.gz"
	say "$name: $(grep '^events' "$out/$name.summary.txt" | tr -s ' '), $(stat -c %s "$out/$name.uvmtrace.gz") bytes gzipped"
}

stdin=/dev/null
for name in "${names[@]}"; do
	case $name in
	sort)
		# 2.4 million lines (82 MB); one thread (two would interleave
		# their faults, which a replay cannot reproduce). Peak about
		# 188 MiB of managed memory.
		need sort.txt lines 2400000 1
		record sort run --host-budget 80MiB --trace-access 50ms,32MiB \
			-- sort --parallel=1 sort.txt
		;;
	zstd)
		# 160 MB of text at level 6 with a 128 MiB long-distance window,
		# one thread, no asynchronous I/O threads. Peak about 141 MiB.
		# Without the access mode: with it (100ms,8MiB or 50ms,32MiB)
		# at this budget a replay found 0.60-0.62 of the faults.
		need zstd.txt text 160000000 3
		record zstd run --host-budget 64MiB \
			-- zstd -q --single-thread --no-asyncio -6 --long=27 -c zstd.txt
		;;
	sqlite3)
		# 600,000 CSV rows (27 MB) into :memory:, two indexes, six
		# queries (sqlite3.sql). Peak about 104 MiB.
		need rows.csv csv 600000 5
		stdin=sqlite3.sql
		record sqlite3 run --host-budget 36MiB --trace-access 100ms,8MiB \
			-- sqlite3 -batch :memory:
		stdin=/dev/null
		;;
	stencil)
		# Two 2048 x 2048 float grids (32 MiB), 256 Jacobi iterations.
		record stencil run --host-budget 12MiB --trace-access 50ms,16MiB \
			-- ./stencil 2048 256
		;;
	pointer_chase)
		# 2^20 nodes of 64 bytes (64 MiB, and a 4 MiB permutation while
		# building), 30,000 steps of the walk.
		record pointer_chase run --host-budget 24MiB --trace-access 50ms,16MiB \
			-- ./pointer_chase 20 30000
		;;
	pingpong)
		# A 32 MiB array written in turn by a kernel on device 0 and
		# by the host, 96 rounds, with device 0's arena half the array:
		# the device evicts to the host in every round.
		(cd "$repo" && go build -o "$work/pingpong" lab/programs/pingpong/main.go)
		record pingpong pingpong UVM_ARENA_SIZE=16MiB -- ./pingpong 32 96
		;;
	*)
		echo "$0: unknown trace $name" >&2
		exit 2
		;;
	esac
done
say "# done: $(ls "$out"/*.uvmtrace.gz | wc -l) traces in $out"
