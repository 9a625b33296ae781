package uvm

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/policy"
)

// TestAccessCountsBesideServedAndMinflt: a client's faults are shown
// three ways, and the eBPF count agrees with the kernel's minflt within
// 1% over more than 10,000 faults (every fault here is a user fault).
func TestAccessCountsBesideServedAndMinflt(t *testing.T) {
	s := newSession(t, testServerConfig())
	in, err := s.rpc.Info()
	require.NoError(t, err)
	if !strings.HasPrefix(in.AccessCounting, "ebpf") {
		t.Skipf("no eBPF access counters here: %s", in.AccessCounting)
	}
	const pages = 12000
	a, err := s.MallocManaged(pages*PageSize, WithPrefetch(PrefetchSpec{Policy: "none"}))
	require.NoError(t, err)
	before := ownSession(t, s)
	require.NotNil(t, before.EBPFFaults)
	require.NotNil(t, before.MinorFaults)
	b := a.Bytes()
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	// A handler counts a fault after waking its thread: the last count
	// may land a moment after the touch.
	var after SessionInfo
	Eventually(t, 2*time.Second, func() bool { after = ownSession(t, s); return after.ServedFaults-before.ServedFaults >= pages }, "served fewer faults than pages")
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
	cfg.AccessCounting = config.AccessCountingOff
	s := newSession(t, cfg)
	in, err := s.rpc.Info()
	require.NoError(t, err)
	assert.Equal(t, "off (configured)", in.AccessCounting)
	for _, si := range in.Sessions {
		assert.Nil(t, si.EBPFFaults)
	}
	cfg.AccessCounting = "psychic"
	assert.ErrorContains(t, cfg.Validate(), `access counting "psychic": want "auto", "ebpf", "user" or "off"`)
	cfg.AccessCounting = config.AccessCountingAuto
	cfg.AccessPolicy = policy.AccessPolicy{Hints: true, Threshold: 256, Period: core.Duration(time.Second), Sample: 1 << 20, Decay: core.Duration(time.Millisecond)}
	assert.ErrorContains(t, cfg.Validate(), "access counter decay 1ms: want at least the period (1s)")
	for text, want := range map[string]string{
		"threshold=0": "access counter threshold 0",
		"period=10us": "hint-fault period 10µs: want 1ms to 1h",
		"sample=1":    "hint-fault sample 1 bytes",
		"anatomy=-1":  "fault anatomy sampling 1 in -1",
		"hints=maybe": `setting "hints=maybe": want on or off`,
		"colour=blue": `unknown key "colour"`,
		"threshold":   "want key=value",
		"decay=soon":  `setting "decay=soon"`,
	} {
		_, err := policy.ParseAccessPolicy(text)
		assert.ErrorContains(t, err, want, text)
	}
	p, err := policy.ParseAccessPolicy("threshold=64,period=20ms,sample=1MiB,decay=1s,anatomy=0,hints=off")
	require.NoError(t, err)
	assert.Equal(t, policy.AccessPolicy{Threshold: 64, Period: core.Duration(20 * time.Millisecond), Sample: 1 << 20, Decay: core.Duration(time.Second)}, p)
	round, err := policy.ParseAccessPolicy(policy.DefaultAccessPolicy.String())
	require.NoError(t, err)
	assert.Equal(t, policy.DefaultAccessPolicy, round, "String reads back")
}

// counterPrograms lists the ids of the loaded access-counter programs.
func counterPrograms(t *testing.T) map[ebpf.ProgramID]bool {
	out := map[ebpf.ProgramID]bool{}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return out
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && (info.Name == "count_fault" || info.Name == "note_resume") {
			out[id] = true
		}
		p.Close()
	}
}

// counterObjects returns the maps the given programs use and the links
// that attach them.
func counterObjects(t *testing.T, progs []ebpf.ProgramID) (maps []ebpf.MapID, links []link.ID) {
	t.Helper()
	ours := map[ebpf.ProgramID]bool{}
	seen := map[ebpf.MapID]bool{}
	for _, id := range progs {
		ours[id] = true
		p, err := ebpf.NewProgramFromID(id)
		require.NoError(t, err)
		info, err := p.Info()
		p.Close()
		require.NoError(t, err)
		ids, ok := info.MapIDs()
		require.True(t, ok, "the kernel does not list program %d's maps", id)
		for _, m := range ids {
			if !seen[m] {
				seen[m] = true
				maps = append(maps, m)
			}
		}
	}
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		if info, err := it.Link.Info(); err == nil && ours[info.Program] {
			links = append(links, it.ID)
		}
	}
	require.NoError(t, it.Err())
	return maps, links
}

// gone reports whether an eBPF object that open would open by id no
// longer exists.
func gone(open func() (io.Closer, error)) bool {
	c, err := open()
	if err == nil {
		c.Close()
	}
	return errors.Is(err, os.ErrNotExist)
}

