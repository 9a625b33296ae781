package config

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

func TestParseVMStatFixture(t *testing.T) {
	f, err := os.Open("testdata/vmstat/linux-6.18.txt")
	require.NoError(t, err)
	defer f.Close()
	m, err := parseVMStat(f)
	require.NoError(t, err)
	assert.Len(t, m, 192)
	assert.Equal(t, uint64(394847403), m["pgfault"])
	assert.Equal(t, uint64(53186), m["pgmajfault"])
	assert.Equal(t, uint64(1709874511), m["pgalloc_normal"])
}

func TestParseVMStatRefusesMalformedLines(t *testing.T) {
	f, err := os.Open("testdata/vmstat/malformed.txt")
	require.NoError(t, err)
	defer f.Close()
	_, err = parseVMStat(f)
	assert.EqualError(t, err, `vmstat line 3 "pgfault_extra": want a name and a value`)
	_, err = parseVMStat(strings.NewReader("pgfault lots\n"))
	assert.EqualError(t, err, `vmstat line 1: pgfault="lots" is not a count`)
}

func TestVMStatSinceCountsFaults(t *testing.T) {
	start := ReadVMStat()
	require.NotNil(t, start, "/proc/vmstat is readable")
	// Fresh anonymous memory: the Go heap may reuse pages already there.
	b, err := syscall.Mmap(-1, 0, 256*core.PageSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer syscall.Munmap(b)
	for i := 0; i < len(b); i += core.PageSize {
		b[i] = 1
	}
	d := VMStatSince(start)
	assert.GreaterOrEqual(t, d["pgfault"], uint64(256), "the machine counted at least these faults")
	assert.Contains(t, d, "pgalloc_normal")
}
