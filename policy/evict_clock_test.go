package policy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

// pageTable is a fake Observer: a block's pages are mapped until Watch
// unmaps them, and a touch maps them again (all of them, or those
// touchPages names).
type pageTable struct {
	mapped  map[*Block]PageMask // of the blocks watched; any other is mapped whole
	watches int
	regions int // watches that asked for regions
	noHost  bool
}

func newPageTable() *pageTable { return &pageTable{mapped: map[*Block]PageMask{}} }

func (t *pageTable) Watchable(p Processor) bool { return p == core.CPU && !t.noHost }
func (t *pageTable) Watch(b *Block, _ Processor, regions bool) bool {
	t.watches++
	if regions {
		t.regions++
	}
	t.mapped[b] = PageMask{}
	return true
}
func (t *pageTable) Touched(b *Block, _ Processor) PageMask {
	if m, ok := t.mapped[b]; ok {
		return m
	}
	return wholeBlock
}
func (t *pageTable) touch(b *Block) { delete(t.mapped, b) }
func (t *pageTable) touchPages(b *Block, pages PageMask) {
	if m, ok := t.mapped[b]; ok {
		m.Or(&pages)
		t.mapped[b] = m
	}
}

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
	}{{"none", nil}, {"unwatchable", &pageTable{mapped: map[*Block]PageMask{}, noHost: true}}} {
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

func (l *callLog) Watch(b *Block, p Processor, regions bool) bool {
	l.watchedIn[b] = l.call
	return l.pageTable.Watch(b, p, regions)
}

func (l *callLog) Touched(b *Block, p Processor) PageMask {
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

// regionPages is every page of the 64 KiB regions of a block for which
// keep says yes, computed page by page.
func regionPages(keep func(region int) bool) PageMask {
	var m PageMask
	for p := 0; p < core.PagesPerBlock; p++ {
		if keep(p / 16) {
			m.Set(p)
		}
	}
	return m
}

// TestHintClockRegions: "clock:regions" judges what a watch saw by 64
// KiB region. A watched block nothing of which was touched leaves whole;
// one that was touched gives up its untouched regions and keeps the
// others; one touched all over gives up nothing. Pages arriving on a
// block while it is watched (mapped by the fault that brought them) are
// touched, and do not end the watch of its other regions.
func TestHintClockRegions(t *testing.T) {
	ev, err := NewEviction("clock:regions")
	require.NoError(t, err)
	rc, ok := ev.(PageEviction)
	require.True(t, ok, "clock:regions chooses pages")
	table := newPageTable()
	ev.(Observing).Observe(table)

	var bs []*Block
	for i := 0; i < 5; i++ {
		bs = append(bs, &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock})
	}
	region := func(r int) PageMask { return regionPages(func(x int) bool { return x == r }) }
	for _, b := range bs[:4] {
		rc.ArrivedPages(b, core.CPU, wholeBlock, CauseFault)
	}
	rc.ArrivedPages(bs[4], core.CPU, region(0), CauseFault)

	// The first call has nothing watched long enough to judge: it
	// watches every block and offers the oldest in list order, which
	// goes to the back of the list (the server may not have taken it).
	first := rc.VictimPages(core.CPU, 16, nil)
	require.Len(t, first, 1)
	require.Equal(t, bs[0], first[0].Block)
	require.Equal(t, 5, table.watches)
	require.Equal(t, 5, table.regions, "every watch asks for regions")

	// The program runs: block 0's region 3 and block 1's regions 0 and 1
	// are touched, block 2 not at all, block 3 all over; region 5 of
	// block 4 arrives (and is mapped by its fault).
	table.touchPages(bs[0], region(3))
	r01 := region(0)
	r1 := region(1)
	r01.Or(&r1)
	table.touchPages(bs[1], r01)
	table.touch(bs[3])
	rc.ArrivedPages(bs[4], core.CPU, region(5), CauseFault)
	table.touchPages(bs[4], region(5))

	want := (512 - 16) + (512 - 32) + 512 + 16
	got := rc.VictimPages(core.CPU, want, nil)
	require.Len(t, got, 4, "victims: %v", got)
	expect := []Victim{
		{bs[1], regionPages(func(r int) bool { return r != 0 && r != 1 })},
		{bs[2], wholeBlock},
		{bs[4], region(0)},
		{bs[0], regionPages(func(r int) bool { return r != 3 })},
	}
	for i, v := range got {
		require.Equal(t, expect[i].Block, v.Block, "victim %d", i)
		require.Equal(t, expect[i].Pages, v.Pages, "victim %d (block %d): pages", i, v.Block.Addr/core.BlockSize)
	}

	// The blocks clock watches without asking for regions.
	blocks := NewHintClock()
	bt := newPageTable()
	blocks.Observe(bt)
	for _, b := range bs {
		blocks.Arrived(b, core.CPU, b.Pages, CauseFault)
	}
	blocks.Victims(core.CPU, 1, nil)
	require.Positive(t, bt.watches)
	require.Zero(t, bt.regions)
}

// TestHintClockRegionsWaitForTheWatchToGrowOld: a call that comes soon
// after the watch (pages worth less than an eighth of those listed asked
// for since, fewer than 32 calls) judges nothing: it offers the blocks
// not touched yet, whole, and leaves the touched ones watched. Once the
// watch is old enough, the touched block gives up its untouched regions
// and an untouched one leaves whole.
func TestHintClockRegionsWaitForTheWatchToGrowOld(t *testing.T) {
	ev, err := NewEviction("clock:regions")
	require.NoError(t, err)
	rc := ev.(PageEviction)
	table := newPageTable()
	ev.(Observing).Observe(table)
	var bs []*Block
	for i := 0; i < 4; i++ {
		b := &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
		bs = append(bs, b)
		rc.ArrivedPages(b, core.CPU, wholeBlock, CauseFault)
	}
	first := rc.VictimPages(core.CPU, 16, nil) // watches all; offers block 0, which goes to the back
	require.Len(t, first, 1)
	require.Equal(t, bs[0], first[0].Block)

	region3 := regionPages(func(r int) bool { return r == 3 })
	table.touchPages(bs[1], region3)
	table.touch(bs[3])

	soon := rc.VictimPages(core.CPU, 16, nil)
	require.Len(t, soon, 1, "victims: %v", soon)
	assert.Equal(t, bs[2], soon[0].Block, "the first block not touched yet, in list order")
	assert.Equal(t, wholeBlock, soon[0].Pages)

	later := rc.VictimPages(core.CPU, 600, nil)
	require.Len(t, later, 2, "victims: %v", later)
	assert.Equal(t, bs[1], later[0].Block)
	assert.Equal(t, regionPages(func(r int) bool { return r != 3 }), later[0].Pages, "all but the touched region")
	assert.Equal(t, bs[0], later[1].Block)
	assert.Equal(t, wholeBlock, later[1].Pages)
}

// TestHintClockCleanCopies: "clock" asks for clean eviction, ":copy"
// turns it off, ":regions" or ":blocks" choose what leaves, and any
// other argument is refused with the choices named.
func TestHintClockCleanCopies(t *testing.T) {
	for _, c := range []struct {
		spec, name     string
		clean, regions bool
	}{
		{"clock", "clock", true, clockRegionsByDefault},
		{"clock:copy", "clock:copy", false, clockRegionsByDefault},
		{"clock:regions", "clock" + map[bool]string{false: ":regions"}[clockRegionsByDefault], true, true},
		{"clock:blocks", "clock" + map[bool]string{true: ":blocks"}[clockRegionsByDefault], true, false},
		{"clock:copy,regions", "clock:" + map[bool]string{false: "regions,"}[clockRegionsByDefault] + "copy", false, true},
		{"clock:blocks,copy", "clock:" + map[bool]string{true: "blocks,"}[clockRegionsByDefault] + "copy", false, false},
	} {
		ev, err := NewEviction(c.spec)
		require.NoError(t, err)
		assert.Equal(t, c.name, ev.Name(), c.spec)
		cc, ok := ev.(CleanCopying)
		require.True(t, ok, "%s is a CleanCopying", c.spec)
		assert.Equal(t, c.clean, cc.CleanCopies(), c.spec)
		_, pages := ev.(PageEviction)
		assert.Equal(t, c.regions, pages, "%s chooses pages", c.spec)
		again, err := NewEviction(ev.Name())
		require.NoError(t, err, "its name is a spec")
		assert.Equal(t, ev.Name(), again.Name())
	}
	_, err := NewEviction("clock:dirty")
	assert.ErrorContains(t, err, `"clock:dirty": want clock, or clock: with a comma list of copy (no clean eviction) and blocks or regions`)
	lru, err := NewEviction("lru")
	require.NoError(t, err)
	_, ok := lru.(CleanCopying)
	assert.False(t, ok, "lru, the old default, copies every page it evicts")
}

// TestHintClockRegionsOfferTwoBlocks: where nothing can be judged (a
// device, whose use is not watched), a block offered in list order by
// one call and offered again by the next comes with a spare, however few
// pages are wanted. The server skips the block it is serving, and the
// policy then sends it to the back of its list; were that block the
// only one on probation, it would be offered alone again and again while
// the active blocks behind it filled the device, and the fault would
// fail for want of room.
func TestHintClockRegionsOfferTwoBlocks(t *testing.T) {
	ev, err := NewEviction("clock:regions")
	require.NoError(t, err)
	rc := ev.(PageEviction)
	dev := core.Device(0)
	served := &Block{Addr: 0, Pages: core.PagesPerBlock}
	other := &Block{Addr: core.BlockSize, Pages: core.PagesPerBlock}
	rc.ArrivedPages(other, dev, wholeBlock, CauseFault)
	first := rc.VictimPages(dev, 1, nil)
	require.NotEmpty(t, first)
	require.Equal(t, other, first[0].Block)
	rc.LeftPages(other, dev, wholeBlock)
	ev.Left(other, dev)
	rc.ArrivedPages(other, dev, wholeBlock, CauseFault) // back soon after: active
	rc.ArrivedPages(served, dev, RegionOf(0), CauseFault)
	first = rc.VictimPages(dev, 1, nil) // the server skips it
	require.Len(t, first, 1, "victims: %v", first)
	require.Equal(t, served, first[0].Block)
	for round := 0; round < 3; round++ {
		victims := rc.VictimPages(dev, 1, nil)
		var blocks []*Block
		for _, v := range victims {
			blocks = append(blocks, v.Block)
		}
		require.Equal(t, []*Block{served, other}, blocks, "round %d: the block on probation, offered again, then the active one", round)
		assert.Equal(t, RegionOf(0), victims[0].Pages, "only the pages it holds")
		assert.Equal(t, wholeBlock, victims[1].Pages)
	}
}

// loopRun drives an eviction policy over a host of capacity blocks as a
// program sweeping n blocks in order, again and again, would, in the
// server's order: each block of the sweep is touched where it is, or
// brought back and then, the host over its budget, others evicted (the
// server never takes the block it is serving) before the program
// touches it. It returns the blocks brought back in the sweeps from
// warm on.
func loopRun(t *testing.T, ev Eviction, table *pageTable, capacity, n, warm, sweeps int) (misses int) {
	blocks := make([]*Block, n)
	for i := range blocks {
		blocks[i] = &Block{Addr: uintptr(i) * core.BlockSize, Pages: core.PagesPerBlock}
	}
	resident := map[*Block]bool{}
	for sweep := 0; sweep < sweeps; sweep++ {
		for _, b := range blocks {
			if resident[b] {
				table.touch(b)
				continue
			}
			resident[b] = true
			ev.Arrived(b, core.CPU, b.Pages, CauseFault)
			for len(resident) > capacity {
				// Three, as AskVictims asks for one block.
				vs := ev.Victims(core.CPU, 3, nil)
				i := 0
				for i < len(vs) && vs[i] == b {
					i++
				}
				require.Less(t, i, len(vs), "a full host with %d blocks got no victim but the one arriving", len(resident))
				require.True(t, resident[vs[i]], "victim %v is not resident", vs[i])
				delete(resident, vs[i])
				ev.Left(vs[i], core.CPU)
			}
			table.touch(b)
			if sweep >= warm {
				misses++
			}
		}
	}
	return misses
}

// TestHintClockKeepsPartOfALoop: a program sweeps 24 blocks in order
// on a host of 8, as `uvm bench oversub` does. Every block comes back
// long after it left, further than the host could have kept it, so
// least recently migrated (lru) misses each block on every sweep. The
// clock keeps what its active list took while it had room: blocks that
// come back from that far do not push them out, so the others miss and
// those stay, as the optimum would keep any capacity of them.
func TestHintClockKeepsPartOfALoop(t *testing.T) {
	const capacity, n, warm, sweeps = 8, 24, 3, 20
	const all = n * (sweeps - warm)
	require.Equal(t, all, loopRun(t, NewLRU(), newPageTable(), capacity, n, warm, sweeps), "lru misses every block of every sweep")

	c := NewHintClock()
	table := newPageTable()
	c.Observe(table)
	misses := loopRun(t, c, table, capacity, n, warm, sweeps)
	// The active list keeps three quarters of the blocks: 6 of 8.
	kept := 3 * capacity / 4
	assert.LessOrEqual(t, misses, (n-kept)*(sweeps-warm), "the clock should keep %d blocks through the sweeps", kept)
	t.Logf("misses: lru %d, clock %d", all, misses)
}

// TestHintClockRegionsSpareAfterAJudgedBlock: the block the server is
// serving, alone on probation and judged at most calls (watched long
// enough, one region in use), gives up its untouched regions, which the
// server cannot take; the blocks in use are active. A call that offers
// only what the call before offered adds a spare from the lists, so that
// the server, asking again, finds another block. Without the spare after
// judged blocks (only after blocks offered in list order), 26 calls in a
// row offered the served block alone, and a prefetch to a full device
// failed about one run in ten of the server's stress test.
func TestHintClockRegionsSpareAfterAJudgedBlock(t *testing.T) {
	ev, err := NewEviction("clock:regions")
	require.NoError(t, err)
	rc := ev.(PageEviction)
	table := newPageTable()
	ev.(Observing).Observe(table)
	a := &Block{Addr: 0, Pages: core.PagesPerBlock}
	b := &Block{Addr: core.BlockSize, Pages: core.PagesPerBlock}
	served := &Block{Addr: 2 * core.BlockSize, Pages: core.PagesPerBlock}
	region0 := regionPages(func(r int) bool { return r == 0 })
	rc.ArrivedPages(a, core.CPU, wholeBlock, CauseFault)
	rc.ArrivedPages(b, core.CPU, wholeBlock, CauseFault)
	rc.ArrivedPages(served, core.CPU, wholeBlock, CauseFault)
	// The program uses a and b whole and the served block's first
	// region; the server takes nothing (it cannot take the served block,
	// and whatever else is offered it puts back, as a block it found
	// busy), so the lists stay as they are.
	run, longest, alone := 0, 0, 0
	for call := 0; call < 200; call++ {
		table.touch(a)
		table.touch(b)
		table.touchPages(served, region0)
		victims := rc.VictimPages(core.CPU, 16, nil)
		require.NotEmpty(t, victims, "call %d", call)
		other := false
		for _, v := range victims {
			other = other || v.Block != served
		}
		if other {
			run = 0
			continue
		}
		alone++
		run++
		longest = max(longest, run)
	}
	t.Logf("200 calls: %d offered the served block alone, at most %d in a row", alone, longest)
	assert.LessOrEqual(t, longest, 1, "calls in a row that offered only the served block")
}
