package config

// The managed window is where clients place managed ranges: device
// processes reserve all of it at start, before anything else is mapped,
// so that every address a client uses is free in them too. A fresh process
// maps downwards from just under 128 TiB and never gets near it.
const (
	ManagedWindowStart = 0x6000_0000_0000
	ManagedWindowSize  = 0x1000_0000_0000 // 16 TiB
)

const (
	DeviceEnv        = "SOFTUVM_DEVICE"
	DeviceWorkersEnv = "SOFTUVM_DEVICE_WORKERS"
)
