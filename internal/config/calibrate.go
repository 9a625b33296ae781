package config

import (
	"math"

	"github.com/softuvm/softuvm/internal/core"
)

// CopyCalibration is what the copy engine measured of this machine, once
// per boot, and the parameters it chose from it; until that is measured,
// the defaults it copies with (Source says which).
type CopyCalibration struct {
	CPUs int `json:"cpus"`
	// HostCopyGBps is S_H2B: one thread copying between warm buffers.
	HostCopyGBps float64 `json:"host_copy_gbps"`
	// AllCopyGBps is every CPU copying at once, together.
	AllCopyGBps float64 `json:"all_copy_gbps"`
	// MemoryGBps is B_MEM: the bytes memory moves while every CPU copies
	// (each copied byte is read once and written once).
	MemoryGBps float64 `json:"memory_gbps"`
	// InstallGBps is S_B2D for migrations: writing into new pages of a
	// file, which allocates them, as every migration's install step does.
	InstallGBps float64 `json:"install_gbps"`
	// NonTemporalGBps is one thread copying a buffer larger than the
	// caches with non-temporal stores (0 where there are none).
	NonTemporalGBps float64 `json:"non_temporal_gbps"`
	// MigrationProducers is N_P for migrations (see producersFor).
	MigrationProducers int `json:"migration_producers"`
	// CopyProducers is N_P for copies straight into existing pages
	// (Memcpy), which have no install step (copyProducersFor).
	CopyProducers int `json:"copy_producers"`
	// CopyThreadsGBps are copy rates with 1, 2, 4, ... threads and with
	// every CPU, together.
	CopyThreadsGBps []float64 `json:"copy_threads_gbps"`
	// BlockMovers is how many blocks a move of many blocks (Prefetch)
	// moves at once, each on its own goroutine doing every stage of its
	// block. Installing allocates new pages, which every CPU does for
	// itself, so the install stage is no single link to keep busy: each
	// mover is a producer that installs what it copies, and the paper's
	// second condition, N * 2 * S_B2D <= B_MEM, bounds how many, up to
	// the CPUs (blockMoversFor).
	BlockMovers int `json:"block_movers"`
	// BlockMoversGBps are the rates measured with 1, 2, ... movers, for
	// the record: a busy machine (a client writing its data while its
	// private server starts) skews them too much to choose from.
	BlockMoversGBps []float64 `json:"block_movers_gbps"`
	// DirectBelow is the move size under which the engine is not used:
	// the smallest migration size from which the engine beat one thread
	// by 10% at every size up to a block, or MaxInt64 when it did not at
	// a block.
	DirectBelow int64 `json:"direct_below"`
	// CopyDirectBelow is the copy size under which Memcpy copies on one
	// thread: where one thread's copy takes 20 times the engine's
	// hand-offs (calibrateCopy); MaxInt64 with one producer.
	CopyDirectBelow int64 `json:"copy_direct_below"`
	// HandOffUS is the engine's fixed cost of a copy: handing its chunks
	// to the producers and waiting for them, the median of many.
	HandOffUS float64 `json:"hand_off_us"`
	// NonTemporalAbove is the copy size from which Memcpy uses
	// non-temporal stores into destinations it does not read back; 0 when
	// they are not faster here.
	NonTemporalAbove int64 `json:"non_temporal_above"`
	// Took is how long calibrating took, in nanoseconds.
	Took core.Duration `json:"took_ns"`
	// Kept names the file this calibration was read from, if it was
	// measured by an earlier server since boot.
	Kept string `json:"kept,omitempty"`
	// Source says where the figures in use come from: "measured" (by
	// this server), "kept PATH" (measured by an earlier server since
	// boot), "defaults (measuring in the background)" until this
	// server's measurement is done, or "defaults (REASON)" where it
	// failed. Defaults are chosen from the CPU count; their rates are 0.
	Source string `json:"source,omitempty"`
	Err    string `json:"error,omitempty"`
}

// FormatDirectBelow names the size from which the copy engine is used,
// a DirectBelow or CopyDirectBelow, for uvm info and uvm bench memcpy.
func FormatDirectBelow(n int64) string {
	if n == math.MaxInt64 {
		return "never (one thread was faster at every size calibrated)"
	}
	return core.FormatSize(n)
}
