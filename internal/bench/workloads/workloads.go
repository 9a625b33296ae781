package workloads

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Program is one program of the set.
type Program struct {
	Name    string // how the set, --programs and subtests name it
	Package string // the Debian package that installs Command
	Command string // the executable, looked up in PATH
	// Checker: the program verifies the memory it writes (memtester,
	// stress-ng --verify); its output is not compared with a plain
	// run's (it has times and pids in it), Check reads it for errors.
	Checker bool
	// DefaultSize is the size knob's default, chosen so that a plain run
	// takes 0.5-3 s on a 2-CPU VM and peaks at 50-300 MB; SizeUnit says
	// what the size counts.
	DefaultSize int64
	SizeUnit    string
	Summary     string // what the program does with its input
	// NoCgroup, where not empty, says why the program cannot run in a
	// memory cgroup smaller than its memory.
	NoCgroup string
	// BoundSize is the size knob for a run under valgrind's lackey tool
	// (uvm lab bound, uvm bench cliff --bound), thousands of times
	// slower than plain: an input of about 0.1 s plain, minutes there.
	BoundSize int64
	// UVMFlags are flags `uvm run` needs to manage the program's memory
	// (a --min-size small enough to catch its buffers); RunUVM puts them
	// before the harness's own.
	UVMFlags []string
	prepare  func(dir string, size int64) (spec, error)
}

// spec is what a program's prepare returns: its arguments (after the
// executable), and the rest of a Workload.
type spec struct {
	args    []string
	stdin   string
	outputs []string
	env     []string
	check   func(output string) error
}

// Workload is a Program prepared for one size: its input written, its
// command line fixed.
type Workload struct {
	Program Program
	Size    int64
	Argv    []string // the executable's absolute path, then the arguments
	Stdin   string   // a file for standard input, or "" (no input)
	// Outputs are the files the program writes, relative to its run's
	// directory, compared byte for byte besides standard output.
	Outputs []string
	Env     []string // added to the caller's environment (LC_ALL=C for all)
	Dir     string   // where its input was written
	// PeakWrapper is BuildPeakWrapper's program: RunPlain and RunWrapped
	// run the program through it, so that Run.MaxRSS is the program's
	// own peak. Without it, MaxRSS is the rusage of the process waited
	// for, which includes the peak of this (Go) process: see
	// peakWrapperSource.
	PeakWrapper string
	check       func(output string) error
}

// Set returns every program of the set, the real programs first, then
// the checkers.
func Set() []Program {
	return []Program{gawkProgram, perlProgram, python3Program, sqlite3Program, jqProgram, tsortProgram, sortProgram, zstdProgram,
		memtesterProgram, stressNGProgram}
}

// Names returns the names of the programs of the set, in order.
func Names() []string { return names(Set()) }

func names(programs []Program) []string {
	var out []string
	for _, p := range programs {
		out = append(out, p.Name)
	}
	return out
}

// All returns every program of the package: the set, then those whose
// memory `uvm run` manages only with flags of their own (UVMFlags: gzip
// keeps its buffers in 796 KiB of static arrays, xz in allocations of
// 64-930 KiB), which a budget made of a fraction of the peak RSS, as
// uvm bench run's, does not reach.
func All() []Program { return append(Set(), gzipProgram, xzProgram) }

// AllNames returns the names of All's programs, in order.
func AllNames() []string { return names(All()) }

// Lookup returns the program of All named name.
func Lookup(name string) (Program, bool) {
	for _, p := range All() {
		if p.Name == name {
			return p, true
		}
	}
	return Program{}, false
}

