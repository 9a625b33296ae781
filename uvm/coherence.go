package uvm

// coherenceBeforeLaunch runs in stream order just before a launch of
// kernel on (d, stream) is written to the device's process. Under the
// launch coherence model it hands the managed memory the kernel may use
// to the device; an error fails the launch.
func (s *Session) coherenceBeforeLaunch(d Device, stream uint32, kernel string) error {
	return nil
}

// coherenceAfterSync runs once the client knows that every launch queued
// on (d, stream) (stream wire.AllStreams: on every stream of d) has
// finished. Under the launch coherence model it gives the CPU its access
// back to what those kernels could use.
func (s *Session) coherenceAfterSync(d Device, stream uint32) error {
	return nil
}
