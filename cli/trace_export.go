package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/softuvm/softuvm/trace"
	"github.com/softuvm/softuvm/trace/export"
	"github.com/softuvm/softuvm/uvm"
)

// traceExportFormats maps each --format to the extension its default
// output gets.
var traceExportFormats = map[string]string{"perfetto": ".json", "csv": ".csv"}

func runTraceExport(args []string) error { return traceExport(args, os.Stdout, os.Stderr) }

func traceExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("trace export", "[--format perfetto|csv] [--out FILE] TRACE",
		"Export a trace: as Chrome trace-event JSON (perfetto), a timeline that ui.perfetto.dev (\"Open trace file\") and chrome://tracing open, "+
			"with rows per processor for its faults, the migrations into it, evictions, launches and synchronizations, a row per allocation, "+
			"and arrows from faults to the migrations they caused; or as CSV, a row per event")
	fs.SetOutput(stderr)
	format := fs.String("format", "perfetto", "perfetto (Chrome trace-event JSON) or csv")
	out := fs.String("out", "", "the file to write, - for standard output (default: TRACE with its extension replaced by .json or .csv)")
	flags, operands := traceExportOperands(fs, args)
	if err := parseFlags(fs, flags); err != nil {
		return err
	}
	ext, ok := traceExportFormats[*format]
	if !ok {
		return fmt.Errorf("export: --format %q: want perfetto or csv", *format)
	}
	if len(operands) != 1 {
		if len(operands) == 0 {
			fmt.Fprintf(stderr, "uvm trace export: missing the TRACE argument: want the trace file to export (what uvm trace record, uvm run --trace or UVM_TRACE wrote)\n")
		} else {
			fmt.Fprintf(stderr, "uvm trace export: %d TRACE arguments %q: want one\n", len(operands), operands)
		}
		fs.Usage()
		return fmt.Errorf("want one TRACE argument, got %d: %w", len(operands), errUsage)
	}
	src := operands[0]
	dst := *out
	if dst == "" {
		dst = strings.TrimSuffix(src, filepath.Ext(src)) + ext
	}
	if dst != "-" && sameFile(src, dst) {
		return fmt.Errorf("export: the output %s is the trace itself: name another with --out", dst)
	}

	r, err := trace.Open(src)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("export: cannot read TRACE %s: %w", src, pe.Err)
		}
		return fmt.Errorf("export: %w", err) // names the file
	}
	defer r.Close()
	var file *os.File
	counted := &countingWriter{}
	if dst == "-" {
		counted.w = stdout
	} else {
		if file, err = os.Create(dst); err != nil {
			return fmt.Errorf("export: the output: %w", err)
		}
		counted.w = file
	}
	var n int
	switch *format {
	case "perfetto":
		n, err = export.PerfettoFrom(counted, r)
	case "csv":
		n, err = export.CSVFrom(counted, r)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		// A trace whose writer was killed: what it holds is still worth
		// a look, and the export closed its JSON.
		fmt.Fprintf(stderr, "uvm trace export: warning: %v; exported the %d whole events before it\n", err, n)
		err = nil
	}
	if file != nil {
		if cerr := file.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("export: the output: %w", cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}
	if err != nil {
		return err
	}
	name := dst
	if dst == "-" {
		name = "standard output"
	}
	note := ""
	if d := r.Dropped(); d > 0 {
		note = fmt.Sprintf("; the recorder dropped %d more", d)
	}
	if *format == "perfetto" {
		note += "; open it at https://ui.perfetto.dev or chrome://tracing"
	}
	fmt.Fprintf(stderr, "uvm trace export: %d events to %s (%s, %s)%s\n", n, name, *format, uvm.FormatSize(counted.n), note)
	return nil
}

// traceExportOperands separates the flags from the operands, so that
// TRACE may come before the flags as well as after (package flag stops
// at the first operand, and parseFlags refuses any).
func traceExportOperands(fs *flag.FlagSet, args []string) (flags, operands []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(operands, args[i+1:]...)
		case len(a) > 1 && a[0] == '-':
			flags = append(flags, a)
			name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		default:
			operands = append(operands, a)
		}
	}
	return flags, operands
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// sameFile says whether paths a and b name one file, so that an export
// never truncates the trace it reads.
func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
