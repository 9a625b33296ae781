package policy

// ThresholdMigration is NVIDIA's access-counter migration
// (uvm_perf_access_counters.c): a region whose count for a processor
// reaches the threshold migrates to that processor, except where it would
// undo a choice made elsewhere. Only pages the processor maps remotely
// move (it reaches them where they lie because of accessed-by advice or a
// pin; a page it faults on migrates already), and neither a thrashing pin
// nor a preferred location elsewhere is overridden.
type ThresholdMigration struct{}

func (ThresholdMigration) Name() string { return DefaultAccessMigration }

func (ThresholdMigration) Movable(p AccessPage) bool {
	return !p.Resident && p.Remote && !p.Pinned && !p.PreferredElsewhere
}
