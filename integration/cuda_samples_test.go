package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cudaSample is a program of NVIDIA's CUDA samples ported to uvm.h
// (examples/cuda-samples/NAME): how it runs here and how its own result
// check says it passed.
type cudaSample struct {
	name string
	args [][]string // one run per entry (nil: no arguments)
	// pass is the line the sample's result check prints when it passes;
	// "" where its exit status alone says (the check exits 1 otherwise).
	pass string
	// fail is what the sample prints when a result is wrong, where it
	// prints something and still exits 0 (none does: a safeguard).
	fail string
}

// cudaSamples are the ported samples: each is the original's source, its
// runtime calls renamed and its launches written with uvmLaunchKernelGGL
// (the README and each file's header say what else changed).
var cudaSamples = []cudaSample{
	{name: "vectorAdd", pass: "Test PASSED"},
	{name: "asyncAPI", fail: "Error!"},
	{name: "simpleStreams"},
	{name: "simpleZeroCopy", args: [][]string{nil, {"--use_generic_memory"}}},
	{name: "simpleAtomicIntrinsics", pass: "simpleAtomicIntrinsics completed, returned OK"},
	// 64x64 matrices: the default 320x640 takes minutes on two CPUs.
	{name: "matrixMul", args: [][]string{{"-wA=64", "-hA=64", "-wB=64", "-hB=64"}}, pass: "Result = PASS"},
	{name: "simpleCallback", pass: "Success"},
	{name: "simpleOccupancy", pass: "Test PASSED"},
	{name: "simpleP2P", pass: "Test passed"},
	{name: "scalarProd", pass: "Test passed"},
	// No result check of its own: its host tasks touch memory attached
	// to the host while kernels run on other streams (SIGBUS, were the
	// attachment not in stream order), and every call is checked.
	{name: "UnifiedMemoryStreams", pass: "All Done!"},
}

// TestCUDASamples builds each ported CUDA sample with the project's C
// flags against libuvm.a and runs it under both coherence models: it
// must exit 0 and print its own pass line.
func TestCUDASamples(t *testing.T) {
	requireRoot(t)
	dir := "../examples/cuda-samples"
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var dirs []string // the samples: directories of C files (not common/, nor the Makefile's build/)
	for _, e := range entries {
		if c, _ := filepath.Glob(filepath.Join(dir, e.Name(), "*.c")); e.IsDir() && len(c) > 0 {
			dirs = append(dirs, e.Name())
		}
	}
	var names []string
	for _, s := range cudaSamples {
		names = append(names, s.name)
	}
	assert.ElementsMatch(t, dirs, names, "every sample in %s runs here, and only those", dir)

	for _, s := range cudaSamples {
		t.Run(s.name, func(t *testing.T) {
			bin := buildSample(t, filepath.Join(dir, s.name))
			runs := s.args
			if runs == nil {
				runs = [][]string{nil}
			}
			for _, model := range []string{"fault", "launch"} {
				for _, args := range runs {
					runSample(t, s, bin, model, args)
				}
			}
		})
	}
}

// buildSample compiles the C files of a sample's directory with the
// Makefile's flags and the helpers of common/, against the static
// library.
func buildSample(t *testing.T, dir string) string {
	t.Helper()
	sources, err := filepath.Glob(filepath.Join(dir, "*.c"))
	require.NoError(t, err)
	require.NotEmpty(t, sources, "no C files in %s", dir)
	out := filepath.Join(binDir, "cuda-sample-"+filepath.Base(dir))
	args := []string{"-O2", "-g", "-Wall", "-Wextra", "-std=gnu11", "-I../libuvm/include", "-I" + filepath.Join(filepath.Dir(dir), "common"), "-o", out}
	args = append(args, sources...)
	args = append(args, filepath.Join(binDir, "libuvm.a"), "-pthread", "-lm")
	b, err := exec.Command("gcc", args...).CombinedOutput()
	require.NoError(t, err, "gcc %s:\n%s", strings.Join(args, " "), b)
	// The samples' own code may warn (it is NVIDIA's, built by nvcc);
	// softuvm's headers must not.
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "warning:") && (strings.Contains(line, "uvm.h") || strings.Contains(line, "uvm_cuda.h") || strings.Contains(line, "helper_cuda.h")) {
			t.Errorf("a warning in softuvm's headers: %s", line)
		}
	}
	return out
}

// runSample runs a built sample under a coherence model in a directory
// of its own (asyncAPI and matrixMul record a trace there between
// uvmProfilerStart and Stop), and checks how it ended and what it said.
func runSample(t *testing.T, s cudaSample, bin, model string, args []string) {
	t.Helper()
	// Not a time limit on the sample (simpleStreams takes a minute on a
	// quiet machine): a hang fails here rather than at go test's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(cEnv(), "UVM_COHERENCE="+model, "UVM_ARENA_SIZE=256MiB")
	out, err := cmd.CombinedOutput()
	what := strings.TrimSpace(s.name + " " + strings.Join(args, " ") + " under the " + model + " model")
	require.NoError(t, err, "%s:\n%s", what, out)
	if s.pass != "" {
		assert.Contains(t, string(out), s.pass, "%s: its result check did not pass:\n%s", what, out)
	}
	if s.fail != "" {
		assert.NotContains(t, string(out), s.fail, "%s:\n%s", what, out)
	}
	for _, bad := range []string{"poisoned", "panic:", "fatal error:", "CUDA error at"} {
		assert.NotContains(t, string(out), bad, "%s:\n%s", what, out)
	}
}
