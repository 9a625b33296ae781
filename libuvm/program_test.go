package libuvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuildProgramWithLibuvm: a program that includes <uvm.h> builds
// with the embedded sources alone (no libuvm installed) and runs
// the library's code; a program that does not compile gives the
// compiler's message.
func TestBuildProgramWithLibuvm(t *testing.T) {
	requireCC(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.c")
	require.NoError(t, os.WriteFile(src, []byte(`#include <stdio.h>
#include <uvm.h>
int main(void) { printf("%s\n", uvmGetErrorName(uvmErrorInvalidValue)); return 0; }
`), 0o644))
	bin := filepath.Join(dir, "prog")
	require.NoError(t, BuildProgramWithLibuvm(Options{CacheDir: filepath.Join(dir, "cache")}, bin, src))
	out, err := exec.Command(bin).Output()
	require.NoError(t, err)
	assert.Equal(t, "uvmErrorInvalidValue\n", string(out))

	bad := filepath.Join(dir, "bad.c")
	require.NoError(t, os.WriteFile(bad, []byte("int main(void) { return uvmNoSuchFunction(); }\n"), 0o644))
	err = BuildProgramWithLibuvm(Options{CacheDir: filepath.Join(dir, "cache")}, filepath.Join(dir, "bad"), bad)
	var be *BuildError
	require.ErrorAs(t, err, &be)
	assert.Contains(t, be.Output, "uvmNoSuchFunction")
}
