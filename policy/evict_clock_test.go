package policy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// pageTable is a fake Observer: a block's pages are mapped until Watch
// unmaps them, and a touch maps them again.
type pageTable struct {
	unmapped map[*Block]bool
	watches  int
	noHost   bool
}

func newPageTable() *pageTable { return &pageTable{unmapped: map[*Block]bool{}} }

func (t *pageTable) Watchable(p Processor) bool { return p == core.CPU && !t.noHost }
func (t *pageTable) Watch(b *Block, _ Processor) bool {
	t.watches++
	t.unmapped[b] = true
	return true
}
func (t *pageTable) Touched(b *Block, _ Processor) int {
	if t.unmapped[b] {
		return 0
	}
	return b.Pages
}
func (t *pageTable) touch(b *Block) { delete(t.unmapped, b) }

// clockRun drives an eviction policy as the server does, over a host of
// capacity blocks: each step touches the hot blocks where they are
// (bringing back any evicted), then one block of a scan that never
// comes back arrives. It returns how many times a hot block was evicted
// from step warm on, and the blocks evicted from then, in order.
func clockRun(t *testing.T, ev Eviction, table *pageTable, capacity, hot, warm, steps int) (hotEvictions int, evicted []*Block) {
	blocks := map[int]*Block{}
	block := func(i int) *Block {
		if blocks[i] == nil {
			blocks[i] = &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
		}
		return blocks[i]
	}
	resident := map[*Block]bool{}
	step := 0
	bring := func(b *Block) {
		if resident[b] {
			table.touch(b)
			return
		}
		for len(resident) >= capacity {
			vs := ev.Victims(core.CPU, 1, nil)
			require.NotEmpty(t, vs, "a full host with %d blocks got no victim", len(resident))
			v := vs[0]
			require.True(t, resident[v], "victim %v is not resident", v)
			delete(resident, v)
			ev.Left(v, core.CPU)
			if step < warm {
				continue
			}
			evicted = append(evicted, v)
			if int(v.Addr/core.BlockSize) < hot {
				hotEvictions++
			}
		}
		resident[b] = true
		table.touch(b)
		ev.Arrived(b, core.CPU, b.Pages, CauseFault)
	}
	for ; step < steps; step++ {
		for h := 0; h < hot; h++ {
			bring(block(h))
		}
		bring(block(hot + step))
	}
	return hotEvictions, evicted
}

// TestHintClockKeepsWhatIsUsedThroughAScan: a working set of 8 blocks
// used on every step, and a scan of blocks used once, on a host of 10.
// The active list holds at most 7, so a block of the working set is
// always back on probation: only its watched touches keep it.
// Least recently migrated (lru) evicts the working set again and again,
// since it arrived first; the clock, seeing the working set touched
// after each watch, evicts only scan blocks, oldest first, once it has
// watched each block once (its first victims can only be in arrival
// order).
func TestHintClockKeepsWhatIsUsedThroughAScan(t *testing.T) {
	const capacity, hot, warm, steps = 10, 8, 20, 200
	lruHot, _ := clockRun(t, NewLRU(), newPageTable(), capacity, hot, warm, steps)
	require.Greater(t, lruHot, (steps-warm)/2, "the baseline should lose its working set to the scan")

	c := NewHintClock()
	table := newPageTable()
	c.Observe(table)
	clockHot, evicted := clockRun(t, c, table, capacity, hot, warm, steps)
	require.Zero(t, clockHot, "the clock evicted the working set")
	require.Positive(t, table.watches)
	// One scan block left per step, in the order they came: the scan
	// is blocks hot, hot+1, ..., and capacity-hot of them are resident
	// at the step's start.
	require.Len(t, evicted, steps-warm)
	for i, v := range evicted {
		require.Equal(t, uintptr(hot+warm-(capacity-hot)+i)*core.BlockSize, v.Addr, "eviction %d", i)
	}
}

