package bench

import (
	"os"
	"runtime"
	"strings"
)

// Machine is what every report says of the machine it was measured on.
type Machine struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
}

// ThisMachine describes the machine this process runs on.
func ThisMachine() Machine {
	return Machine{CPUs: cpus(), Kernel: kernelRelease(), Go: runtime.Version()}
}

func cpus() int { return runtime.NumCPU() }

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// thpSetting returns the selected value of a setting of the kind of
// transparent huge pages' ("always [madvise] never" gives "madvise"), or
// "unknown".
func thpSetting(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	text := string(b)
	if i, j := strings.IndexByte(text, '['), strings.IndexByte(text, ']'); i >= 0 && j > i {
		return text[i+1 : j]
	}
	return strings.TrimSpace(text)
}
