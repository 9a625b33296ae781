// Package core is the vocabulary every other package of softuvm shares:
// the public client (package uvm), the policies, the server, the device
// runtime and the wire protocol all speak of processors, pages and
// statistics in these types, so that a value crosses no conversion.
//
//   - Processors: Device names a processor (CPU, -1, for
//     the host, or a device index from 0), the one encoding of a
//     processor in the API, the policies, the server and on the wire.
//     Tables with an entry per processor are indexed by Device.Slot (0
//     for the CPU, 1+i for device i); per-page tables pack an optional
//     processor in a byte as a PageProcessor (zero: none).
//     DeviceInfo describes a configured device.
//   - Pages and blocks: PageSize (4 KiB), BlockSize (2 MiB, the unit
//     whose lock serializes every residency decision), PagesPerBlock, and
//     PageMask, a set of pages of one block.
//   - Memory: RangeKind (managed, device, pinned host), Advice
//     (cuMemAdvise), RangeAttr and RangeAttributes
//     (cuMemRangeGetAttribute), the attachment flags, MaxAllocation,
//     MaxKernelParams, and the userfaultfd features and registration mode
//     the server needs (RequiredFeatures, HostViewMode).
//   - Errors: the error classes after CUDA's error codes
//     (ErrInvalidValue, ErrMemoryAllocation, ErrServerGone, ...); every
//     error softuvm returns wraps exactly one, so callers and the C
//     library classify with errors.Is while the message names the value.
//   - Statistics: Counters, updated with atomics from the fault path so
//     that readers never stop it; Stats, the snapshot `uvm stat` and the
//     API report; LiveHistogram and Histogram (buckets four per power of
//     two, within 19% of the truth); FaultAnatomy.
//   - Plain data helpers: ParseSize and FormatSize, Duration (a
//     time.Duration JSON carries).
//
// core imports nothing of softuvm but uffd, and holds no behaviour
// beyond these types: it is the bottom of the import order described in
// docs/architecture.md.
package core
