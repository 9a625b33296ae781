package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCoherenceTouchDuringKernel: a C program that touches managed memory
// while a kernel that may use it runs dies of SIGBUS under the launch
// coherence model, and the message names the allocation and the kernel;
// the same program runs to the end under the fault model, where the
// device attribute says the CPU may touch managed memory concurrently.
func TestCoherenceTouchDuringKernel(t *testing.T) {
	requireRoot(t)
	bin := buildC(t, "coherence-touch", "testdata/coherence/touch.c")
	for _, model := range []string{"launch", "fault"} {
		t.Run(model, func(t *testing.T) {
			// A file, not a pipe: the private server and its guard outlive
			// a program that dies, and would hold a pipe open.
			errPath := filepath.Join(t.TempDir(), "stderr")
			f, err := os.Create(errPath)
			require.NoError(t, err)
			cmd := exec.Command(bin)
			cmd.Env = cEnv("UVM_COHERENCE=" + model)
			cmd.Stderr = f
			require.NoError(t, cmd.Start())
			// A touch that is neither refused nor served would fault
			// for ever: end it rather than the test.
			stop := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
			err = cmd.Wait()
			stop.Stop()
			f.Close()
			b, rerr := os.ReadFile(errPath)
			require.NoError(t, rerr)
			out := string(b)
			if model == "fault" {
				require.NoError(t, err, "%s", out)
				assert.Contains(t, out, "concurrent managed access 1")
				assert.Contains(t, out, "touched, value 2")
				return
			}
			require.Error(t, err, "%s", out)
			ee, ok := err.(*exec.ExitError)
			require.True(t, ok, "%v", err)
			ws := ee.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled(), "killed by a signal, not %v:\n%s", err, out)
			assert.Equal(t, syscall.SIGBUS, ws.Signal(), "%s", out)
			assert.Contains(t, out, "concurrent managed access 0")
			assert.Contains(t, out, "touching")
			assert.NotContains(t, out, "touched, value")
			assert.Contains(t, out, "the CPU touched", "%s", out)
			assert.Contains(t, out, "while kernel \"c:0x", "the message names the kernel: %s", out)
			assert.Contains(t, out, "managed allocation 0x", "the message names the allocation: %s", out)
		})
	}
}