// TestHintClockWithoutObserverIsArrivalOrder: where use cannot be
// watched, victims come in arrival order, as lru's.
func TestHintClockWithoutObserverIsArrivalOrder(t *testing.T) {
	for _, obs := range []struct {
		name  string
		table *pageTable
	}{{"none", nil}, {"unwatchable", &pageTable{unmapped: map[*Block]bool{}, noHost: true}}} {
		t.Run(obs.name, func(t *testing.T) {
			c := NewHintClock()
			if obs.table != nil {
				c.Observe(obs.table)
			}
			var bs []*Block
			for i := 0; i < 8; i++ {
				b := &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
				bs = append(bs, b)
				c.Arrived(b, core.CPU, b.Pages, CauseFault)
			}
			require.Equal(t, bs[:3], c.Victims(core.CPU, 3, nil))
			c.Left(bs[0], core.CPU)
			require.Equal(t, bs[1:4], c.Victims(core.CPU, 3, nil))
			require.Empty(t, c.Victims(core.Device(0), 3, nil), "nothing is on device 0")
			if obs.table != nil {
				require.Zero(t, obs.table.watches)
			}
		})
	}
}

// TestHintClockRefaultIsActive: a block that comes back soon after it
// was evicted is listed active, so that blocks on probation go first.
func TestHintClockRefaultIsActive(t *testing.T) {
	c := NewHintClock()
	var bs []*Block
	for i := 0; i < 4; i++ {
		b := &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
		bs = append(bs, b)
		c.Arrived(b, core.CPU, b.Pages, CauseFault)
	}
	v := c.Victims(core.CPU, 1, nil)
	require.Equal(t, []*Block{bs[0]}, v)
	c.Left(bs[0], core.CPU)
	c.Arrived(bs[0], core.CPU, bs[0].Pages, CauseFault) // back at once
	require.Equal(t, bs[1:4], c.Victims(core.CPU, 3, nil), "the refaulted block must come after those on probation")
	require.Equal(t, fmt.Sprint(bs[1:4]), fmt.Sprint(c.Victims(core.CPU, 3, nil)), "asking again offers the same")
}

// callLog is a pageTable that notes, for each block, the Victims call
// in which it was last watched, and fails the test when a block is
// judged in that same call.
type callLog struct {
	*pageTable
	t         *testing.T
	call      int
	watchedIn map[*Block]int
	judged    int
}

func (l *callLog) Watch(b *Block, p Processor) bool {
	l.watchedIn[b] = l.call
	return l.pageTable.Watch(b, p)
}

func (l *callLog) Touched(b *Block, p Processor) int {
	l.judged++
	require.NotEqual(l.t, l.call, l.watchedIn[b], "block %#x judged in the call that watched it: the program had no time to touch it", b.Addr)
	return l.pageTable.Touched(b, p)
}

// TestHintClockJudgesOnlyWhatWasWatchedBeforeTheCall: a call that finds
// a watched block touched goes round again; the blocks it has just
// unmapped must wait for a later call, or they are victims for want of
// a touch the program could not yet make.
func TestHintClockJudgesOnlyWhatWasWatchedBeforeTheCall(t *testing.T) {
	c := NewHintClock()
	log := &callLog{pageTable: newPageTable(), t: t, watchedIn: map[*Block]int{}}
	c.Observe(log)
	var bs []*Block
	for i := 0; i < 8; i++ {
		b := &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
		bs = append(bs, b)
		c.Arrived(b, core.CPU, b.Pages, CauseFault)
	}
	for call := 1; call <= 6; call++ {
		log.call = call
		vs := c.Victims(core.CPU, 1, nil)
		require.Len(t, vs, 1)
		// The program touches every block but the victim, which leaves.
		for _, b := range bs {
			if b != vs[0] {
				log.touch(b)
			}
		}
		c.Left(vs[0], core.CPU)
		c.Arrived(vs[0], core.CPU, vs[0].Pages, CauseFault) // and comes back
		log.touch(vs[0])
	}
	require.Positive(t, log.judged, "nothing was judged")
}

// TestHintClockCleanCopies: "clock" asks for clean eviction, "clock:copy"
// does not, and any other argument is refused with the choices named.
func TestHintClockCleanCopies(t *testing.T) {
	for spec, clean := range map[string]bool{"clock": true, "clock:copy": false} {
		ev, err := NewEviction(spec)
		require.NoError(t, err)
		assert.Equal(t, spec, ev.Name())
		c, ok := ev.(CleanCopying)
		require.True(t, ok, "%s is a CleanCopying", spec)
		assert.Equal(t, clean, c.CleanCopies(), spec)
	}
	_, err := NewEviction("clock:dirty")
	assert.ErrorContains(t, err, `"clock:dirty": want clock, or clock:copy`)
	lru, err := NewEviction("lru")
	require.NoError(t, err)
	_, ok := lru.(CleanCopying)
	assert.False(t, ok, "lru, the old default, copies every page it evicts")
}
