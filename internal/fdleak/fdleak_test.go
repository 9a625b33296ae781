package fdleak

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Run(m.Run)) }

func TestSnapshotSeesNewDescriptor(t *testing.T) {
	before, err := Snapshot()
	require.NoError(t, err)
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	after, err := Snapshot()
	require.NoError(t, err)
	require.NoError(t, f.Close())

	leaked := Leaked(before, after)
	assert.Contains(t, leaked, "/proc/")
	assert.Contains(t, leaked, "status")
}

func TestLeakedEmptyWhenSame(t *testing.T) {
	fds := map[int]string{0: "/dev/null", 3: "anon_inode:[eventpoll]"}
	assert.Empty(t, Leaked(fds, fds))
	assert.Equal(t, "fd 7 -> /memfd:x (deleted)\n", Leaked(fds, map[int]string{0: "/dev/null", 7: "/memfd:x (deleted)"}))
}
