package device

import (
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/wire"
)

// reporter tells the server of a traced session which kernels the
// process ran and which synchronizations it answered (internal/wire's
// devicetrace.go), on the report socket the server's device-trace notice
// carried. Untraced, a process has none, and each launch and
// synchronization pays one nil check.
//
// Records are batched: a batch goes out when it holds
// wire.MaxReportRecords records, reportDelay after its first record,
// when a stream ends, and when the process ends (the server waits for
// that at the session's end). So a loop of short launches and
// synchronizations pays one send per 32 of them, not one each, and a
// record reaches the server at most reportDelay after it was made,
// however idle the stream. A send never waits: when the socket is full
// the batch is dropped and counted, and the next report says how many
// were lost; when the server is gone (it died, and whoever took over
// does not read this socket) the process stops reporting.
type reporter struct {
	fd int
	// base pairs a reading of CLOCK_MONOTONIC with one of the runtime's
	// monotonic clock, which reads the same clock without a system
	// call: now is base plus the time since.
	base   time.Time
	baseNS int64

	mu    sync.Mutex // guards the fields below; held to add a record or send
	batch wire.ReportBatch
	lost  uint32
	dead  bool
	timer *time.Timer // flushes a batch reportDelay after its first record
}

// reportDelay is the longest a record waits in a batch that does not
// fill.
const reportDelay = 5 * time.Millisecond

func newReporter(fd int) *reporter {
	syscall.CloseOnExec(fd)
	return &reporter{fd: fd, base: time.Now(), baseNS: int64(devmem.MonotonicNow())}
}

// now reads CLOCK_MONOTONIC in nanoseconds, within a microsecond.
func (rp *reporter) now() int64 { return rp.baseNS + int64(time.Since(rp.base)) }

// launch records a kernel that ran on stream from start to end.
func (rp *reporter) launch(stream uint32, name string, threads uint32, start, end int64) {
	rp.add(wire.DeviceRecord{Kind: wire.ReportLaunch, Stream: stream, Threads: threads, Start: uint64(start), End: uint64(end), Name: name})
}

// sync records a synchronization of stream taken up at start and
// answered at end.
func (rp *reporter) sync(stream uint32, start, end int64) {
	rp.add(wire.DeviceRecord{Kind: wire.ReportSync, Stream: stream, Start: uint64(start), End: uint64(end)})
}

func (rp *reporter) add(rec wire.DeviceRecord) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.dead {
		return
	}
	rp.batch.Add(rec)
	switch {
	case rp.batch.Len() >= wire.MaxReportRecords:
		rp.sendLocked()
	case rp.batch.Len() > 1:
	case rp.timer == nil:
		rp.timer = time.AfterFunc(reportDelay, rp.flush)
	default:
		rp.timer.Reset(reportDelay)
	}
}

// flush sends what the batch holds.
func (rp *reporter) flush() {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if !rp.dead && rp.batch.Len() > 0 {
		rp.sendLocked()
	}
}

// sendLocked sends the batch without waiting and empties it. rp.mu is
// held.
func (rp *reporter) sendLocked() {
	b := rp.batch.Message(rp.lost)
	n := rp.batch.Len()
	rp.batch.Reset()
	for {
		_, _, errno := syscall.RawSyscall6(syscall.SYS_SENDTO, uintptr(rp.fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
			syscall.MSG_NOSIGNAL|syscall.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			rp.lost = 0
			return
		case syscall.EINTR:
			continue
		case syscall.EAGAIN, syscall.ENOBUFS:
			rp.lost += uint32(n)
			return
		}
		// The server is gone: no one reads this socket any more.
		rp.dead = true
		syscall.Close(rp.fd)
		return
	}
}
