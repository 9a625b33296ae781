package trace

import (
	"errors"
	"io"
	"os"
	"slices"
	"sort"
	"time"
)

// Summary is what a trace holds, read through once (Summarize): `uvm
// trace summary` prints it (its JSON is what --json prints), and `uvm
// bench faults` reads the size of a recording per fault from it.
type Summary struct {
	File     string         `json:"file"`
	Header   Header         `json:"header"`
	Events   uint64         `json:"events"`
	Dropped  uint64         `json:"dropped"`
	Bytes    int64          `json:"bytes"`
	Span     time.Duration  `json:"span_ns"`
	ByKind   map[string]int `json:"by_kind"`
	Faults   []FaultSummary `json:"faults"`
	Moves    []MoveSummary  `json:"migrations"`
	Evicted  map[string]int `json:"evicted_pages,omitempty"`
	Populate map[string]int `json:"populated_pages,omitempty"`
	Sessions int            `json:"sessions"`
	Allocs   int            `json:"allocations"`
	// CutShort says why the trace ends early, where its recorder did not
	// close it: the summary is of the events before that.
	CutShort string `json:"cut_short,omitempty"`
	// Access is the access mode's record by processor, where it was on.
	Access []AccessSummary `json:"access,omitempty"`
	// BytesPerMillionFaults is the trace's size per million faults.
	BytesPerMillionFaults float64 `json:"bytes_per_million_faults,omitempty"`
}

// FaultSummary counts one processor's faults by kind, with the median
// and 99th percentile of their service times.
type FaultSummary struct {
	Processor    string  `json:"processor"`
	Missing      int     `json:"missing"`
	Minor        int     `json:"minor"`
	WriteProtect int     `json:"write_protect"`
	P50US        float64 `json:"service_p50_us"`
	P99US        float64 `json:"service_p99_us"`
}

// AccessSummary sums up what the access mode saw of one processor: the
// rounds that armed it, the pages armed in all, and those of them found
// touched by the round after (Touched is their fraction).
type AccessSummary struct {
	Processor string  `json:"processor"`
	Rounds    int     `json:"rounds"`
	Armed     uint64  `json:"armed_pages"`
	Accessed  uint64  `json:"accessed_pages"`
	Touched   float64 `json:"touched_fraction"`
}

// MoveSummary sums up the migrations of one direction and cause.
type MoveSummary struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Cause string `json:"cause"`
	Runs  int    `json:"runs"`
	Pages uint64 `json:"pages"`
	Bytes uint64 `json:"bytes"`
	// GBps is the bytes over the runs' summed copy time.
	GBps float64 `json:"gb_per_s"`
}

// TotalFaults counts the faults of every kind on every processor.
func (s *Summary) TotalFaults() int {
	n := 0
	for _, f := range s.Faults {
		n += f.Missing + f.Minor + f.WriteProtect
	}
	return n
}

// TotalMigrations counts the migrations.
func (s *Summary) TotalMigrations() int { return s.ByKind[KindMigration.String()] }

// Summarize reads the trace at path through once and sums it up. A
// trace cut short (its recorder killed) is summed up to its last whole
// event, with CutShort saying so.
func Summarize(path string) (*Summary, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	sum := newSumming(path, r.Header())
	if err := sum.readAll(r); err != nil {
		return sum.s, err
	}
	sum.s.Dropped = r.Dropped()
	sum.finish()
	if fi, err := os.Stat(path); err == nil {
		sum.s.Bytes = fi.Size()
	}
	if n := sum.s.TotalFaults(); n > 0 {
		sum.s.BytesPerMillionFaults = float64(sum.s.Bytes) / float64(n) * 1e6
	}
	return sum.s, nil
}

// moveKey is what migrations are summed up by.
type moveKey struct {
	from, to int32
	cause    Cause
}

// summing is a Summary being read: the counts kept by processor and by
// direction until finish writes them out in order.
type summing struct {
	s           *Summary
	faults      map[int32]*FaultSummary
	service     map[int32][]time.Duration
	moves       map[moveKey]*MoveSummary
	took        map[moveKey]time.Duration
	access      map[int32]*AccessSummary
	lastArm     map[int32]time.Duration // the time of the processor's last arming round
	first, last time.Duration
}

func newSumming(path string, h Header) *summing {
	return &summing{
		s:      &Summary{File: path, Header: h, ByKind: map[string]int{}, Evicted: map[string]int{}, Populate: map[string]int{}},
		faults: map[int32]*FaultSummary{}, service: map[int32][]time.Duration{},
		moves: map[moveKey]*MoveSummary{}, took: map[moveKey]time.Duration{},
		access: map[int32]*AccessSummary{}, lastArm: map[int32]time.Duration{},
	}
}

