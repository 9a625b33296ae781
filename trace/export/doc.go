// Package export writes softuvm traces (package trace) in formats other
// tools read: Chrome trace-event JSON for a timeline, and CSV for a
// spreadsheet, pandas or SQL. `uvm trace export` is its command.
//
// # Perfetto
//
// Perfetto and PerfettoFrom write the trace-event "JSON Object Format"
// ({"traceEvents":[...],"displayTimeUnit":"ns","metadata":{...}}). Open
// the file at https://ui.perfetto.dev ("Open trace file", or drop it on
// the page; nothing leaves the browser), or in chrome://tracing ("Load").
// Times are microseconds with the nanoseconds as decimals, the format's
// unit. The timeline reads like Nsight Systems' unified-memory rows. A
// process per processor, "cpu" and "device N", has these rows
// (threads):
//
//   - "faults, thread T": a slice per fault of client thread T on the
//     processor, from its reading to its resolution, named by access and
//     kind ("write fault (missing)"), its args the address, pages
//     prefetched, client pid, thread and allocation.
//   - "migrations in": a slice per migration to the processor, for its
//     copy, named by cause and source ("prefetch from cpu").
//   - "evictions", "populate", "remote maps", "duplicates in": an instant
//     per event (they take no time of their own), with pages, bytes and
//     address.
//   - "launches": an instant per kernel launch, named by the kernel.
//   - "syncs": a slice per synchronization, for the caller's wait.
//   - a counter, "migration bandwidth MB/s from P": the bytes that came
//     from P per 10 ms (a migration counts whole in the bin it began in).
//
// Besides:
//
//   - a process "allocations", a row per allocation, its slice from the
//     allocation to its free (or the trace's end), named by address and
//     size.
//   - a process "clients", a row per client process, its slice the
//     session, named by its command.
//   - an arrow (a flow) from each fault to each migration with cause
//     fault. The trace does not say which fault a migration served, so
//     the export guesses: the latest fault (by time; the last written
//     among equal times) at or before the migration's start, of the
//     same client pid and allocation (Range), in the same 2 MiB block
//     (Addr>>21), on the processor the pages went to (Processor ==
//     To). When two threads of one processor fault in a block at once,
//     the arrow may start at the other thread's fault; a migration with
//     no such fault has no arrow.
//   - "metadata": the trace's header, the events read and the events
//     the recorder dropped.
//
// Slices that overlap on one row must nest, so a row whose slices
// overlap (several synchronizations at once, migrations to one device
// copied in parallel) becomes several, "syncs", "syncs (2)", ....
//
// # CSV
//
// CSV and CSVFrom write a header row (Columns), then a row per event in
// the trace's order (not quite time order: see trace.Event.Time).
// Processors are "cpu" and "device N", addresses hexadecimal, times and
// durations nanoseconds; a cell is empty where the column means nothing
// for the row's kind (see trace.Kind's constants). bytes is an
// allocation's length, or the bytes of the pages a migration, eviction,
// population, remote mapping or duplication covers.
//
// The From variants read a trace.Reader one event at a time, for traces
// too large to hold; the others take the events trace.ReadFile returns.
package export
