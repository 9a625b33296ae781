package lab

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/trace"
)

const (
	testBase       = 0x600000000000
	pagesPerBlock  = 512
	testPageSize   = 4096
	testDeviceSize = 1 << 30
)

// randomTrace is a host program's faults over blocks blocks, page by
// page, drawn from a few hot spots and the whole range, under a host
// budget of budget pages, recorded with prefetch none and eviction lru,
// without large folios.
func randomTrace(seed uint64, blocks, budget, faults int) (trace.Header, []trace.Event, []int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	var pages []int
	var writes []bool
	total := blocks * pagesPerBlock
	for i := 0; i < faults; i++ {
		var p int
		switch rng.IntN(3) {
		case 0: // a hot spot of 8 pages in each block
			p = rng.IntN(blocks)*pagesPerBlock + rng.IntN(8)
		case 1: // the first pages, again and again
			p = rng.IntN(budget + 1)
		default:
			p = rng.IntN(total)
		}
		pages = append(pages, p)
		writes = append(writes, rng.IntN(2) == 0)
	}
	h, events := pageTrace(pages, writes, blocks, budget)
	return h, events, pages
}

// pageTrace is a host program's faults on pages (indices into one range
// of blocks blocks; writes where writes says, if it is not nil) under a
// host budget of budget pages, recorded with prefetch none and eviction
// lru, without large folios.
func pageTrace(pages []int, writes []bool, blocks, budget int) (trace.Header, []trace.Event) {
	h := trace.Header{Devices: 1, DeviceBytes: testDeviceSize, HostBudget: int64(budget) * testPageSize,
		Policies: map[string]string{"prefetch": "none", "eviction": "lru", "thrashing": "off"}}
	events := []trace.Event{{Kind: trace.KindAlloc, Time: 1, Range: 1, Addr: testBase, Bytes: uint64(blocks) * pagesPerBlock * testPageSize}}
	for i, p := range pages {
		events = append(events, trace.Event{Kind: trace.KindFault, Time: time.Duration(2 + i), Processor: trace.CPU, Range: 1,
			Addr: testBase + uint64(p)*testPageSize, Write: writes != nil && writes[i]})
	}
	return h, events
}

// bruteLRU replays refs by NVIDIA's LRU as the server applies it, written
// as plainly as possible: every page's place in a map, the host's blocks
// in a slice by last arrival; an arrival on the host moves its block to
// the back; over the budget, whole blocks leave from the front (the
// faulting one spared), then, if that was not enough, the faulting
// block's other host pages, those that arrived first first. It counts
// faults and pages moved each way.
func bruteLRU(refs []int, budget int) (faults, in, out int) {
	const host, device = 1, 2
	where := map[int]int{}
	arrived := map[int]int{} // the fault that brought each host page
	var order []int          // blocks with host pages, least recently arrived first
	hostPages := 0
	touchBlock := func(b int) {
		if i := slices.Index(order, b); i >= 0 {
			order = slices.Delete(order, i, i+1)
		}
		order = append(order, b)
	}
	for i, p := range refs {
		if where[p] == host {
			continue
		}
		faults++
		if where[p] == device {
			in++
		}
		where[p] = host
		arrived[p] = i
		hostPages++
		b := p / pagesPerBlock
		touchBlock(b)
		want := hostPages - budget
		if want <= 0 {
			continue
		}
		moved := 0
		for i := 0; i < len(order) && moved < want; {
			v := order[i]
			if v == b {
				i++
				continue
			}
			for q := v * pagesPerBlock; q < (v+1)*pagesPerBlock; q++ {
				if where[q] == host {
					where[q] = device
					moved++
					out++
					hostPages--
				}
			}
			order = slices.Delete(order, i, i+1)
		}
		var own []int
		for q := b * pagesPerBlock; q < (b+1)*pagesPerBlock; q++ {
			if q != p && where[q] == host {
				own = append(own, q)
			}
		}
		slices.SortFunc(own, func(x, y int) int { return arrived[x] - arrived[y] })
		for _, q := range own[:max(0, min(len(own), want-moved))] {
			where[q] = device
			moved++
			out++
			hostPages--
		}
	}
	return faults, in, out
}

// bruteMIN replays refs by Belady's MIN with demand fetching: over the
// budget, the host page whose next use is furthest (never first) leaves,
// found by looking ahead through refs.
func bruteMIN(refs []int, budget int) (faults, in, out int) {
	const host, device = 1, 2
	where := map[int]int{}
	var resident []int
	for i, p := range refs {
		if where[p] == host {
			continue
		}
		faults++
		if where[p] == device {
			in++
		}
		where[p] = host
		resident = append(resident, p)
		for len(resident) > budget {
			best, bestNext := -1, -1
			for j, q := range resident {
				if q == p {
					continue
				}
				next := len(refs) + q // never used again: beyond every use
				if k := slices.Index(refs[i+1:], q); k >= 0 {
					next = i + 1 + k
				}
				if next > bestNext {
					best, bestNext = j, next
				}
			}
			where[resident[best]] = device
			resident = slices.Delete(resident, best, best+1)
			out++
		}
	}
	return faults, in, out
}