// readAll adds every event of r.
func (m *summing) readAll(r *Reader) error {
	var e Event
	for {
		err := r.Next(&e)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if errors.Is(err, io.ErrUnexpectedEOF) && m.s.Events > 0 {
			// Its recorder was killed: what it wrote is still worth
			// summing up.
			m.s.CutShort = err.Error()
			return nil
		}
		if err != nil {
			return err
		}
		m.add(&e)
	}
}

// add counts one event.
func (m *summing) add(e *Event) {
	s := m.s
	if s.Events == 0 || e.Time < m.first {
		m.first = e.Time
	}
	if e.Kind == KindAccess {
		m.last = max(m.last, e.Time) // its Duration is the window before
	} else {
		m.last = max(m.last, e.Time+max(e.Duration, 0))
	}
	s.Events++
	s.ByKind[e.Kind.String()]++
	switch e.Kind {
	case KindFault:
		m.addFault(e)
	case KindMigration:
		m.addMigration(e)
	case KindEviction:
		s.Evicted[ProcessorName(e.From)] += int(e.Pages)
	case KindPopulate:
		s.Populate[ProcessorName(e.To)] += int(e.Pages)
	case KindSession:
		s.Sessions++
	case KindAlloc:
		s.Allocs++
	case KindArm:
		a := m.accessOf(e.Processor)
		if m.lastArm[e.Processor] != e.Time { // a round's runs share its time
			a.Rounds++
			m.lastArm[e.Processor] = e.Time
		}
		a.Armed += uint64(e.Pages)
	case KindAccess:
		m.accessOf(e.Processor).Accessed += uint64(e.Pages)
	}
}

func (m *summing) addFault(e *Event) {
	f := m.faults[e.Processor]
	if f == nil {
		f = &FaultSummary{Processor: ProcessorName(e.Processor)}
		m.faults[e.Processor] = f
	}
	switch e.FaultKind {
	case FaultMinor:
		f.Minor++
	case FaultWP:
		f.WriteProtect++
	default:
		f.Missing++
	}
	m.service[e.Processor] = append(m.service[e.Processor], e.Duration)
}

func (m *summing) addMigration(e *Event) {
	k := moveKey{e.From, e.To, e.Cause}
	mv := m.moves[k]
	if mv == nil {
		mv = &MoveSummary{From: ProcessorName(e.From), To: ProcessorName(e.To), Cause: e.Cause.String()}
		m.moves[k] = mv
	}
	mv.Runs++
	mv.Pages += uint64(e.Pages)
	mv.Bytes += e.MovedBytes()
	m.took[k] += e.Duration
}

func (m *summing) accessOf(p int32) *AccessSummary {
	a := m.access[p]
	if a == nil {
		a = &AccessSummary{Processor: ProcessorName(p)}
		m.access[p] = a
		m.lastArm[p] = -1
	}
	return a
}

// finish writes the counts kept by processor and direction into the
// Summary, sorted by processor (and direction and cause), with the
// fault service times' percentiles and the copies' rates.
func (m *summing) finish() {
	s := m.s
	for _, a := range m.access {
		if a.Armed > 0 {
			a.Touched = float64(a.Accessed) / float64(a.Armed)
		}
		s.Access = append(s.Access, *a)
	}
	sort.Slice(s.Access, func(i, j int) bool { return s.Access[i].Processor < s.Access[j].Processor })
	s.Span = m.last - m.first
	for p, f := range m.faults {
		d := m.service[p]
		slices.Sort(d)
		f.P50US = float64(d[len(d)/2]) / 1e3
		f.P99US = float64(d[min(len(d)-1, len(d)*99/100)]) / 1e3
		s.Faults = append(s.Faults, *f)
	}
	sort.Slice(s.Faults, func(i, j int) bool { return s.Faults[i].Processor < s.Faults[j].Processor })
	for k, mv := range m.moves {
		if t := m.took[k]; t > 0 {
			mv.GBps = float64(mv.Bytes) / t.Seconds() / 1e9
		}
		s.Moves = append(s.Moves, *mv)
	}
	sort.Slice(s.Moves, func(i, j int) bool {
		a, b := s.Moves[i], s.Moves[j]
		if a.From != b.From {
			return a.From < b.From
		}
		if a.To != b.To {
			return a.To < b.To
		}
		return a.Cause < b.Cause
	})
}
