// Package engine is softuvm's copy engine, after "Multithreaded Double
// Queuing for Balanced CPU-GPU Memory Copying" (SAC'19): every bulk move
// of the server (migrations: faults with their prefetch, Prefetch,
// eviction, thrashing pins, read duplication) and every Memcpy and Memset
// of the client goes through a CopyEngine.
//
// A move is a CopyJob cut into chunks that pass through up to three
// stages: produce on N_P producer goroutines (copy into a staging buffer,
// or straight into the destination), release on one releaser goroutine
// (punch the source), and install on the job's own goroutine, in chunk
// order. A chunk's source is released before it is installed. Jobs below
// a calibrated size take the direct path, every stage on the caller's
// goroutine. Where the destination is a NUMA arena, the producers run on
// its node's CPUs.
//
// Calibration measures this machine once per boot (memcpy with 1, 2, 4,
// ... threads, writes into new memfd pages, non-temporal stores, the
// engine's hand-off cost, migrations with and without the pipeline) and
// chooses N_P from the paper's two conditions, the block movers, and the
// sizes from which the engine and non-temporal stores pay; the result,
// config.CopyCalibration, is kept in the runtime directory for later
// servers. Nothing waits for it: until it is measured (in the background,
// at SCHED_IDLE, while the CPUs are idle) callers get defaults chosen
// from the CPU count, marked as such in its Source. CopyNonTemporal copies with MOVNTDQ stores on amd64
// (ntcopy_amd64.s), ordinary ones elsewhere. docs/architecture.md
// describes the engine; docs/benchmarks.md has its figures.
package engine
