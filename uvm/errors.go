package uvm

import "errors"

// Errors of the runtime beyond those vocabulary.go shares with the
// server, after the CUDA runtime's error codes. Every error a function
// returns wraps exactly one class (test with errors.Is), and its message
// names the offending value.
var (
	// ErrInvalidDevicePointer (cudaErrorInvalidDevicePointer, 17): a
	// pointer that no allocation of this session holds.
	ErrInvalidDevicePointer = errors.New("invalid device pointer")
	// ErrPeerAccessAlreadyEnabled (cudaErrorPeerAccessAlreadyEnabled,
	// 704): DeviceEnablePeerAccess of a peer already enabled.
	ErrPeerAccessAlreadyEnabled = errors.New("peer access is already enabled")
	// ErrPeerAccessNotEnabled (cudaErrorPeerAccessNotEnabled, 705):
	// DeviceDisablePeerAccess of a peer never enabled.
	ErrPeerAccessNotEnabled = errors.New("peer access has not been enabled")
	// ErrNotReady (cudaErrorNotReady, 600): the work asked about has not
	// finished yet. EventQuery and EventElapsedTime return it; it is a
	// state, not a failure.
	ErrNotReady = errors.New("device not ready")
	// ErrInvalidResourceHandle (cudaErrorInvalidResourceHandle, 400): an
	// event that was destroyed, belongs to another session, or cannot
	// answer what is asked of it (the elapsed time of an event created
	// with EventDisableTiming, or never recorded).
	ErrInvalidResourceHandle = errors.New("invalid resource handle")
)