// Select returns the programs named in a comma list, in the set's
// order; "" or "all" is the whole set.
func Select(list string) ([]Program, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "all" {
		return Set(), nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	var out []Program
	for _, p := range Set() {
		if want[p.Name] {
			out = append(out, p)
			delete(want, p.Name)
		}
	}
	if len(want) > 0 {
		var unknown []string
		for n := range want {
			unknown = append(unknown, n)
		}
		return nil, fmt.Errorf("unknown program(s) %s: the set is %s", strings.Join(unknown, ", "), strings.Join(Names(), ", "))
	}
	return out, nil
}

// Path returns the absolute path of the program's executable, or an
// error naming the Debian package to install. python3 is Debian's
// /usr/bin/python3 where it exists, not a version manager's shim that
// PATH may find first.
func (p Program) Path() (string, error) {
	if p.Command == "python3" {
		if _, err := os.Stat("/usr/bin/python3"); err == nil {
			return "/usr/bin/python3", nil
		}
	}
	path, err := exec.LookPath(p.Command)
	if errors.Is(err, exec.ErrDot) {
		err = nil
	}
	if err != nil {
		return "", fmt.Errorf("%s is not installed (apt-get install %s): %w", p.Command, p.Package, err)
	}
	return filepath.Abs(path)
}

// Prepare writes the program's input for size (DefaultSize if 0) into
// dir, which must exist, and returns the workload. The same size gives
// the same input bytes every time.
func (p Program) Prepare(dir string, size int64) (*Workload, error) {
	if size <= 0 {
		size = p.DefaultSize
	}
	exe, err := p.Path()
	if err != nil {
		return nil, err
	}
	s, err := p.prepare(dir, size)
	if err != nil {
		return nil, fmt.Errorf("%s: generating its input: %w", p.Name, err)
	}
	return &Workload{Program: p, Size: size, Argv: append([]string{exe}, s.args...), Stdin: s.stdin, Outputs: s.outputs,
		Env: append([]string{"LC_ALL=C"}, s.env...), Dir: dir, check: s.check}, nil
}

// Synthetic makes a workload of a program built elsewhere (a C program a
// benchmark builds at run time): argv is its command line, the
// executable's absolute path first; size is what its size knob was. It
// is a Checker: check reads its standard output and error, and outputs
// are not compared.
func Synthetic(name, summary string, argv, uvmFlags []string, size int64, check func(output string) error) *Workload {
	return &Workload{Program: Program{Name: name, Command: argv[0], Checker: true, DefaultSize: size, Summary: summary, UVMFlags: uvmFlags},
		Size: size, Argv: argv, Env: []string{"LC_ALL=C"}, check: check}
}

// CommandLine is the workload's command line as a shell would take it
// (with its standard input), for reports: the executable and the files
// in the workload's directory by their base names.
func (w *Workload) CommandLine() string {
	var b strings.Builder
	for i, a := range w.Argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i == 0 || (w.Dir != "" && filepath.Dir(a) == filepath.Clean(w.Dir)) {
			a = filepath.Base(a)
		}
		if strings.ContainsAny(a, " \t\n'\"$*?;&|<>(){}[]\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		b.WriteString(a)
	}
	if w.Stdin != "" {
		b.WriteString(" < " + filepath.Base(w.Stdin))
	}
	return b.String()
}

func writeScript(dir, name, text string) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(text), 0o644)
}

// The real programs. Each builds a structure of many small pieces from
// its input and prints what it found, so that a page that comes back
// wrong changes its output.

var gawkProgram = Program{
	Name: "gawk", Package: "gawk", Command: "gawk", DefaultSize: 16 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of text",
	Summary: "counts the words of a text in an associative array and prints each word and its count, sorted",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "gawk-text.txt")
		if err := writeText(in, size, 11, 40); err != nil {
			return spec{}, err
		}
		prog, err := writeScript(dir, "count.awk", `{ for (i = 1; i <= NF; i++) count[$i]++ }
END {
	PROCINFO["sorted_in"] = "@ind_str_asc"
	for (w in count) print w, count[w]
}
`)
		return spec{args: []string{"-f", prog, in}}, err
	},
}

var perlProgram = Program{
	Name: "perl", Package: "perl-base", Command: "perl", DefaultSize: 12 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of text",
	Summary: "builds a hash of every word of a text to its count and the lines it is on, and prints it sorted",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "perl-text.txt")
		if err := writeText(in, size, 12, 40); err != nil {
			return spec{}, err
		}
		prog, err := writeScript(dir, "index.pl", `use strict; use warnings;
my %count; my %last;
while (my $line = <>) {
	for my $w (split ' ', $line) { $count{$w}++; $last{$w} = $.; }
}
for my $w (sort keys %count) { print "$w $count{$w} $last{$w}\n"; }
printf "%d words\n", scalar keys %count;
`)
		return spec{args: []string{prog, in}}, err
	},
}

