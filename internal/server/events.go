package server

import (
	"github.com/softuvm/softuvm/internal/block"
)

// serverObserver is the server's subscriber to the block engine's events
// (block.Observer): the ranges' counters and the policies are the
// engine's own subscribers; this one records each event in the traces
// (traceEvent), has device mappings follow residency and pins (the
// remapper), counts what the server reports besides the counters (blocks
// rebuilt in 4 KiB folios, pages lost) and completes the fault anatomy's
// sample of a fault. A new observer of the engine is a new subscriber
// here or beside it, not a new call at every site.
type serverObserver struct{ s *Server }

// Timed: traces time each run of pages (a session may start tracing at
// any time).
func (serverObserver) Timed() bool { return true }

func (so serverObserver) Observe(ev block.Event) {
	s := so.s
	switch ev.Kind {
	case block.EvMappings:
		rangeOf(ev.R).sess.enqueueRemap(ev.R, ev.Block)
		return
	case block.EvPinned:
		sess := rangeOf(ev.R).sess
		sess.enqueueRemap(ev.R, ev.Block)
		sess.scheduleRemap(ev.R, ev.Block, ev.Until)
		return
	case block.EvRebuilt:
		s.foliosRebuilt.Add(1)
		return
	case block.EvLostPage:
		s.lostPages.Add(1)
		sess := rangeOf(ev.R).sess
		s.logger.Printf("pid %d location %d: lost page %#x: resident by the table in the file its view maps but missing from it, it reads as zeros (unless the program punched it)", sess.pid, ev.Processor, ev.Addr())
		return
	case block.EvFault:
		if h, ok := ev.Ctx.(*handler); ok && h.sampling != nil && !ev.Failed {
			h.finishSample()
		}
	}
	traceEvent(&ev)
}
