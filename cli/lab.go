package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/softuvm/softuvm/lab/course"
)

const labUsage = `Usage: uvm lab grade|score|bound [flags]

  grade ASSIGNMENT FILE.go [--traces DIR] [--src DIR] [--no-live] [--json]
                 grade a course assignment (lab/course): build FILE.go, which
                 registers a policy named "student", into a binary of its
                 own with the softuvm source, replay it on the shipped
                 traces against the assignment's baseline and oracle, run
                 it live on a small program, and print the scores.
                 Assignments: %s
  score [flags] TRACE...
                 replay every registered policy of each kind on each trace,
                 scored against the oracles (uvm lab score -h)
  bound [flags] -- PROGRAM [ARGS...]
                 run a program under valgrind and count the faults its
                 heap would take at each budget with LRU and with Belady's
                 MIN, on every reference it made (uvm lab bound -h)

The course kit's guide is lab/course/README.md.`

func runLab(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(os.Stderr, labUsage+"\n", strings.Join(course.Names(), ", "))
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return nil
		}
		return errUsage
	}
	switch args[0] {
	case "grade":
		return runLabGrade(args[1:])
	case "score":
		return runLabScore(args[1:])
	case "bound":
		return runLabBound(args[1:])
	}
	fmt.Fprintf(os.Stderr, "uvm lab: unknown subcommand %q: want grade, score or bound\n", args[0])
	return errUsage
}

func runLabGrade(args []string) error {
	fs := newFlagSet("lab grade", "ASSIGNMENT FILE.go [--traces DIR] [--src DIR] [--no-live] [--json]",
		fmt.Sprintf("Grade a course assignment (lab/course/README.md): build FILE.go, whose init function registers a policy named \"student\", into a binary of its own with the softuvm source (the go command must be in PATH); replay it on the shipped traces with the assignment's baseline, reference policies and oracle; run it live on a small program against the baseline; and print a table per trace, the live run, and a score. It exits 0 when the file was graded, whatever the verdict. Assignments: %s", strings.Join(course.Names(), ", ")))
	traces := fs.String("traces", "", "the directory of traces to replay, instead of the kit's (the source's lab/traces, and the assignment's own traces/)")
	src := fs.String("src", "", "the softuvm source to build with (default: the clone that holds the current directory)")
	noLive := fs.Bool("no-live", false, "skip the live run (it needs userfaultfd: root on many machines)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fmt.Fprintf(fs.Output(), "uvm lab grade: want ASSIGNMENT and FILE.go, got %d arguments\n", len(pos))
		fs.Usage()
		return errUsage
	}
	if _, err := course.Lookup(pos[0]); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return course.Grade(ctx, course.Options{Assignment: pos[0], File: pos[1], Src: *src, Traces: *traces, NoLive: *noLive, JSON: *asJSON})
}

// parseInterspersed parses flags wherever they are among the arguments
// ("grade eviction mine.go --no-live"), and returns the others.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		var err error
		if args, err = parseArgs(fs, args); err != nil {
			return nil, err
		}
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
