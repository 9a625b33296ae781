package uvm

import (
	"fmt"
	"sort"
	"sync"
	"unicode/utf8"
)

// Kernel is a device kernel: it runs once for each thread index tid in
// [0, nthreads), spread over the device's worker threads, with the launch's
// parameters (copied at launch, as CUDA copies kernel arguments). It sees
// managed memory at the same addresses as the host: pass addresses in
// params and reach them with unsafe.Slice or devmem.BytesAt.
type Kernel func(tid, nthreads int, params []byte)

// MaxKernelParams bounds a launch's parameters, as CUDA bounds kernel
// arguments (4 KiB).
const MaxKernelParams = 4096

var kernels struct {
	sync.RWMutex
	byName map[string]Kernel
}

// RegisterKernel makes a kernel launchable by name. Call it from an init
// function: device processes are re-executions of the program's binary,
// and they find kernels by name in their own registry, which their init
// functions fill the same way.
func RegisterKernel(name string, k Kernel) error {
	if name == "" || len(name) > 256 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: kernel name %q: want 1 to 256 bytes of UTF-8", ErrInvalidValue, name)
	}
	if k == nil {
		return fmt.Errorf("%w: kernel %q: nil function", ErrInvalidValue, name)
	}
	kernels.Lock()
	defer kernels.Unlock()
	if kernels.byName == nil {
		kernels.byName = map[string]Kernel{}
	}
	if _, dup := kernels.byName[name]; dup {
		return fmt.Errorf("%w: kernel %q registered twice", ErrInvalidValue, name)
	}
	kernels.byName[name] = k
	return nil
}

// MustRegisterKernel is RegisterKernel for init functions: it panics on
// error, which there is a programming error.
func MustRegisterKernel(name string, k Kernel) {
	if err := RegisterKernel(name, k); err != nil {
		panic(err)
	}
}

func lookupKernel(name string) (Kernel, bool) {
	kernels.RLock()
	defer kernels.RUnlock()
	k, ok := kernels.byName[name]
	return k, ok
}

// KernelNames lists the registered kernels.
func KernelNames() []string {
	kernels.RLock()
	defer kernels.RUnlock()
	names := make([]string, 0, len(kernels.byName))
	for n := range kernels.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
