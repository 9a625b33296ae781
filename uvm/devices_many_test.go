package uvm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
)

// TestEveryDeviceOfMany: a device process receives one file per processor
// in its hello reply, so a session with many devices passes many
// descriptors in one message (readers once had room for four, and a fifth
// device never came up). Each of six devices runs a kernel over its own
// part of one allocation, then adds one to the part of the next device
// (faulting it over from there), and the host reads every byte back.
func TestEveryDeviceOfMany(t *testing.T) {
	const devices, part = 6, BlockSize // a block each: prefetch stays within a part
	cfg := DefaultServerConfig()
	cfg.Devices = config.DeviceSpecs(devices, []int64{8 << 20}, cfg.Devices[0].Backend)
	cfg.DeviceWorkers = 1
	s := newSession(t, cfg)
	require.Equal(t, devices, s.DeviceCount())
	a, err := s.MallocManaged(devices * part)
	require.NoError(t, err)
	for d := Device(0); d < devices; d++ {
		require.NoError(t, s.Launch(d, nil, "fill", 2, rangeParams(a.Addr()+uintptr(d)*part, part, byte(d)*16)))
	}
	for d := Device(0); d < devices; d++ {
		require.NoError(t, s.DeviceSynchronize(d), "device %d", d)
	}
	for d := Device(0); d < devices; d++ {
		next := (d + 1) % devices
		require.NoError(t, s.Launch(d, nil, "addOne", 2, rangeParams(a.Addr()+uintptr(next)*part, part, 0)))
		require.NoError(t, s.DeviceSynchronize(d), "device %d", d)
	}
	b := a.Bytes()
	for d := 0; d < devices; d++ {
		want := wantFill(part, byte(d)*16+1)
		if got := b[d*part : (d+1)*part]; string(got) != string(want) {
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("device %d's part, byte %#x: %#x, want %#x", d, i, got[i], want[i])
				}
			}
		}
	}
	st, err := a.Stats()
	require.NoError(t, err)
	for d := Device(0); d < devices; d++ {
		assert.Positive(t, st.FaultsBy(d).Total(), "device %d faulted", d)
		assert.Equal(t, uint64(part/PageSize), st.MigratedPages((d+1)%devices, d), "device %d pulled the next device's part over", d)
	}
}
