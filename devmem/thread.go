package devmem

import "github.com/softuvm/softuvm/devmem/internal/memsys"

// SetThreadIdlePriority puts the calling thread, which the caller has
// locked (runtime.LockOSThread), at SCHED_IDLE, or at nice 19 where that
// is refused: for work that must never compete with a program's, such
// as the copy engine's calibration.
func SetThreadIdlePriority() error { return memsys.SetThreadIdle() }

// ThreadInvoluntarySwitches counts the calling thread's involuntary
// context switches: a measurement that saw one was preempted.
func ThreadInvoluntarySwitches() int64 { return memsys.ThreadInvoluntarySwitches() }

// MapScratch maps n bytes of private memory, populated up front (a page
// at a time would cost several times more), for buffers kept out of the
// Go heap; free them with UnmapScratch.
func MapScratch(n int) ([]byte, error) { return memsys.MapPopulated(n) }

// UnmapScratch frees memory from MapScratch.
func UnmapScratch(b []byte) error { return memsys.UnmapBytes(b) }
