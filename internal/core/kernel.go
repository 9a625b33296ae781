package core

// MaxKernelParams bounds a launch's parameters, as CUDA bounds kernel
// arguments (4 KiB).
const MaxKernelParams = 4096
