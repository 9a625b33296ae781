package memsys

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/fdleak"
)

func TestMain(m *testing.M) { os.Exit(fdleak.Run(m.Run)) }

func anonPage(t *testing.T) uintptr {
	t.Helper()
	addr, err := Mmap(0, 4096, ProtRead|ProtWrite, MapPrivate|MapAnonymous, -1, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, Munmap(addr, 4096)) })
	return addr
}

func TestBytes(t *testing.T) {
	assert.Nil(t, Bytes(0, 10))
	assert.Nil(t, Bytes(4096, 0))
	addr := anonPage(t)
	b := Bytes(addr, 4096)
	require.Len(t, b, 4096)
	b[4095] = 7
	assert.Equal(t, byte(7), Bytes(addr+4095, 1)[0])
}

// An anonymous page has the default policy; nodes is empty.
func TestPolicyOfAddressDefault(t *testing.T) {
	mode, nodes, err := PolicyOfAddress(anonPage(t))
	require.NoError(t, err)
	assert.Equal(t, MpolDefault, mode)
	assert.Empty(t, nodes)
}

func TestMbindErrors(t *testing.T) {
	addr := anonPage(t)
	assert.ErrorIs(t, Mbind(addr, 4096, MpolBind, []int{MaxNodes}, 0), syscall.EINVAL, "node beyond any kernel")
	assert.ErrorIs(t, Mbind(addr, 4096, MpolBind, []int{-1}, 0), syscall.EINVAL)
	_, err := NodeOfAddress(0)
	assert.ErrorIs(t, err, syscall.EFAULT)
}

func TestGetcpuAndAffinity(t *testing.T) {
	cpu, node, err := Getcpu()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, cpu, 0)
	assert.GreaterOrEqual(t, node, 0)
	cpus, err := SchedGetaffinity()
	require.NoError(t, err)
	assert.NotEmpty(t, cpus)
}

func TestFstatTypes(t *testing.T) {
	fd, err := MemfdCreate("memsys-test")
	require.NoError(t, err)
	defer Close(fd)
	require.NoError(t, Ftruncate(fd, 1<<20))
	st, err := Fstat(fd)
	require.NoError(t, err)
	assert.True(t, st.IsRegular())
	assert.Equal(t, "regular file", st.FileType())
	assert.Equal(t, int64(1<<20), st.Size)

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	st, err = Fstat(int(r.Fd()))
	require.NoError(t, err)
	assert.False(t, st.IsRegular())
	assert.Equal(t, "pipe", st.FileType())

	_, err = Fstat(-1)
	assert.True(t, errors.Is(err, syscall.EBADF))
}

func TestSeekDataHole(t *testing.T) {
	fd, err := MemfdCreate("memsys-seek")
	require.NoError(t, err)
	defer Close(fd)
	require.NoError(t, Ftruncate(fd, 1<<20))
	_, err = SeekData(fd, 0)
	assert.ErrorIs(t, err, syscall.ENXIO, "all hole")
	_, err = Pwrite(fd, []byte{1}, 8192)
	require.NoError(t, err)
	off, err := SeekData(fd, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(8192), off)
	off, err = SeekHole(fd, off)
	require.NoError(t, err)
	assert.Equal(t, int64(12288), off)
	require.NoError(t, PunchHole(fd, 8192, 4096))
	_, err = SeekData(fd, 0)
	assert.ErrorIs(t, err, syscall.ENXIO)
}
