package device

import (
	"fmt"
	"sort"
	"sync"
	"unicode/utf8"

	"github.com/softuvm/softuvm/internal/core"
)

// Kernel is a device kernel: it runs once for each thread index tid in
// [0, nthreads), spread over the device's worker threads, with the launch's
// parameters (copied at launch, as CUDA copies kernel arguments).
type Kernel func(tid, nthreads int, params []byte)

// kernels is the process's registry. The client registers kernels from
// init functions; a device process, a re-execution of the same binary,
// fills its own registry the same way and finds a launch's kernel here.
var kernels struct {
	sync.RWMutex
	byName map[string]Kernel
}

// RegisterKernel makes a kernel launchable by name.
func RegisterKernel(name string, k Kernel) error {
	if err := checkKernelName(name); err != nil {
		return err
	}
	if k == nil {
		return fmt.Errorf("%w: kernel %q: nil function", core.ErrInvalidValue, name)
	}
	if _, dup := LookupGridKernel(name); dup {
		return fmt.Errorf("%w: kernel %q: a grid kernel (RegisterGridKernel) has that name", core.ErrInvalidValue, name)
	}
	kernels.Lock()
	defer kernels.Unlock()
	if kernels.byName == nil {
		kernels.byName = map[string]Kernel{}
	}
	if _, dup := kernels.byName[name]; dup {
		return fmt.Errorf("%w: kernel %q registered twice", core.ErrInvalidValue, name)
	}
	kernels.byName[name] = k
	return nil
}

// checkKernelName checks a kernel's name, of either kind.
func checkKernelName(name string) error {
	if name == "" || len(name) > 256 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: kernel name %q: want 1 to 256 bytes of UTF-8", core.ErrInvalidValue, name)
	}
	if name == EventTimeKernel {
		return fmt.Errorf("%w: kernel %q: the name is the device's built-in event kernel's", core.ErrInvalidValue, name)
	}
	return nil
}

// LookupKernel finds a registered kernel.
func LookupKernel(name string) (Kernel, bool) {
	kernels.RLock()
	defer kernels.RUnlock()
	k, ok := kernels.byName[name]
	return k, ok
}

// KernelNames lists the registered kernels of both kinds (grid kernels
// too: grid.go), sorted.
func KernelNames() []string {
	kernels.RLock()
	names := make([]string, 0, len(kernels.byName))
	for n := range kernels.byName {
		names = append(names, n)
	}
	kernels.RUnlock()
	gridKernels.RLock()
	for n := range gridKernels.byName {
		names = append(names, n)
	}
	gridKernels.RUnlock()
	sort.Strings(names)
	return names
}