var python3Program = Program{
	Name: "python3", Package: "python3", Command: "python3", DefaultSize: 12 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of text",
	Summary: "builds a dict of every word of a text to the list of its line numbers, and prints each word's count, first and last line, sorted",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "python3-text.txt")
		if err := writeText(in, size, 13, 40); err != nil {
			return spec{}, err
		}
		prog, err := writeScript(dir, "index.py", `import sys
index = {}
with open(sys.argv[1]) as f:
    for n, line in enumerate(f):
        for w in line.split():
            lines = index.get(w)
            if lines is None:
                index[w] = [n]
            else:
                lines.append(n)
out = sys.stdout
for w in sorted(index):
    lines = index[w]
    out.write(f"{w} {len(lines)} {lines[0]} {lines[-1]} {sum(lines) % 1000003}\n")
out.write(f"{len(index)} words\n")
`)
		// No hash randomization: the output is sorted anyway, this
		// keeps the runs' allocations alike too.
		return spec{args: []string{prog, in}, env: []string{"PYTHONHASHSEED=0"}}, err
	},
}

var sqlite3Program = Program{
	Name: "sqlite3", Package: "sqlite3", Command: "sqlite3", DefaultSize: 16 << 20, BoundSize: 256 << 10, SizeUnit: "bytes of CSV",
	Summary: "imports CSV rows into an in-memory database with a large page cache, indexes them and runs grouping, distinct and ordered queries",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "sqlite3-rows.csv")
		if err := writeRowsCSV(in, size, 14); err != nil {
			return spec{}, err
		}
		script, err := writeScript(dir, "queries.sql", `PRAGMA cache_size = -1000000;
PRAGMA temp_store = MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, val INTEGER);
.mode csv
.import `+in+` t
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp_val ON t(grp, val);
.mode list
SELECT count(*), count(DISTINCT name), sum(val) FROM t;
SELECT grp, count(*), sum(val), min(name), max(name) FROM t GROUP BY grp ORDER BY grp;
SELECT name, count(*), sum(val) FROM t GROUP BY name HAVING count(*) > 2 ORDER BY name LIMIT 2000;
SELECT id, name, val FROM t ORDER BY name, id LIMIT 1000 OFFSET 5000;
SELECT grp, val, id FROM t WHERE grp = 17 ORDER BY val, id;
`)
		return spec{args: []string{"-batch", ":memory:"}, stdin: script}, err
	},
}

var jqProgram = Program{
	Name: "jq", Package: "jq", Command: "jq", DefaultSize: 8 << 20, BoundSize: 512 << 10, SizeUnit: "bytes of JSON",
	Summary: "parses a JSON array of records and groups them by tag: counts, sums, distinct users and words",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "jq-records.json")
		if err := writeJSONRecords(in, size, 15); err != nil {
			return spec{}, err
		}
		filter := `group_by(.tag) | map({tag: .[0].tag, n: length, score: (map(.score) | add), users: (map(.user) | unique | length), words: ([.[].words[]] | unique | length)}) | .[]`
		return spec{args: []string{"-c", filter, in}}, nil
	},
}

var tsortProgram = Program{
	Name: "tsort", Package: "coreutils", Command: "tsort", DefaultSize: 8 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of edges",
	Summary: "sorts the nodes of a random acyclic graph topologically (a tree of nodes and their successor lists)",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "tsort-edges.txt")
		return spec{args: []string{in}}, writeDAG(in, size, 16)
	},
}

var sortProgram = Program{
	Name: "sort", Package: "coreutils", Command: "sort", DefaultSize: 64 << 20, BoundSize: 8 << 20, SizeUnit: "bytes of text",
	Summary: "sorts the lines of a text (one large buffer and a line table)",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "sort-text.txt")
		return spec{args: []string{in}}, writeText(in, size, 17, 40)
	},
}

var zstdProgram = Program{
	Name: "zstd", Package: "zstd", Command: "zstd", DefaultSize: 12 << 20, BoundSize: 256 << 10, SizeUnit: "bytes of text",
	Summary: "compresses a text at level 12 with a 64 MiB long-distance window into an output file (compared byte for byte)",
	prepare: func(dir string, size int64) (spec, error) {
		in := filepath.Join(dir, "zstd-text.txt")
		return spec{args: []string{"-q", "-T1", "-12", "--long=24", "-o", "text.zst", in}, outputs: []string{"text.zst"}},
			writeText(in, size, 18, 200)
	},
}

// The compressors of All, beyond the set: their memory is managed only
// with a --min-size of their own.