// TestLRUMatchesBruteForce: the replay's lru on small random traces
// takes the faults and moves the pages that bruteLRU, written without
// the replay's code, counts.
func TestLRUMatchesBruteForce(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		blocks, budget := 1+int(seed%5), 40+int(seed*37%300)
		h, events, refs := randomTrace(seed, blocks, budget, 3000)
		res, err := ReplayEvents(h, events, Config{})
		require.NoError(t, err)
		faults, in, out := bruteLRU(refs, budget)
		name := fmt.Sprintf("seed %d, %d blocks, budget %d pages", seed, blocks, budget)
		assert.EqualValues(t, faults, res.Replayed.Faults, name)
		assert.EqualValues(t, in, res.Replayed.PagesToHost, name)
		assert.EqualValues(t, out, res.Replayed.PagesToDevice, name)
		assert.EqualValues(t, out, res.Replayed.EvictedPages, name)
		assert.Positive(t, out, name+": the trace must make evictions")
	}
}

// TestOPTMatchesBruteForceAndBoundsEveryPolicy: the replay's opt with
// demand fetching takes exactly Belady's faults (bruteMIN), and no
// eviction policy, with any prefetch policy, moves fewer bytes.
func TestOPTMatchesBruteForceAndBoundsEveryPolicy(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		blocks, budget := 2+int(seed%4), 30+int(seed*53%200)
		h, events, refs := randomTrace(seed, blocks, budget, 1500)
		name := fmt.Sprintf("seed %d, %d blocks, budget %d pages", seed, blocks, budget)
		opt, err := ReplayEvents(h, events, Config{Eviction: OracleEviction, Prefetch: "none"})
		require.NoError(t, err)
		faults, in, out := bruteMIN(refs, budget)
		assert.EqualValues(t, faults, opt.Replayed.Faults, name)
		assert.EqualValues(t, in, opt.Replayed.PagesToHost, name)
		assert.EqualValues(t, out, opt.Replayed.PagesToDevice, name)
		for _, ev := range []string{"lru", "2q"} {
			for _, pf := range []string{"none", "density", "window:16"} {
				res, err := ReplayEvents(h, events, Config{Eviction: ev, Prefetch: pf})
				require.NoError(t, err)
				assert.LessOrEqual(t, opt.Replayed.BytesMoved(), res.Replayed.BytesMoved(), "%s: opt against %s with %s", name, ev, pf)
			}
		}
	}
}

