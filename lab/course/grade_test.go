package course_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/lab/course"
	"github.com/softuvm/softuvm/lab/course/grade"
)

// These tests run the grader the way `uvm lab grade` does: copy the file
// into the module, build it with the go command, run the binary, parse
// its report (--json). The traces are the kit's (lab/traces and each
// assignment's traces/), or those of the directory UVM_COURSE_TRACES
// names. The live runs need userfaultfd (root here); without it the
// grader skips them and says so.

// gradeFile grades file for assignment on the traces of dir ("" the
// kit's) and returns the report.
func gradeFile(t *testing.T, assignment, file, dir string, noLive bool) *grade.Report {
	t.Helper()
	var out, errs bytes.Buffer
	start := time.Now()
	err := course.Grade(context.Background(), course.Options{
		Assignment: assignment, File: file, Traces: dir,
		NoLive: noLive, JSON: true, Stdout: &out, Stderr: &errs,
	})
	require.NoError(t, err, "stderr:\n%s", errs.String())
	var r grade.Report
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), "the report:\n%s", out.String())
	t.Logf("graded %s in %v: %s", file, time.Since(start).Round(time.Millisecond), r.Verdict.Line)
	for _, tr := range r.Traces {
		t.Logf("  %-28s %-6s vs %s %.3f%s", tr.Trace, tr.Outcome, r.Baseline, tr.VsBaseline, gap(tr))
	}
	if r.Live != nil && r.Live.Skipped == "" && r.Live.Error == "" {
		t.Logf("  live: %s %s, %.3f of its modeled time", r.Live.Outcome, r.Baseline, r.Live.Ratio)
	}
	return &r
}

func gap(tr grade.TraceScore) string {
	if tr.GapClosed == nil {
		return ""
	}
	return fmt.Sprintf(", %.0f%% of the way to the oracle", 100**tr.GapClosed)
}

// sharing are the traces where the host and a device share pages.
var sharing = map[string]bool{"pingpong.uvmtrace.gz": true, "turns.uvmtrace.gz": true}

// liveRan reports whether the report has a live run that completed.
func liveRan(t *testing.T, r *grade.Report) bool {
	t.Helper()
	require.NotNil(t, r.Live)
	require.Empty(t, r.Live.Error, "the live run failed")
	if r.Live.Skipped != "" {
		t.Logf("live run skipped: %s", r.Live.Skipped)
		return false
	}
	for _, run := range r.Live.Runs {
		assert.True(t, run.Checked, "the live program's data read back right with %s", run.Policy)
	}
	return true
}

// knownLosses are the shipped traces where a sample solution loses to
// its baseline, and why (lab/course/README.md says so too). The test
// holds the sample to losing there by no more than the bound, and
// nowhere else.
var knownLosses = map[string]map[string]float64{
	// Region LRU against lru on random single-page access: the server
	// records evictions of whole 2 MiB blocks at about a fifth of the
	// price per page of 64 KiB runs, and the trace prices the replay
	// by them (1.24 of lru's time on the traces of 2026-11-26; 1.02
	// since the lab runs the server's block engine, 2026-12-07).
	"eviction": {"pointer_chase.uvmtrace.gz": 1.3},
	// The stride detector on a pointer chase, where no prefetch helps
	// (the oracle does no better than none): now and then a chance
	// fault confirms a stride, and the 89 pages it brings push out
	// pages the chase needed (1.02 of none's time, 2026-12-07). Asking
	// for two confirmations ties here but gives up the win on pingpong.
	"prefetch": {"pointer_chase.uvmtrace.gz": 1.05},
}

