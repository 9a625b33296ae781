package trace

import (
	"fmt"
	"time"
)

// Kind says what an Event records.
type Kind uint8

// The kinds of event. Their numbers are the format's: never renumber one.
const (
	// KindFault is a fault the server served: Processor (the view that
	// faulted), PID, Thread, Range, Addr (the faulting page), FaultKind,
	// Write, Duration (service time, from reading the fault to the ioctl
	// that resolved it returning) and Prefetched (pages brought with it
	// beyond the faulted one). Time is when it was read.
	KindFault Kind = 1
	// KindMigration is pages copied from one location to another and
	// gone from the first: From, To, Cause, Range, Addr (the run's first
	// page), Pages (a run of a block: the pages between Addr and the
	// last moved may include some that did not move), Duration (the
	// copy, from its start to its accounting). Time is when it began.
	KindMigration Kind = 2
	// KindEviction is pages a full location gave up: From (the
	// location), Range, Addr, Pages. The pages that moved are also
	// migrations with CauseEviction, and read-duplicated copies that
	// were dropped are not.
	KindEviction Kind = 3
	// KindPopulate is pages created zero-filled at To: Range, Addr,
	// Pages, Cause (CauseFault: a first touch and what came with it;
	// CausePrefetch: a prefetch of never-touched memory; CauseAdvice:
	// device memory the client wrote through its own mapping). Format
	// versions 1 and 2 have no Cause here: it reads 0.
	KindPopulate Kind = 4
	// KindRemoteMap is pages a processor's view came to map where they
	// lie, in another location's memory: Processor, Range, Addr, Pages.
	KindRemoteMap Kind = 5
	// KindDuplicate is pages copied to To by read duplication, the
	// other copies kept: Range, Addr, Pages.
	KindDuplicate Kind = 6
	// KindLaunch is a kernel launched on device Processor: PID, Stream,
	// Name (the kernel's name; a C kernel's is "c:0x" and its address).
	// Under the fault coherence model the device's process reports each
	// kernel it ran, Time is when it started and Duration its length
	// (not in format versions 1 and 2); under the launch model
	// the client tells the server, and Time is when it did.
	KindLaunch Kind = 7
	// KindSync is a synchronization of stream Stream of device Processor
	// (4294967295: every stream of it, launch model only): under the
	// fault model one the device's process answered, Time when it took
	// it up (every kernel before it on the stream had ended) and
	// Duration until it answered; under the launch model the client
	// saying that the stream went idle, Duration 0.
	KindSync Kind = 8
	// KindAlloc is a managed allocation: PID, Range (its number in this
	// trace), Addr (its start), Bytes (its length).
	KindAlloc Kind = 9
	// KindFree is an allocation freed: PID, Range, Addr.
	KindFree Kind = 10
	// KindSession is a client that connected: PID, Name (its command).
	KindSession Kind = 11
	// KindSessionEnd is a client that went away: PID.
	KindSessionEnd Kind = 12
	// KindArm is pages of Processor's view that the access mode
	// (ServerConfig.TraceAccess) has just left unmapped there: Range,
	// Addr, Pages (a run). The next touch of each by that processor
	// maps it again, which the next round sees (KindAccess). Pages the
	// view mapped from another location's file are not armed.
	KindArm Kind = 13
	// KindAccess is pages armed by the round before that Processor
	// touched since (whether or not the touch faulted): Range, Addr,
	// Pages (a run), Duration (the window: from their arming to this
	// round, which is Time). A page touched several times in a window
	// shows once.
	KindAccess Kind = 14
	// KindDiscard is pages whose every copy a discard dropped (their
	// contents no longer wanted: the managed heap's purge of freed
	// memory, MemDiscard): Range, Addr (the first page), Pages (the run
	// discarded; pages that had no copy included). Their next touch is a
	// first touch. Not in format versions 1 to 3.
	KindDiscard Kind = 15
	// KindProtect is pages that a fault brought back to Processor soon
	// after Processor evicted them, which its thrashing policy then
	// protected from eviction (its resident core): Range, Addr (the
	// first page), Pages. Not in format versions 1 to 4.
	KindProtect Kind = 16
	kindEnd     Kind = 0xff // the writer's last record: Dropped
)

