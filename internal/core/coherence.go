package core

import "fmt"

// Coherence is how the host and the devices share managed memory.
type Coherence uint8

const (
	// CoherenceDefault asks for the server's model (in a hello), or
	// means the fault model (in a configuration).
	CoherenceDefault Coherence = iota
	// CoherenceFault is the model of GPUs that fault (compute capability
	// 6.0 on): every processor may touch managed memory at any time and
	// pages move on demand.
	CoherenceFault
	// CoherenceLaunch is the model of GPUs that cannot fault: at a launch
	// the pages the CPU wrote go to the device and the CPU loses access
	// to what the kernel may use until it synchronizes; pages come back
	// to the CPU by fault, each as a copy that the device keeps.
	CoherenceLaunch
)

// ParseCoherence reads "fault" or "launch" ("" is the default).
func ParseCoherence(s string) (Coherence, error) {
	switch s {
	case "":
		return CoherenceDefault, nil
	case "fault":
		return CoherenceFault, nil
	case "launch":
		return CoherenceLaunch, nil
	}
	return 0, fmt.Errorf("%w: coherence model %q: want fault or launch", ErrInvalidValue, s)
}

func (c Coherence) String() string {
	switch c {
	case CoherenceDefault, CoherenceFault:
		return "fault"
	case CoherenceLaunch:
		return "launch"
	}
	return fmt.Sprintf("coherence(%d)", uint8(c))
}

// MarshalText writes the model's name, for JSON configurations.
func (c Coherence) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads a model's name.
func (c *Coherence) UnmarshalText(b []byte) error {
	v, err := ParseCoherence(string(b))
	if err == nil {
		*c = v
	}
	return err
}

// DirtyTracking is how the launch model learns which pages the CPU wrote.
type DirtyTracking string

const (
	// DirtyAuto uses DirtyAsync where the kernel has it, else DirtyFault.
	DirtyAuto DirtyTracking = ""
	// DirtyAsync: the host view's userfaultfd has WP_ASYNC, the kernel
	// clears a page's write protection at its first write without a
	// fault message, and the server reads the written pages with
	// PAGEMAP_SCAN at launch.
	DirtyAsync DirtyTracking = "wp-async"
	// DirtyFault: the first write to each protected page is a
	// write-protect fault that the server serves by recording the page
	// and lifting the protection.
	DirtyFault DirtyTracking = "wp-fault"
)

// ParseDirtyTracking reads auto, wp-async or wp-fault.
func ParseDirtyTracking(s string) (DirtyTracking, error) {
	switch s {
	case "", "auto":
		return DirtyAuto, nil
	case string(DirtyAsync), string(DirtyFault):
		return DirtyTracking(s), nil
	}
	return "", fmt.Errorf("%w: dirty tracking %q: want auto, %s or %s", ErrInvalidValue, s, DirtyAsync, DirtyFault)
}

// AttachMode is a managed allocation's stream attachment
// (cudaStreamAttachMemAsync), which the launch model reads.
type AttachMode uint32

// The values are CUDA's flags.
const (
	AttachGlobal AttachMode = 0x01 // every stream's launches may use it
	AttachHost   AttachMode = 0x02 // no launch uses it: the CPU may always touch it
	AttachSingle AttachMode = 0x04 // only the launches of one stream use it
)

func (a AttachMode) String() string {
	switch a {
	case AttachGlobal:
		return "global"
	case AttachHost:
		return "host"
	case AttachSingle:
		return "single"
	}
	return fmt.Sprintf("attach(%#x)", uint32(a))
}
