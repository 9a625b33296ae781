package uvm

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCopyCalibration(t *testing.T) {
	c := copyCalibration()
	require.Empty(t, c.Err)
	assert.Positive(t, c.HostCopyGBps)
	assert.GreaterOrEqual(t, c.MemoryGBps, c.HostCopyGBps, "every CPU together moves at least what one does")
	assert.Positive(t, c.InstallGBps)
	assert.GreaterOrEqual(t, c.MigrationProducers, 1)
	assert.LessOrEqual(t, c.MigrationProducers, c.CPUs)
	assert.GreaterOrEqual(t, c.CopyProducers, 1)
	assert.LessOrEqual(t, c.CopyProducers, c.CPUs)
	b, _ := json.Marshal(c)
	t.Logf("%s", b)
}
