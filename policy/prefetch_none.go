package policy

// NoPrefetch migrates only the pages that faulted.
type NoPrefetch struct{}

func (NoPrefetch) Name() string { return "none" }

func (NoPrefetch) Expand(*PrefetchContext) (m PageMask) { return m }
