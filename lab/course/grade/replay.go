package grade

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"

	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/lab/course"
	"github.com/softuvm/softuvm/policy"
)

// listTraces returns the traces of dir (*.uvmtrace, *.uvmtrace.gz),
// sorted by name.
func listTraces(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("the traces: %w", err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() && (strings.HasSuffix(n, ".uvmtrace") || strings.HasSuffix(n, ".uvmtrace.gz")) {
			out = append(out, filepath.Join(dir, n))
		}
	}
	sort.Strings(out)
	return out, nil
}

// job is one replay of one trace.
type job struct {
	trace int
	run   int
	cfg   lab.Config
}

// scoreTraces replays every trace with the student's policy, the
// baseline, the references and the oracle, keeping the trace's other
// policies, several replays at once.
func scoreTraces(a course.Assignment, traces []string) []TraceScore {
	roles := []struct{ role, spec string }{{"student", a.StudentSpec()}, {"baseline", a.Baseline}}
	for _, r := range a.References {
		roles = append(roles, struct{ role, spec string }{"reference", r})
	}
	if a.Oracle != "" {
		roles = append(roles, struct{ role, spec string }{"oracle", a.Oracle})
	}
	scores := make([]TraceScore, len(traces))
	var jobs []job
	for i, t := range traces {
		scores[i] = TraceScore{Trace: filepath.Base(t), Runs: make([]Run, len(roles))}
		for j, r := range roles {
			scores[i].Runs[j] = Run{Role: r.role, Spec: r.spec}
			jobs = append(jobs, job{trace: i, run: j, cfg: configFor(a.Kind, r.spec)})
		}
	}
	// The largest traces first, so that the last replays to finish are
	// short ones.
	sizes := make([]int64, len(traces))
	for i, t := range traces {
		if st, err := os.Stat(t); err == nil {
			sizes[i] = st.Size()
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return sizes[jobs[i].trace] > sizes[jobs[j].trace] })

	work := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range max(1, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				res, err := replayOne(traces[j.trace], j.cfg)
				mu.Lock()
				s := &scores[j.trace]
				run := &s.Runs[j.run]
				if err != nil {
					run.Error = err.Error()
				} else {
					fill(run, res, a.Kind)
					s.Events = res.Events
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	for i := range scores {
		judge(&scores[i])
	}
	return scores
}

// configFor is the replay's configuration of one policy of kind: that
// policy, the trace's for the other kinds.
func configFor(kind, spec string) lab.Config {
	switch kind {
	case policy.KindPrefetch:
		return lab.Config{Prefetch: spec}
	case policy.KindEviction:
		return lab.Config{Eviction: spec}
	}
	return lab.Config{Thrashing: spec}
}

// panicError is a panic of a policy during a replay.
type panicError struct {
	value any
	stack string
}

func (p *panicError) Error() string {
	return fmt.Sprintf("panic: %v\n%s", p.value, p.stack)
}

// replayOne replays one trace, turning a panic of the policy into an
// error that says where.
func replayOne(path string, cfg lab.Config) (res *lab.Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: policyFrames(debug.Stack())}
		}
	}()
	return lab.ReplayFile(path, cfg)
}

// policyFrames keeps the frames of a panic's stack that are not the
// runtime's, the lab's or this package's: the policy's own, where a
// student looks first. It keeps the whole stack if that leaves nothing.
func policyFrames(stack []byte) string {
	lines := strings.Split(strings.TrimSpace(string(stack)), "\n")
	var out []string
	for i := 1; i+1 < len(lines); i += 2 {
		fn := lines[i]
		if strings.HasPrefix(fn, "runtime") || strings.HasPrefix(fn, "panic(") || strings.Contains(fn, "softuvm/lab.") ||
			strings.Contains(fn, "softuvm/lab/course/grade.") || strings.HasPrefix(fn, "runtime/debug") {
			continue
		}
		out = append(out, fn, lines[i+1])
	}
	if len(out) == 0 {
		return string(stack)
	}
	return strings.Join(out, "\n")
}

// fill copies what a replay counted into a run of a policy of kind.
func fill(run *Run, r *lab.Result, kind string) {
	run.Faults = r.Replayed.Faults
	run.BytesMoved = r.Replayed.BytesMoved()
	run.EvictedPages = r.Replayed.EvictedPages
	run.Prefetched = r.Prefetched
	run.Throttles = r.Throttles
	run.Pins = r.Pins
	run.NapTime = r.NapTime
	run.Refused = r.Refused
	run.BadVictims = r.BadVictims
	run.EstimatedTime = r.EstimatedTime
	run.Wall = r.Wall
	switch kind {
	case policy.KindPrefetch:
		run.Name = r.Prefetch
	case policy.KindEviction:
		run.Name = r.Eviction
	default:
		run.Name = r.Thrashing
	}
}

// judge compares the student's run with the baseline and the oracle.
func judge(t *TraceScore) {
	student, base, orc := t.find("student"), t.find("baseline"), t.find("oracle")
	if base == nil {
		// A trace the baseline cannot replay is the trace's fault, not
		// the student's; it is reported, and counted as failed.
		t.Error = t.Runs[1].Error
		t.Outcome = Failed
		return
	}
	if student == nil {
		t.Outcome = Failed
		return
	}
	if student.BadVictims > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("your policy named %d victims that are not blocks of the replay, or hold no page where asked", student.BadVictims))
	}
	if student.Refused > base.Refused {
		t.Notes = append(t.Notes, fmt.Sprintf("%d faults found a full device with your policy (the server fails them: SIGBUS)", student.Refused))
	}
	s, b := float64(student.EstimatedTime), float64(base.EstimatedTime)
	t.Outcome = outcome(s, b)
	if b > 0 {
		t.VsBaseline = s / b
	}
	if orc != nil && orc.EstimatedTime > 0 {
		t.VsOracle = s / float64(orc.EstimatedTime)
		if o := float64(orc.EstimatedTime); o < b {
			g := (b - s) / (b - o)
			t.GapClosed = &g
		}
	}
}