// TestSampleSolutionsBeatTheirBaselines: each assignment's sample
// solution builds, is graded, and beats the baseline it is meant to
// beat: the prefetcher and the eviction policy on every trace where the
// oracle does better than the baseline (but knownLosses), and live;
// the thrashing policy on the traces where pages bounce between
// processors (the shipped pingpong, the assignment's own turns; on the
// others it can only tie) and live, losing nowhere.
func TestSampleSolutionsBeatTheirBaselines(t *testing.T) {
	for _, a := range course.Assignments() {
		t.Run(a.Name, func(t *testing.T) {
			r := gradeFile(t, a.Name, filepath.Join(a.Name, "testdata", "solution.go.txt"), os.Getenv("UVM_COURSE_TRACES"), false)
			assert.Equal(t, a.Baseline, r.Baseline)
			live := liveRan(t, r)
			if len(r.Traces) == 0 && !live {
				t.Skip("no traces and no live run: nothing to check")
			}
			for _, tr := range r.Traces {
				require.Empty(t, tr.Error, tr.Trace)
				switch a.Name {
				case "thrashing":
					assert.Contains(t, []string{grade.Beats, grade.Ties}, tr.Outcome, "%s: the thrashing solution loses nowhere", tr.Trace)
					if sharing[tr.Trace] {
						assert.Equal(t, grade.Beats, tr.Outcome, "%s: pages bounce here: it must win", tr.Trace)
					}
				default:
					if bound, ok := knownLosses[a.Name][tr.Trace]; ok {
						assert.Equal(t, grade.Loses, tr.Outcome, "%s: a known loss that is one no more: take it out of knownLosses", tr.Trace)
						assert.LessOrEqual(t, tr.VsBaseline, bound, "%s: the known loss grew", tr.Trace)
						continue
					}
					// Everywhere the oracle does better than the
					// baseline; where it does not, nothing can.
					assert.Contains(t, []string{grade.Beats, grade.Ties}, tr.Outcome, "%s: %.3f of %s's estimated time", tr.Trace, tr.VsBaseline, a.Baseline)
					if tr.GapClosed != nil {
						assert.Equal(t, grade.Beats, tr.Outcome, "%s: %.3f of %s's estimated time", tr.Trace, tr.VsBaseline, a.Baseline)
					}
				}
			}
			if live {
				assert.Equal(t, grade.Beats, r.Live.Outcome, "live: %.3f of %s's modeled time", r.Live.Ratio, a.Baseline)
			}
			assert.Equal(t, len(knownLosses[a.Name]), r.Verdict.Loses, r.Verdict.Line)
			assert.Zero(t, r.Verdict.Failed)
			assert.Equal(t, len(knownLosses[a.Name]) == 0, r.Verdict.Pass, r.Verdict.Line)
		})
	}
}

// TestSkeletonsBuildAndTieTheBaseline: each skeleton builds as it is,
// registers "student", and behaves as its baseline: it ties it on every
// trace, and is not a pass. (Replays only; where no traces are shipped
// yet, on the thrashing assignment's own.)
func TestSkeletonsBuildAndTieTheBaseline(t *testing.T) {
	dir := os.Getenv("UVM_COURSE_TRACES")
	if dir == "" {
		dir = filepath.Join("..", "traces")
		if m, _ := filepath.Glob(filepath.Join(dir, "*.uvmtrace*")); len(m) == 0 {
			dir = filepath.Join("thrashing", "traces")
		}
	}
	for _, a := range course.Assignments() {
		t.Run(a.Name, func(t *testing.T) {
			r := gradeFile(t, a.Name, filepath.Join(a.Name, "skeleton.go.txt"), dir, true)
			require.NotEmpty(t, r.Traces)
			for _, tr := range r.Traces {
				assert.Equal(t, grade.Ties, tr.Outcome, "%s: %.4f of %s's estimated time", tr.Trace, tr.VsBaseline, a.Baseline)
			}
			assert.False(t, r.Verdict.Pass, r.Verdict.Line)
		})
	}
}

func TestGraderErrors(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	run := func(assignment, file, src string) (string, error) {
		var out, errs bytes.Buffer
		err := course.Grade(ctx, course.Options{Assignment: assignment, File: file, Src: src, Traces: dir, NoLive: true, Stdout: &out, Stderr: &errs})
		return errs.String(), err
	}

	_, err := run("paging", "x.go", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown assignment "paging": want one of prefetch, eviction, thrashing`)

	_, err = run("prefetch", filepath.Join(dir, "missing.go"), "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.go: no such file")

	_, err = run("prefetch", filepath.Join("prefetch", "skeleton.go.txt"), dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no go.mod there: want the root of a clone of github.com/softuvm/softuvm")

	_, err = course.FindSource("/")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "run it inside a clone of github.com/softuvm/softuvm")
	assert.Contains(t, err.Error(), "or pass --src DIR")

	// A file that does not compile: the compiler's errors, naming the
	// file as the student gave it.
	broken := filepath.Join(dir, "broken.go")
	require.NoError(t, os.WriteFile(broken, []byte("package mine\n\nfunc init() { undefinedThing() }\n"), 0o644))
	stderr, err := run("prefetch", broken, "")
	require.Error(t, err)
	assert.ErrorIs(t, err, course.ErrNotGraded)
	assert.Contains(t, err.Error(), "broken.go does not build")
	assert.Contains(t, stderr, broken+":3:15: undefined: undefinedThing")
	assert.NotContains(t, stderr, "_grade", "the temporary package is not shown")

	// A file that registers its policy under another kind: the eviction
	// sample graded as a prefetcher.
	stderr, err = run("prefetch", filepath.Join("eviction", "testdata", "solution.go.txt"), "")
	require.Error(t, err)
	assert.ErrorIs(t, err, course.ErrNotGraded)
	assert.Contains(t, stderr, `registers no prefetch policy named "student"`)
	assert.Contains(t, stderr, `policy.RegisterPrefetchPolicy("student", ...)`)
	assert.Contains(t, stderr, `(it registers eviction policy "student")`)

	// Nothing of the gradings is left in the module.
	root, err := course.FindSource(".")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "lab", "course", "_grade"))
	assert.True(t, os.IsNotExist(err), "lab/course/_grade is removed: %v", err)
}
