package device

import "testing"

// TestLaunchCPUHint: a launch's Cpu field says the client's CPU and
// whether it polls, and older meanings keep theirs.
func TestLaunchCPUHint(t *testing.T) {
	for _, tc := range []struct {
		cpu     int
		polling bool
		field   int32
	}{{0, false, 0}, {5, false, 5}, {0, true, -2}, {5, true, -7}, {-1, false, -1}, {-1, true, -1}} {
		if got := LaunchCPUHint(tc.cpu, tc.polling); got != tc.field {
			t.Errorf("LaunchCPUHint(%d, %v) = %d, want %d", tc.cpu, tc.polling, got, tc.field)
		}
		cpu, polling := cpuOfHint(tc.field)
		if tc.cpu < 0 {
			if cpu != -1 || polling {
				t.Errorf("cpuOfHint(%d) = %d, %v, want -1, false", tc.field, cpu, polling)
			}
			continue
		}
		if cpu != tc.cpu || polling != tc.polling {
			t.Errorf("cpuOfHint(%d) = %d, %v, want %d, %v", tc.field, cpu, polling, tc.cpu, tc.polling)
		}
	}
}
