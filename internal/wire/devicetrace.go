package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/softuvm/softuvm/internal/core"
)

// Launches and synchronizations in traces under the fault coherence
// model. They go from the client straight to the device process, never
// through the server, so a device process of a traced session reports
// them: the server opens its connection to the process with a
// device-trace notice (the first message the process reads there, before
// the device hello's reply, and only when the session is traced), which
// carries one end of a socket of its own; the process sends batches of
// records (device-report) on it, without replies, and the server turns
// each record into a trace event. The report socket is the server's
// alone: no guard holds it, so when the server dies the process learns
// it from its next send and stops reporting, and a server that takes the
// session over never sees a report on the connection it adopts.

// DeviceTraceNotice says what a device process reports. It carries the
// report socket.
type DeviceTraceNotice struct {
	Flags uint32 // TraceLaunches
}

// TraceLaunches asks for every kernel the process runs and every
// synchronization it answers.
const TraceLaunches = 1

// ReportKind says what a record of a device report is.
type ReportKind uint8

const (
	// ReportLaunch is a kernel run: Stream, Threads, Name, Start (when
	// it started) and End (when its last thread finished).
	ReportLaunch ReportKind = 1
	// ReportSync is a synchronization answered: Stream, Start (when the
	// process took it up, every kernel before it on the stream done) and
	// End (when it answered).
	ReportSync ReportKind = 2
)

// Bounds of a device report: a process sends its batch when it holds
// MaxReportRecords records (or a few milliseconds after its first, when
// a stream ends and when the process ends), and a kernel's name is cut
// to MaxReportName bytes (Go kernel names are at most 256, C ones "c:0x"
// and an address), so that a report is at most a few tens of KiB.
const (
	MaxReportRecords = 64
	MaxReportName    = 256
)

// DeviceRecord is one record of a device report. Times are
// CLOCK_MONOTONIC nanoseconds, the clock of the process's machine,
// which the server shares.
type DeviceRecord struct {
	Kind       ReportKind
	Stream     uint32
	Threads    uint32 // a launch's; 0 for a synchronization
	Start, End uint64
	Name       string // a launch's kernel; "" for a synchronization
}

// DeviceReport is a batch of records, and how many records the process
// dropped since its last report because the socket was full (it never
// waits for the server).
type DeviceReport struct {
	Lost    uint32
	Records []DeviceRecord
}

func init() {
	requestDecoders[MsgDeviceTrace] = func(r *WireReader) any {
		n := DeviceTraceNotice{Flags: r.u32("flags")}
		if r.err == nil && n.Flags&^TraceLaunches != 0 {
			r.err = fmt.Errorf("%w: device-trace flags %#x: want %#x (launches and synchronizations)", core.ErrInvalidValue, n.Flags, TraceLaunches)
		}
		return n
	}
	requestDecoders[MsgDeviceReport] = func(r *WireReader) any {
		rep := DeviceReport{Lost: r.u32("lost records")}
		n := r.u32("record count")
		if r.err == nil && n > MaxReportRecords {
			r.err = fmt.Errorf("%w: a device report of %d records: at most %d", core.ErrInvalidValue, n, MaxReportRecords)
		}
		for i := uint32(0); i < n && r.err == nil; i++ {
			rec := DeviceRecord{Kind: ReportKind(r.u8("record kind")), Stream: r.u32("stream"), Threads: r.u32("threads"),
				Start: r.U64("start"), End: r.U64("end"), Name: r.Str("kernel name")}
			switch {
			case r.err != nil:
			case rec.Kind != ReportLaunch && rec.Kind != ReportSync:
				r.err = fmt.Errorf("%w: device report record %d of kind %d: want %d (launch) or %d (synchronization)", core.ErrInvalidValue, i, rec.Kind, ReportLaunch, ReportSync)
			case rec.End < rec.Start:
				r.err = fmt.Errorf("%w: device report record %d ends at %d, before its start %d", core.ErrInvalidValue, i, rec.End, rec.Start)
			case len(rec.Name) > MaxReportName:
				r.err = fmt.Errorf("%w: device report record %d names a kernel of %d bytes: at most %d", core.ErrInvalidValue, i, len(rec.Name), MaxReportName)
			case rec.Kind == ReportLaunch && (rec.Threads == 0 || rec.Threads > MaxLaunchThreads):
				r.err = fmt.Errorf("%w: device report record %d: a launch of %d threads, want 1 to %d", core.ErrInvalidValue, i, rec.Threads, MaxLaunchThreads)
			case rec.Kind == ReportSync && (rec.Threads != 0 || rec.Name != ""):
				r.err = fmt.Errorf("%w: device report record %d: a synchronization with threads or a name", core.ErrInvalidValue, i)
			}
			rep.Records = append(rep.Records, rec)
		}
		return rep
	}
}

// EncodeDeviceTrace writes a device-trace notice (sequence 0: it asks
// for no reply).
func EncodeDeviceTrace(n DeviceTraceNotice) []byte {
	w := NewMessage(Header{Typ: MsgDeviceTrace})
	w.u32(n.Flags)
	return w.B
}

// EncodeDeviceReport writes a device report (sequence 0: no reply).
func EncodeDeviceReport(rep DeviceReport) []byte {
	var b ReportBatch
	for _, rec := range rep.Records {
		b.Add(rec)
	}
	return b.Message(rep.Lost)
}

// ReportBatch builds a device report in place, a record at a time, with
// no allocation once its buffer has grown: a device process adds each
// record as it happens and sends Message when the batch is due.
type ReportBatch struct {
	b []byte
	n uint32
}

// reportCounts is where a report's lost and record counts lie.
const reportCounts = wireHeaderSize

// Add appends rec, its name cut to MaxReportName bytes (on a rune
// boundary, so that it stays UTF-8).
func (rb *ReportBatch) Add(rec DeviceRecord) {
	if len(rb.b) == 0 {
		w := NewMessage(Header{Typ: MsgDeviceReport})
		rb.b = append(rb.b[:0], w.B...)
		rb.b = append(rb.b, make([]byte, 8)...) // lost, count: Message fills them in
	}
	name := rec.Name
	if len(name) > MaxReportName {
		cut := MaxReportName
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		name = name[:cut]
	}
	w := wireWriter{B: rb.b}
	w.u8(uint8(rec.Kind))
	w.u32(rec.Stream)
	w.u32(rec.Threads)
	w.u64(rec.Start)
	w.u64(rec.End)
	w.str(name)
	rb.b = w.B
	rb.n++
}

// Len is the records in the batch.
func (rb *ReportBatch) Len() int { return int(rb.n) }

// Message returns the batch as a report with lost, valid until the next
// Add or Reset.
func (rb *ReportBatch) Message(lost uint32) []byte {
	if len(rb.b) == 0 {
		rb.b = append(rb.b[:0], NewMessage(Header{Typ: MsgDeviceReport}).B...)
		rb.b = append(rb.b, make([]byte, 8)...)
	}
	binary.LittleEndian.PutUint32(rb.b[reportCounts:], lost)
	binary.LittleEndian.PutUint32(rb.b[reportCounts+4:], rb.n)
	return rb.b
}

// Reset empties the batch, keeping its buffer.
func (rb *ReportBatch) Reset() { rb.b, rb.n = rb.b[:0], 0 }