var kindNames = map[Kind]string{
	KindFault: "fault", KindMigration: "migration", KindEviction: "eviction", KindPopulate: "populate",
	KindRemoteMap: "remote_map", KindDuplicate: "duplicate", KindLaunch: "launch", KindSync: "sync",
	KindAlloc: "alloc", KindFree: "free", KindSession: "session", KindSessionEnd: "session_end",
	KindArm: "arm", KindAccess: "access", KindDiscard: "discard", KindProtect: "protect",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Kinds lists every kind of event, in number order.
func Kinds() []Kind {
	return []Kind{KindFault, KindMigration, KindEviction, KindPopulate, KindRemoteMap, KindDuplicate,
		KindLaunch, KindSync, KindAlloc, KindFree, KindSession, KindSessionEnd, KindArm, KindAccess, KindDiscard, KindProtect}
}

// CPU is the host processor's number in Processor, From and To; devices
// are numbered from 0.
const CPU = -1

// FaultKind is the kind of a fault, as userfaultfd reports it.
type FaultKind uint8

const (
	FaultMissing FaultKind = 0 // no page where the processor looks: first touch, or resident elsewhere
	FaultMinor   FaultKind = 1 // the page is in the processor's file but not mapped
	FaultWP      FaultKind = 2 // a write to a write-protected page
)

func (k FaultKind) String() string {
	switch k {
	case FaultMissing:
		return "missing"
	case FaultMinor:
		return "minor"
	case FaultWP:
		return "write_protect"
	}
	return fmt.Sprintf("fault_kind(%d)", uint8(k))
}

// Cause says why pages moved. The numbers are policy.Cause's.
type Cause uint8

const (
	CauseFault    Cause = 1 // a fault on one of them (and the prefetch that came with it)
	CausePrefetch Cause = 2 // an explicit prefetch (cudaMemPrefetchAsync)
	CauseEviction Cause = 3 // room was made where they were
	CauseCounters Cause = 4 // the access counters crossed their threshold
	CauseAdvice   Cause = 5 // advice: read duplication collapsing, a preferred location, a pin of thrashing pages
	CauseLaunch   Cause = 6 // a launch under the launch coherence model handed them to its device
)

func (c Cause) String() string {
	switch c {
	case CauseFault:
		return "fault"
	case CausePrefetch:
		return "prefetch"
	case CauseEviction:
		return "eviction"
	case CauseCounters:
		return "counters"
	case CauseAdvice:
		return "advice"
	case CauseLaunch:
		return "launch"
	}
	return fmt.Sprintf("cause(%d)", uint8(c))
}

// PageSize is the size of the pages that Pages counts.
const PageSize = 4096

// Event is one record of a trace. Which fields mean something depends on
// Kind (see each kind); the others are zero.
type Event struct {
	Kind Kind
	// Time is when it happened, since the trace began (a monotonic
	// clock). Events are written in the order they are handed to the
	// writer, which is not quite time order: threads race to it.
	Time time.Duration
	// PID is the client process the event belongs to (0 where none:
	// evictions a server makes for itself).
	PID int32
	// Thread is the faulting thread's id, where the kernel gave it.
	Thread int32
	// Processor is the processor that faulted, launched, synchronized,
	// came to map pages remotely, or was armed or touched pages (access
	// mode): CPU or a device number.
	Processor int32
	// From and To are a move's source and destination locations.
	From, To int32
	// Range numbers the allocation within the trace (KindAlloc gives it
	// its number); 0 where none.
	Range uint64
	// Addr is a page address (a fault's page, a run's first page) or an
	// allocation's start.
	Addr uint64
	// Pages counts 4 KiB pages.
	Pages uint32
	// Bytes is an allocation's length.
	Bytes uint64
	// FaultKind and Write describe a fault.
	FaultKind FaultKind
	Write     bool
	// Prefetched counts the pages a fault brought beyond the faulted one.
	Prefetched uint32
	// Cause is why a migration moved its pages, or a population made
	// them.
	Cause Cause
	// Duration is a fault's service time, a migration's copy time, a
	// synchronization's wait, or an access's window.
	Duration time.Duration
	// Stream is a launch's or synchronization's stream (0: the default
	// stream, or all of them for a whole-context synchronization).
	Stream uint64
	// Name is a kernel's name, or a session's command.
	Name string
}

// MovedBytes is the bytes a migration, eviction, population, remote
// mapping or duplication covers (and an arming's or access's pages).
func (e *Event) MovedBytes() uint64 { return uint64(e.Pages) * PageSize }

// HumanSize writes a byte count for people, as every softuvm report
// does: the largest binary unit it reaches, whole where it divides
// evenly (2 MiB), else to a tenth (1.5 GiB).
func HumanSize(n uint64) string {
	for _, u := range []struct {
		name string
		size uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size {
			if n%u.size == 0 {
				return fmt.Sprintf("%d %s", n/u.size, u.name)
			}
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// ProcessorName names a processor as `uvm stat` does: "cpu" or
// "device N".
func ProcessorName(p int32) string {
	if p == CPU {
		return "cpu"
	}
	return fmt.Sprintf("device %d", p)
}
