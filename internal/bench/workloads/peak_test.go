package workloads

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// peakWrapperT builds the wrapper, or skips where there is no C compiler.
func peakWrapperT(t *testing.T) string {
	t.Helper()
	for _, cc := range []string{"cc", "gcc"} {
		if _, err := exec.LookPath(cc); err == nil {
			w, err := BuildPeakWrapper(t.TempDir())
			require.NoError(t, err)
			return w
		}
	}
	t.Skip("no C compiler to build the peak wrapper")
	return ""
}

// command is a workload that runs argv as it is.
func command(argv ...string) *Workload {
	return &Workload{Program: Program{Name: filepath.Base(argv[0])}, Argv: argv}
}

// TestPeakWrapperMeasuresTheProgramAlone: after this process has touched
// 96 MiB, `true` through the wrapper peaks at a few MiB, where its
// rusage from here says 96 MiB or more (the address space vfork shared
// with it); dd with a 48 MiB block peaks at 48 MiB or more either way.
func TestPeakWrapperMeasuresTheProgramAlone(t *testing.T) {
	wrapper := peakWrapperT(t)
	ballast := make([]byte, 96<<20)
	for i := range ballast {
		ballast[i] = byte(i)
	}
	ctx := context.Background()

	tr := command("true")
	without, err := tr.RunPlain(ctx, t.TempDir())
	require.NoError(t, err)
	require.GreaterOrEqual(t, without.MaxRSS, int64(96<<20), "rusage from here should carry this process's peak: the wrapper would be needless")
	tr.PeakWrapper = wrapper
	with, err := tr.RunPlain(ctx, t.TempDir())
	require.NoError(t, err)
	assert.Positive(t, with.MaxRSS)
	assert.Less(t, with.MaxRSS, int64(8<<20), "true's own peak through the wrapper")

	dd := command("dd", "if=/dev/zero", "of=/dev/null", "bs=48M", "count=2", "status=none")
	dd.PeakWrapper = wrapper
	r, err := dd.RunPlain(ctx, t.TempDir())
	require.NoError(t, err)
	assert.Equal(t, 0, r.ExitStatus)
	assert.GreaterOrEqual(t, r.MaxRSS, int64(48<<20), "dd reads into a 48 MiB buffer")
	assert.Less(t, r.MaxRSS, int64(64<<20))
	ballast[len(ballast)-1]++ // kept alive until here
}

// TestPeakWrapperEndsAsTheProgramDid: exit statuses and signal deaths
// come through the wrapper unchanged, a program that cannot be run is
// 127, and a cancelled run's SIGTERM reaches the program.
func TestPeakWrapperEndsAsTheProgramDid(t *testing.T) {
	wrapper := peakWrapperT(t)
	ctx := context.Background()
	run := func(argv ...string) *Run {
		w := command(argv...)
		w.PeakWrapper = wrapper
		r, err := w.RunPlain(ctx, t.TempDir())
		require.NoError(t, err)
		return r
	}
	r := run("sh", "-c", "exit 3")
	assert.Equal(t, 3, r.ExitStatus)
	assert.Empty(t, r.Signal)

	r = run("sh", "-c", "kill -KILL $$")
	assert.Equal(t, 128+9, r.ExitStatus)
	assert.Equal(t, "SIGKILL", r.Signal)

	w := command("/nonexistent/program")
	w.PeakWrapper = wrapper
	r, err := w.RunPlain(ctx, t.TempDir())
	require.NoError(t, err, "the wrapper ran; the program could not")
	assert.Equal(t, 127, r.ExitStatus)
	assert.Contains(t, r.Stderr, "cannot run /nonexistent/program")

	// The shell traps SIGTERM and says so: it got the signal the
	// cancelled run sent the wrapper.
	w = command("sh", "-c", `trap 'echo got TERM >&2; exit 7' TERM; echo ready; while :; do sleep 0.01; done`)
	w.PeakWrapper = wrapper
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, err = w.RunPlain(cctx, t.TempDir())
	require.Error(t, err, "a cancelled run is an error")
	require.NotNil(t, r)
	assert.Less(t, time.Since(start), 4*time.Second, "the program ended on the SIGTERM passed on, not on the SIGKILL 5 s later")
	assert.Equal(t, 7, r.ExitStatus)
	assert.Contains(t, r.Stderr, "got TERM")
}