// BenchmarkReplay measures the replay's speed in trace events a second,
// on a random trace of a million faults over 64 MiB under a 16 MiB
// budget with the default policies and large folios (the goal:
// at least a million events a second).
func BenchmarkReplay(b *testing.B) {
	h, events, _ := randomTrace(5, 32, 4096, 1_000_000)
	h.Policies = map[string]string{"prefetch": "density", "eviction": "lru", "thrashing": "on"}
	h.LargeFolios = true
	b.ResetTimer()
	var res *Result
	for i := 0; i < b.N; i++ {
		var err error
		if res, err = ReplayEvents(h, events, Config{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(res.Replayed.Faults), "faults")
}

// TestMinorFaultsAndDeviceEviction: a host page left unmapped in the
// host's file (armed by the access mode, or evicted there from a full
// device) faults as MINOR where large folios are on (the host view then
// registers MINOR faults) and maps the block's other resident pages with
// it; without them the kernel maps it and the server never hears. A
// device of two pages evicts its least recently arrived block's page to
// the host for a third.
func TestMinorFaultsAndDeviceEviction(t *testing.T) {
	block := uint64(pagesPerBlock * testPageSize)
	page := func(b, p uint64) uint64 { return testBase + b*block + p*testPageSize }
	at := time.Duration(1)
	ev := func(e trace.Event) trace.Event { at++; e.Time = at; return e }
	fault := func(proc int32, addr uint64) trace.Event {
		return ev(trace.Event{Kind: trace.KindFault, Processor: proc, Range: 1, Addr: addr})
	}
	events := []trace.Event{
		ev(trace.Event{Kind: trace.KindAlloc, Range: 1, Addr: testBase, Bytes: 3 * block}),
		fault(trace.CPU, page(0, 10)), fault(trace.CPU, page(0, 11)), fault(trace.CPU, page(0, 12)), // 3 populated on the host
		ev(trace.Event{Kind: trace.KindArm, Processor: trace.CPU, Range: 1, Addr: page(0, 10), Pages: 3}),
		fault(trace.CPU, page(0, 10)),               // MINOR with large folios: maps 10-12
		fault(trace.CPU, page(0, 11)),               // then a hit
		fault(0, page(0, 20)), fault(0, page(1, 0)), // the device: 2 pages populated, full
		fault(0, page(2, 0)),          // block 0's page 20 leaves for the host, unmapped there
		fault(trace.CPU, page(0, 20)), // MINOR with large folios (maps 10-12 and 20); else the kernel's
	}
	h := trace.Header{Devices: 1, DeviceBytes: 2 * testPageSize,
		Policies: map[string]string{"prefetch": "none", "eviction": "lru", "thrashing": "off"}}
	for _, folios := range []string{"on", "off"} {
		res, err := ReplayEvents(h, events, Config{LargeFolios: folios})
		require.NoError(t, err)
		assert.EqualValues(t, 3+3, res.Faults[0]+res.Faults[1]-res.MinorFaults, "large folios %s: missing faults", folios)
		assert.EqualValues(t, 3, res.Faults[1], "large folios %s: the device's faults", folios)
		assert.EqualValues(t, 1, res.Replayed.PagesToHost, "large folios %s", folios)
		assert.EqualValues(t, 1, res.Replayed.EvictedPages, "large folios %s", folios)
		assert.EqualValues(t, 1, res.Evicted[1], "large folios %s: from device 0", folios)
		assert.EqualValues(t, 0, res.Refused, "large folios %s", folios)
		if folios == "on" {
			assert.EqualValues(t, 2, res.MinorFaults)
			assert.EqualValues(t, 1, res.Hits)
		} else {
			assert.EqualValues(t, 0, res.MinorFaults)
			assert.EqualValues(t, 3, res.Hits)
		}
	}
}

// TestDeviceWriteProtectMarker: a page that left a device (its move
// write-protected it there) and came back by an eviction from the host
// reads there without a fault, and the device's first write to it is a
// write-protect fault; the next is not. Where the device's view
// registers MINOR faults, the first touch is one and the writes are not
// faults.
func TestDeviceWriteProtectMarker(t *testing.T) {
	block := uint64(pagesPerBlock * testPageSize)
	at := time.Duration(1)
	ev := func(e trace.Event) trace.Event { at++; e.Time = at; return e }
	touch := func(proc int32, addr uint64, write bool) trace.Event {
		return ev(trace.Event{Kind: trace.KindFault, Processor: proc, Range: 1, Addr: addr, Write: write})
	}
	events := []trace.Event{
		ev(trace.Event{Kind: trace.KindAlloc, Range: 1, Addr: testBase, Bytes: 2 * block}),
		touch(0, testBase, true),               // populated on the device
		touch(trace.CPU, testBase, false),      // to the host: the device's copy leaves, marked
		touch(trace.CPU, testBase+block, true), // a second host page: over the budget of one, page 0 goes back
		touch(0, testBase, false),              // a read: mapped read-only, no fault
		touch(0, testBase, true),               // the first write: write-protect fault
		touch(0, testBase, true),               // writable now
	}
	h := trace.Header{Devices: 1, DeviceBytes: testDeviceSize, HostBudget: testPageSize,
		Policies: map[string]string{"prefetch": "none", "eviction": "lru", "thrashing": "off"}}
	res, err := ReplayEvents(h, events, Config{LargeFolios: "off"})
	require.NoError(t, err)
	assert.EqualValues(t, 2, res.Faults[0], "the host's")
	assert.EqualValues(t, 2, res.Faults[1], "the device's: the populating one and the write-protect one")
	assert.EqualValues(t, 1, res.WriteProtectFaults)
	assert.Equal(t, map[string]uint64{"cpu": 2, "device 0": 2}, res.FaultsBy)
	assert.EqualValues(t, 2, res.Hits)
	assert.EqualValues(t, 1, res.Replayed.PagesToHost)
	assert.EqualValues(t, 1, res.Replayed.PagesToDevice)

	// Where the arena takes large folios, the device's view registers
	// MINOR faults over its own file: its first touch of the page that
	// came back, a read, is a MINOR fault, and UFFDIO_CONTINUE maps the
	// page writable over the marker, so both writes are hits.
	large, err := ReplayEvents(h, events, Config{LargeFolios: "on"})
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"cpu": 2, "device 0": 2}, large.FaultsBy, "the device's: the populating one and the MINOR one")
	assert.EqualValues(t, 1, large.MinorFaults)
	assert.EqualValues(t, 0, large.WriteProtectFaults)
	assert.EqualValues(t, 2, large.Hits)
	assert.EqualValues(t, 1, large.Replayed.PagesToDevice)

	// The estimate prices those counts: costs from a uvm bench faults
	// report (10 us a fault of any kind, 4.096 GB/s: 1 us a page, 300 ns
	// a page zero-filled): 3 faults and 1 write-protect fault, 2 pages
	// moved, 2 populated.
	costs, err := ParseCosts([]byte(`{"fault_p50_us": 10, "d2h_read_gbps": 4.096, "firsttouch_managed_ns_per_page": 300, "machine": {"cpus": 2, "kernel": "6.18"}}`))
	require.NoError(t, err)
	assert.Contains(t, costs.Source, "uvm bench faults")
	res, err = ReplayEvents(h, events, Config{Costs: &costs})
	require.NoError(t, err)
	assert.Equal(t, 4*10*time.Microsecond+2*time.Microsecond+2*300*time.Nanosecond, res.EstimatedTime)

	_, err = ParseCosts([]byte(`{"fault_ns": -5}`))
	assert.ErrorContains(t, err, "negative")
	_, err = ParseCosts([]byte(`{"fault_p50_us": 0}`))
	assert.ErrorContains(t, err, "p50")
}
