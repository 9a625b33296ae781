package uvm

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
)

// Kernel is a device kernel: it runs once for each thread index tid in
// [0, nthreads), spread over the device's worker threads, with the launch's
// parameters (copied at launch, as CUDA copies kernel arguments). It sees
// managed memory at the same addresses as the host: pass addresses in
// params and reach them with SliceAt (or devmem.BytesAt). A TypedKernel
// (RegisterTypedKernel) receives its parameters as a Go value instead of
// bytes, and LaunchTyped launches it with one.
type Kernel func(tid, nthreads int, params []byte)

// MaxKernelParams bounds a launch's parameters, as CUDA bounds kernel
// arguments (4 KiB).
const MaxKernelParams = core.MaxKernelParams

// RegisterKernel makes a kernel launchable by name. Call it from an init
// function: device processes are re-executions of the program's binary,
// and they find kernels by name in their own registry, which their init
// functions fill the same way.
func RegisterKernel(name string, k Kernel) error {
	var dk device.Kernel
	if k != nil {
		dk = device.Kernel(k)
	}
	return device.RegisterKernel(name, dk)
}

// MustRegisterKernel is RegisterKernel for init functions: it panics on
// error, which there is a programming error.
func MustRegisterKernel(name string, k Kernel) {
	if err := RegisterKernel(name, k); err != nil {
		panic(err)
	}
}

// KernelNames lists the registered kernels, grid kernels included.
func KernelNames() []string { return device.KernelNames() }