// logCompressor is a compressor of a web-server log (WriteLog with
// seed), with the uvm run flags it needs: it runs with args, then the
// log's path.
func logCompressor(name, pkg string, size, boundSize int64, seed uint64, summary string, uvmFlags []string, args ...string) Program {
	return Program{Name: name, Package: pkg, Command: name, DefaultSize: size, BoundSize: boundSize, SizeUnit: "bytes of log text",
		Summary: summary, UVMFlags: uvmFlags,
		prepare: func(dir string, size int64) (spec, error) {
			in := filepath.Join(dir, name+"-log.txt")
			return spec{args: append(slices.Clip(args), in)}, WriteLog(in, size, seed)
		},
	}
}

// gzip keeps its buffers in static arrays: --min-size alone (which also
// sets --heap system) makes its data segment what is managed, as in
// integration's TestRunRealPrograms.
var gzipProgram = logCompressor("gzip", "gzip", 24<<20, 1<<20, 19,
	"compresses a web-server log to standard output; gzip keeps every buffer in static arrays (its 796 KiB writable data segment), which uvm run manages at --min-size 512KiB",
	[]string{"--min-size", "512KiB"}, "-c")

var xzProgram = logCompressor("xz", "xz-utils", 32<<20, 1<<20, 20,
	"compresses a web-server log at preset 0 on one thread to standard output: a 1 MiB dictionary, a 512 KiB hash table and three buffers of 64-930 KiB, which uvm run manages at --min-size 64KiB",
	[]string{"--min-size", "64KiB"}, "-0", "-T1", "-c")

// The checkers.

var memtesterProgram = Program{
	Name: "memtester", Package: "memtester", Command: "memtester", Checker: true, DefaultSize: 24 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of memory tested",
	Summary:  "writes and checks its patterns over its memory once (every test of one loop)",
	NoCgroup: "memtester locks its memory (mlock), which a memory cgroup smaller than it cannot swap out: the cgroup's OOM killer kills it",
	prepare: func(dir string, size int64) (spec, error) {
		return spec{args: []string{strconv.FormatInt(max(size>>20, 1), 10) + "M", "1"}, check: checkMemtester}, nil
	},
}

var stressNGProgram = Program{
	Name: "stress-ng", Package: "stress-ng", Command: "stress-ng", Checker: true, DefaultSize: 48 << 20, BoundSize: 1 << 20, SizeUnit: "bytes of memory stressed",
	Summary: "runs every vm method over its memory with verification (--verify), a fixed number of operations",
	prepare: func(dir string, size int64) (spec, error) {
		// About 2,000 bogo operations per MiB: 2 s for 48 MiB here.
		ops := max(size>>9, 1000)
		return spec{args: []string{"--vm", "1", "--vm-bytes", strconv.FormatInt(size, 10), "--vm-method", "all", "--verify",
			"--vm-ops", strconv.FormatInt(ops, 10), "--timeout", "600s"}, check: checkStressNG}, nil
	},
}

// memtester prints "ok" after each test and "FAILURE: ..." for each
// word that reads back wrong.
func checkMemtester(out string) error {
	if bad := errorLines(out, regexp.MustCompile(`(?i)fail|error|mismatch`)); bad != "" {
		return fmt.Errorf("memtester reported errors:\n%s", bad)
	}
	if !strings.Contains(out, "Done.") {
		return fmt.Errorf("memtester did not finish its loop (no \"Done.\"):\n%s", tail(out, 2000))
	}
	return nil
}

// stress-ng prints "fail:" lines (a verification failure: "detected
// memory error") and "error:" lines, and "successful run completed"
// only when every stressor passed.
func checkStressNG(out string) error {
	if bad := errorLines(out, regexp.MustCompile(`(?i)\bfail|\berror|detected|corrupt`)); bad != "" {
		return fmt.Errorf("stress-ng reported errors:\n%s", bad)
	}
	if !regexp.MustCompile(`\bsuccessful run completed`).MatchString(out) { // not "unsuccessful"
		return fmt.Errorf("stress-ng did not report a successful run:\n%s", tail(out, 2000))
	}
	return nil
}

// errorLines returns the lines of out that match re, at most 20.
func errorLines(out string, re *regexp.Regexp) string {
	var bad []string
	for _, line := range strings.Split(out, "\n") {
		if re.MatchString(line) {
			bad = append(bad, line)
			if len(bad) == 20 {
				bad = append(bad, "...")
				break
			}
		}
	}
	return strings.Join(bad, "\n")
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
