package engine

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

func TestCopyCalibration(t *testing.T) {
	c := calibrate()
	require.Empty(t, c.Err)
	assert.Positive(t, c.HostCopyGBps)
	assert.GreaterOrEqual(t, c.MemoryGBps, c.HostCopyGBps, "every CPU together moves at least what one does")
	assert.Positive(t, c.InstallGBps)
	assert.GreaterOrEqual(t, c.MigrationProducers, 1)
	assert.LessOrEqual(t, c.MigrationProducers, c.CPUs)
	assert.GreaterOrEqual(t, c.CopyProducers, 1)
	assert.LessOrEqual(t, c.CopyProducers, c.CPUs)
	assert.Len(t, c.CopyThreadsGBps, len(threadCounts(c.CPUs)))
	assert.Positive(t, c.BlockMovers)
	b, _ := json.Marshal(c)
	t.Logf("%s", b)
}

func TestCopyCalibrationIsKeptForLaterServers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "copy-calibration.json")
	c := config.CopyCalibration{CPUs: 2, HostCopyGBps: 13, CopyProducers: 2, MigrationProducers: 1, BlockMovers: 2}
	storeCalibration(path, c)
	got, ok := loadCalibration(path)
	require.True(t, ok)
	assert.Equal(t, path, got.Kept)
	got.Kept = ""
	assert.Equal(t, c, got)

	// Another boot, machine or version of the calibration is measured
	// again; so is a damaged file.
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, bytes.Replace(b, []byte("boot="), []byte("boot=x"), 1), 0o600))
	_, ok = loadCalibration(path)
	assert.False(t, ok, "a calibration of another boot")
	require.NoError(t, os.WriteFile(path, b[:len(b)/2], 0o600))
	_, ok = loadCalibration(path)
	assert.False(t, ok, "half a file")
	_, ok = loadCalibration(filepath.Join(t.TempDir(), "none"))
	assert.False(t, ok)
}
