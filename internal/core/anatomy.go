package core

// FaultAnatomy is the histograms of each stage of the sampled faults.
type FaultAnatomy struct {
	SampleEvery int    `json:"sample_every"`
	Samples     uint64 `json:"samples"`
	// ToServer: from the kernel's fault entry to the server's read of
	// the message (the kernel queuing it and waking a handler).
	ToServer Histogram `json:"to_server"`
	// Sampling: the anatomy's own cost, the handler's two map
	// syscalls between reading the message and deciding (only sampled
	// faults pay it; Total includes it).
	Sampling Histogram `json:"sampling"`
	// Decision: the server's work before the resolving ioctl (locks,
	// policy, reading the source copy).
	Decision Histogram `json:"decision"`
	// Ioctl: the resolving ioctl (UFFDIO_COPY, ZEROPAGE, CONTINUE or
	// WRITEPROTECT), from its first call to its last return, or to the
	// thread running if that came first (a thread woken on another CPU
	// can run before the ioctl returns to the server).
	Ioctl Histogram `json:"ioctl"`
	// Wake: from the ioctl's return to the faulting thread running
	// again (0 when it ran first). The stages add up to Total.
	Wake Histogram `json:"wake"`
	// Total: from the fault entry to the thread running again.
	Total Histogram `json:"total"`
}
