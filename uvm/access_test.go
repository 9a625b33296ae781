package uvm

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAccessCountsBesideServedAndMinflt: a client's faults are shown
// three ways, and the eBPF count agrees with the kernel's minflt within
// 1% over more than 10,000 faults (every fault here is a user fault).
func TestAccessCountsBesideServedAndMinflt(t *testing.T) {
	s := newSession(t, testServerConfig())
	in, err := s.Info()
	require.NoError(t, err)
	if !strings.HasPrefix(in.AccessCounting, "ebpf") {
		t.Skipf("no eBPF access counters here: %s", in.AccessCounting)
	}
	const pages = 12000
	a, err := s.MallocManaged(pages*PageSize, WithPrefetch(PrefetchSpec{Policy: "none"}))
	require.NoError(t, err)
	mine := func() SessionInfo {
		in, err := s.Info()
		require.NoError(t, err)
		for _, si := range in.Sessions {
			if si.PID == os.Getpid() {
				return si
			}
		}
		t.Fatalf("no session of pid %d in %+v", os.Getpid(), in.Sessions)
		return SessionInfo{}
	}
	before := mine()
	require.NotNil(t, before.EBPFFaults)
	require.NotNil(t, before.MinorFaults)
	b := a.Bytes()
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	// A handler counts a fault after waking its thread: the last count
	// may land a moment after the touch.
	var after SessionInfo
	eventually(t, 2*time.Second, func() bool { after = mine(); return after.ServedFaults-before.ServedFaults >= pages }, "served fewer faults than pages")
	served := after.ServedFaults - before.ServedFaults
	counted := *after.EBPFFaults - *before.EBPFFaults
	minflt := *after.MinorFaults - *before.MinorFaults
	t.Logf("served %d, eBPF %d, minflt %d", served, counted, minflt)
	assert.GreaterOrEqual(t, served, uint64(pages), "one fault served a page, prefetch off")
	assert.GreaterOrEqual(t, counted, served, "every fault the server served was a user fault")
	assert.InEpsilon(t, float64(minflt), float64(counted), 0.01)
}

func TestAccessCountingOffAndBadValues(t *testing.T) {
	cfg := testServerConfig()
	cfg.AccessCounting = AccessCountingOff
	s := newSession(t, cfg)
	in, err := s.Info()
	require.NoError(t, err)
	assert.Equal(t, "off (configured)", in.AccessCounting)
	for _, si := range in.Sessions {
		assert.Nil(t, si.EBPFFaults)
	}
	cfg.AccessCounting = "psychic"
	assert.ErrorContains(t, cfg.Validate(), `access counting "psychic": want "auto", "ebpf" or "off"`)
}
