package grade

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/softuvm/softuvm/lab/course"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uvm"
)

// Main is the graded binary's main function: it grades the policy named
// "student" that the binary's packages registered, for the assignment
// called assignment, and exits. It calls uvm.Main first, so it must be
// the first thing main does.
//
// Its flags (the grader passes them): --traces DIR, a directory of traces
// to replay (repeated for more; default lab/traces); --file NAME, the
// student's file, for the report; --no-live, no live run; --json, the
// report as JSON.
func Main(assignment string) {
	uvm.Main()
	os.Exit(run(assignment, os.Args[1:], os.Stdout, os.Stderr))
}

// run grades, and returns the exit status: 0 graded, 1 not, 2 a usage
// error.
func run(assignment string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("graded binary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var traces []string
	fs.Func("traces", "a directory of traces to replay (*.uvmtrace, *.uvmtrace.gz); repeat it for more (default lab/traces)", func(dir string) error {
		traces = append(traces, dir)
		return nil
	})
	file := fs.String("file", "", "the student's file, as the report names it")
	noLive := fs.Bool("no-live", false, "skip the live run")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	liveRun := fs.String(liveRunFlag, "", "run the live program once, with the policy of this role (baseline or student), and print what it did as JSON (the grader's child process)")
	liveName := fs.String(liveNameFlag, "", "the policy's name in a live run's report")
	liveLog := fs.String(liveLogFlag, "", "the file a live run's server logs to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *liveRun != "" {
		a, err := course.Lookup(assignment)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return liveMain(a, *liveRun, *liveName, *liveLog, stdout, stderr)
	}
	if traces == nil {
		traces = []string{"lab/traces"}
	}
	r, err := Grade(assignment, Options{Traces: traces, File: *file, NoLive: *noLive})
	if err != nil {
		fmt.Fprintf(stderr, "uvm lab grade: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(stderr, "uvm lab grade: %v\n", err)
			return 1
		}
		return 0
	}
	r.write(stdout)
	return 0
}

// Options says what Grade does besides the assignment.
type Options struct {
	// Traces are the directories of traces to replay.
	Traces []string
	// File names the student's file in messages and the report.
	File string
	// NoLive skips the live run.
	NoLive bool
}

// Grade grades the policy named "student" of this process for the
// assignment: replays over the traces, then the live run. The policy
// must have been registered (from an init function) and, for the live
// run, uvm.Main called first. It fails where it cannot grade: an
// unknown assignment, no policy named "student" of the assignment's
// kind, a policy whose factory fails, no traces and no live run.
func Grade(assignment string, opts Options) (*Report, error) {
	a, err := course.Lookup(assignment)
	if err != nil {
		return nil, err
	}
	if err := checkRegistered(a, opts.File); err != nil {
		return nil, err
	}
	name, err := build(a)
	if err != nil {
		return nil, fmt.Errorf("%s: building your policy (its factory, given %q): %w", fileName(opts.File), a.StudentSpec(), err)
	}
	r := &Report{Assignment: a.Name, File: opts.File, Policy: name, Baseline: a.Baseline, References: a.References,
		Oracle: a.Oracle, Metric: a.Metric, TraceDirs: opts.Traces}
	var traces []string
	for _, dir := range opts.Traces {
		t, err := listTraces(dir)
		if err != nil {
			return nil, err
		}
		traces = append(traces, t...)
	}
	if len(traces) == 0 && opts.NoLive {
		return nil, fmt.Errorf("no traces in %s (*.uvmtrace, *.uvmtrace.gz), and no live run: nothing to grade on", strings.Join(opts.Traces, ", "))
	}
	r.Traces = scoreTraces(a, traces)
	if r.Traces == nil {
		r.Traces = []TraceScore{}
	}
	for i := range r.Traces {
		if run := &r.Traces[i].Runs[0]; run.Name == "" {
			run.Name = name // a replay that failed
		}
	}
	if !opts.NoLive {
		r.Live = runLive(a, name)
	}
	r.showPaths(opts.File)
	r.sum()
	return r, nil
}

// The graded binary's copy of the student's file, and its package, as
// stacks name them.
var (
	copiedFile    = regexp.MustCompile(`\S*/lab/course/_grade/[0-9a-f]+/student/student\.go`)
	copiedPackage = regexp.MustCompile(`github\.com/softuvm/softuvm/lab/course/_grade/[0-9a-f]+/student\.`)
)

// showPaths names the student's file in the errors as the student knows
// it, rather than as the grader's copy.
func (r *Report) showPaths(file string) {
	if file == "" {
		file = "student.go"
	}
	fix := func(s string) string {
		s = copiedFile.ReplaceAllLiteralString(s, file)
		return copiedPackage.ReplaceAllLiteralString(s, "student.")
	}
	for i := range r.Traces {
		for j := range r.Traces[i].Runs {
			r.Traces[i].Runs[j].Error = fix(r.Traces[i].Runs[j].Error)
		}
	}
	if r.Live != nil {
		r.Live.Error = fix(r.Live.Error)
	}
}

func fileName(f string) string {
	if f == "" {
		return "the student's file"
	}
	return f
}

// checkRegistered checks that a policy named "student" of the
// assignment's kind is registered, and says what else the file
// registered if not.
func checkRegistered(a course.Assignment, file string) error {
	var others []string
	for _, ref := range policy.Registered() {
		if ref.Name == course.StudentPolicy && ref.Kind == a.Kind {
			return nil
		}
		if !policy.Builtin(ref) {
			others = append(others, ref.String())
		}
	}
	sort.Strings(others)
	msg := fmt.Sprintf("%s registers no %s policy named %q: the %s assignment grades the policy that an init function of your file registers with %s(%q, ...)",
		fileName(file), a.Kind, course.StudentPolicy, a.Name, a.Register, course.StudentPolicy)
	if len(others) > 0 {
		msg += fmt.Sprintf(" (it registers %s)", strings.Join(others, ", "))
	}
	return errors.New(msg)
}

// build makes the student's policy once, as a replay does, and returns
// the name it gives itself: a factory that fails, or panics, fails here
// with a clear message rather than in every replay.
func build(a course.Assignment) (name string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	spec := a.StudentSpec()
	switch a.Kind {
	case policy.KindPrefetch:
		ps, err := policy.ParsePrefetchSpec(spec)
		if err != nil {
			return "", err
		}
		p, err := policy.NewPrefetchPolicy(ps)
		if err != nil {
			return "", err
		}
		if p == nil {
			return "", errors.New("the factory returned no policy")
		}
		return p.Name(), nil
	case policy.KindEviction:
		e, err := policy.NewEviction(spec)
		if err != nil {
			return "", err
		}
		if e == nil {
			return "", errors.New("the factory returned no policy")
		}
		return e.Name(), nil
	}
	ts, err := policy.ParseThrashingSpec(spec)
	if err != nil {
		return "", err
	}
	t, err := policy.NewThrashing(ts)
	if err != nil {
		return "", err
	}
	if t == nil {
		return "", errors.New("the factory returned no policy")
	}
	return t.Name(), nil
}
