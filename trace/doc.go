// Package trace records and reads softuvm's traces: every fault the
// server serves, every migration (with its cause), eviction, population,
// remote mapping and read duplication, every launch, synchronization,
// allocation and free, each with the time it happened.
//
// The server records with a Recorder (uvm serve --trace, uvm run
// --trace, uvm trace record, UVM_TRACE for one client); anyone reads
// with a Reader:
//
//	r, err := trace.Open("run.uvmtrace")
//	...
//	var e trace.Event
//	for r.Next(&e) == nil {
//		if e.Kind == trace.KindFault { ... }
//	}
//
// Summarize reads a trace through once and sums it up: events by kind,
// faults by processor with their service times, pages moved by direction
// and cause (uvm trace summary).
//
// The format is compact (a record is a kind byte and varints: about 12
// bytes a fault) and versioned; format.go gives its grammar and
// docs/traces.md its schema for readers in other languages. Recording
// encodes an event into memory under a short lock; a background writer
// writes it, and drops (and counts) events rather than hold a fault up
// when the disk cannot keep pace. Subpackages export traces (Perfetto,
// CSV) and draw them.
package trace
