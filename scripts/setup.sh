#!/bin/sh
# setup.sh: what `make` runs before it builds (`make setup`). It finds
# what the build and `uvm run` need on this machine: Go, a C compiler
# that builds programs (gcc and libc6-dev), pkg-config, and jemalloc's
# run-time library (libjemalloc2: the managed heap of `uvm run` loads
# libjemalloc.so.2 when a program starts). Where something is missing it
# installs it when it can (root, with apt-get: Debian and Ubuntu), or
# stops, naming the one command that installs it. Never a build that
# quietly lacks a part.
#
# CC and GO are make's (the compiler and the go command it builds with);
# GO_PREFIX is where go.dev's Go is looked for, and where the command
# printed for a missing Go installs it (/usr/local: /usr/local/go).
set -eu

CC=${CC:-cc}
GO=${GO:-go}
GO_PREFIX=${GO_PREFIX:-/usr/local}
here=$(cd "$(dirname "$0")/.." && pwd)

say() { printf 'setup: %s\n' "$*"; }

# The Debian packages of what is missing, and why each is wanted.
packages=""
want() {
	packages="$packages $1"
	say "missing: $2"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

# cc_works: the compiler builds and links a program against the C
# library's headers (gcc without libc6-dev does not).
cc_works() {
	printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$work/c.c"
	$CC -o "$work/c" "$work/c.c" >"$work/cc.log" 2>&1
}

# jemalloc_installed: the dynamic loader finds libjemalloc.so.2.
jemalloc_installed() {
	ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
	if [ -x "$ldconfig" ]; then
		"$ldconfig" -p 2>/dev/null | grep -q 'libjemalloc\.so\.2 '
	else
		dpkg-query -W -f='${Status}' libjemalloc2 2>/dev/null | grep -q 'ok installed'
	fi
}

check() {
	packages=""
	if ! cc_works; then
		case $CC in
		cc | gcc) want "gcc libc6-dev" "a C compiler that builds programs (CC=$CC): libuvm and uvm run's preload library are C" ;;
		*)
			say "CC=$CC cannot build a program:"
			sed 's/^/  /' "$work/cc.log" >&2
			say "install it, or leave CC unset to build with gcc"
			exit 1
			;;
		esac
	fi
	command -v pkg-config >/dev/null 2>&1 ||
		want pkg-config "pkg-config: C programs build against the installed libuvm with \`pkg-config --cflags --libs uvm\`"
	jemalloc_installed ||
		want libjemalloc2 "jemalloc's run-time library, libjemalloc.so.2: uvm run's managed heap (a program's small allocations) loads it"
}

# go_missing: Go is not in PATH. It is not a Debian package new enough
# (go.mod asks for more than Debian 12's 1.19), so the one command that
# installs it is go.dev's, printed by go_command.
go_missing() { ! command -v "$GO" >/dev/null 2>&1; }
go_command() {
	version=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod")
	case $(uname -m) in
	x86_64) arch=amd64 ;;
	aarch64) arch=arm64 ;;
	*) arch=$(uname -m) ;;
	esac
	if [ -x "$GO_PREFIX/go/bin/go" ]; then
		say "$GO_PREFIX/go/bin/go is installed but not in PATH: export PATH=$GO_PREFIX/go/bin:\$PATH"
		return
	fi
	sudo=""
	[ -w "$GO_PREFIX" ] || sudo="sudo "
	say "install Go $version with:"
	printf '  curl -fsSL https://go.dev/dl/go%s.linux-%s.tar.gz | %star -C %s -xz && export PATH=%s/go/bin:$PATH\n' "$version" "$arch" "$sudo" "$GO_PREFIX" "$GO_PREFIX"
}

go_missing && say "missing: Go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod") or later (go.mod), to build uvm"
check
if [ -n "$packages" ]; then
	if ! command -v apt-get >/dev/null 2>&1; then
		say "this is not Debian or Ubuntu (no apt-get): install the above with this system's package manager (Debian's names:$packages)"
		go_missing && go_command
		exit 1
	fi
	if [ "$(id -u)" != 0 ]; then
		say "install them with:"
		printf '  sudo apt-get install -y%s\n' "$packages"
		go_missing && go_command
		exit 1
	fi
	say "installing$packages (apt-get)"
	apt-get update -q || { say "apt-get update failed"; exit 1; }
	# shellcheck disable=SC2086 # one word per package
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages ||
		{ say "apt-get install$packages failed"; exit 1; }
	check
	if [ -n "$packages" ]; then
		say "still missing after apt-get install:$packages"
		exit 1
	fi
fi
if go_missing; then
	go_command
	exit 1
fi
say "the build and uvm run have what they need: Go ($(command -v "$GO")), a C compiler ($CC), pkg-config, libjemalloc.so.2"
if [ "$(id -u)" != 0 ] && ! [ -w /dev/userfaultfd ] && [ "$(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null)" != 1 ]; then
	say "note: this user cannot use userfaultfd, which uvm demo, uvm run and make test need: run them as root (bin/uvm doctor says what else would do)"
fi