// TestServerExitLeavesNoProgram: a server's access-counter programs, the
// maps they use and the links that attach them are gone once it is
// closed.
func TestServerExitLeavesNoProgram(t *testing.T) {
	requireRoot(t)
	cfg := testServerConfig()
	cfg.AccessCounting = config.AccessCountingAuto
	srv, err := server.NewServer(cfg)
	require.NoError(t, err)
	if srv.Access.Ebpf == nil {
		srv.Close()
		t.Skipf("no eBPF access counters here: %s", srv.Access.Mode)
	}
	// The server's own programs: other servers (other tests, other
	// packages' tests run at the same time) load theirs too.
	ours, err := srv.Access.Ebpf.ProgramIDs()
	require.NoError(t, err)
	loaded := counterPrograms(t)
	for _, id := range ours {
		assert.True(t, loaded[id], "program %d is not among the loaded counting programs", id)
	}
	assert.Len(t, ours, 2, "the counting program and the anatomy's")
	maps, links := counterObjects(t, ours)
	t.Logf("programs %v, maps %v, links %v", ours, maps, links)
	assert.NotEmpty(t, maps, "the counters keep their counts in maps")
	assert.Len(t, links, len(ours), "each program is attached by a link")
	require.NoError(t, srv.Close())
	for _, id := range ours {
		assert.Eventually(t, func() bool {
			return gone(func() (io.Closer, error) { return ebpf.NewProgramFromID(id) })
		}, 2*time.Second, 10*time.Millisecond, "program %d is left after the server closed", id)
	}
	for _, id := range maps {
		assert.Eventually(t, func() bool {
			return gone(func() (io.Closer, error) { return ebpf.NewMapFromID(id) })
		}, 2*time.Second, 10*time.Millisecond, "map %d is left after the server closed", id)
	}
	for _, id := range links {
		assert.Eventually(t, func() bool {
			return gone(func() (io.Closer, error) { return link.NewFromID(id) })
		}, 2*time.Second, 10*time.Millisecond, "link %d is left after the server closed", id)
	}
}

// TestFaultAnatomy: with every fault sampled, each stage of the client's
// faults is measured, and the stages add up to the whole.
func TestFaultAnatomy(t *testing.T) {
	an := sampledAnatomy(t, 0, 2000)
	mean := func(h Histogram) time.Duration { return h.Mean() }
	t.Logf("%d samples; means: to server %v, sampling %v, decision %v, ioctl %v, wake %v; total %v",
		an.Samples, mean(an.ToServer), mean(an.Sampling), mean(an.Decision), mean(an.Ioctl), mean(an.Wake), mean(an.Total))
	for name, h := range map[string]Histogram{"to server": an.ToServer, "decision": an.Decision, "ioctl": an.Ioctl, "wake": an.Wake, "total": an.Total} {
		assert.Equal(t, an.Samples, h.Count, name)
	}
	// A fault reaches the server through a context switch and is
	// resolved by a system call: neither takes under 100 ns. Timestamps
	// that were not taken (zero) would put every sample in the first
	// bucket.
	for name, h := range map[string]Histogram{"to server": an.ToServer, "ioctl": an.Ioctl, "total": an.Total} {
		assert.GreaterOrEqual(t, h.Quantile(0.5), 100*time.Nanosecond, name)
	}

	// Each stage measures its own span: a stall the server adds between
	// its decision's start and the ioctl (FaultDelay) shows in the
	// decision stage and the total, and nowhere else.
	const delay = 3 * time.Millisecond
	slow := sampledAnatomy(t, delay, 200)
	assert.GreaterOrEqual(t, slow.Decision.Quantile(0.5), delay, "decision")
	assert.GreaterOrEqual(t, slow.Total.Quantile(0.5), delay, "total")
	for name, h := range map[string]Histogram{"to server": slow.ToServer, "sampling": slow.Sampling, "ioctl": slow.Ioctl, "wake": slow.Wake} {
		assert.Less(t, h.Quantile(0.5), delay, "%s holds the stall", name)
	}
}

// sampledAnatomy touches pages pages of a new allocation, each a fault
// that the server (stalling each by delay) samples, and returns the
// anatomy once half of them are sampled.
func sampledAnatomy(t *testing.T, delay time.Duration, pages int) *FaultAnatomy {
	cfg := testServerConfig()
	cfg.AccessPolicy = policy.DefaultAccessPolicy
	cfg.AccessPolicy.AnatomyEvery = 1
	cfg.FaultDelay = core.Duration(delay)
	s := newSession(t, cfg)
	in, err := s.rpc.Info()
	require.NoError(t, err)
	if in.Anatomy == nil {
		t.Skipf("no fault anatomy here: %s", in.AccessCounting)
	}
	a, err := s.MallocManaged(int64(pages)*PageSize, WithPrefetch(PrefetchSpec{Policy: "none"}))
	require.NoError(t, err)
	b := a.Bytes()
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	var an *FaultAnatomy
	Eventually(t, 2*time.Second, func() bool {
		in, err := s.rpc.Info()
		require.NoError(t, err)
		an = in.Anatomy
		return an.Samples >= uint64(pages/2)
	}, "fewer than half the faults sampled")
	return an
}

// ownSession is what the server says of this process's session of s.
func ownSession(t *testing.T, s *Session) SessionInfo {
	t.Helper()
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

// deviceProcess is the fault counts of device d's process in si; false
// while d has none.
func deviceProcess(si SessionInfo, d Device) (config.ProcessFaults, bool) {
	for _, pf := range si.Devices {
		if pf.Processor == d {
			return pf, true
		}
	}
	return config.ProcessFaults{}, false
}
