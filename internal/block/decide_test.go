package block

import (
	"testing"

	"github.com/softuvm/softuvm/internal/core"
)

// fakeFacts answers the decision step from fields, and records which
// facts it was asked: the thrashing policy must be consulted only where a
// migration would follow.
type fakeFacts struct {
	deviceMemoryOnHost bool
	faultKind          core.FaultKind
	isWrite, lastWait  bool
	napped             bool
	m                  core.Device
	unknown            bool // the view's mapping is changing
	ownHolds           bool
	resident           map[core.Device]bool
	view               core.Device
	desired            core.Device
	src                core.Device
	unpopulated        bool
	mostlyRead         bool
	clean              bool // clean eviction may keep the device's copy
	thrash             thrashAction
	launchLocked       bool // the launch model forbids the touch
	launchHostCopy     bool // the launch model copies the page back to the host

	askedThrashing bool
}

func (f *fakeFacts) hostOnDeviceMemory() bool      { return f.deviceMemoryOnHost }
func (f *fakeFacts) kind() core.FaultKind          { return f.faultKind }
func (f *fakeFacts) write() bool                   { return f.isWrite }
func (f *fakeFacts) waitsLeft() bool               { return !f.lastWait }
func (f *fakeFacts) noNap() bool                   { return f.napped }
func (f *fakeFacts) mapping() (core.Device, bool)  { return f.m, !f.unknown }
func (f *fakeFacts) ownFileHolds() bool            { return f.ownHolds }
func (f *fakeFacts) residentAt(l core.Device) bool { return f.resident[l] }
func (f *fakeFacts) viewLocation() core.Device     { return f.view }
func (f *fakeFacts) desiredFile() core.Device      { return f.desired }
func (f *fakeFacts) source() (core.Device, bool)   { return f.src, !f.unpopulated }
func (f *fakeFacts) readMostly() bool              { return f.mostlyRead }
func (f *fakeFacts) cleanCopy() bool               { return f.clean }
func (f *fakeFacts) launchRefused() bool           { return f.launchLocked }
func (f *fakeFacts) launchCopy() bool              { return f.launchHostCopy }
func (f *fakeFacts) thrashing() thrashAction       { f.askedThrashing = true; return f.thrash }

// TestDecideFault covers every branch of the fault path's decision, as
// serveFault had them before the decision was its own step. The faults
// are device 0's unless a case says otherwise; the page is on the host
// and the view maps device 0's own file.
func TestDecideFault(t *testing.T) {
	const host, dev0, dev1 = core.CPU, core.Device(0), core.Device(1)
	base := func() fakeFacts {
		return fakeFacts{faultKind: core.FaultMissing, m: dev0, view: dev0, desired: dev0, src: host, resident: map[core.Device]bool{host: true}}
	}
	cases := []struct {
		name        string
		change      func(*fakeFacts)
		want        Plan
		askThrashes bool
	}{
		{"host touches device memory", func(f *fakeFacts) { f.deviceMemoryOnHost = true; f.view, f.m = host, host }, PlanRefuse, false},
		{"minor fault on a remote mapping is a hint", func(f *fakeFacts) { f.faultKind, f.m = core.FaultMinor, host }, PlanHint, false},
		{"minor fault while the mapping changes: wait", func(f *fakeFacts) { f.faultKind, f.unknown = core.FaultMinor, true }, PlanWaitMapping, false},
		{"minor fault while the mapping changes, waited enough: a hint", func(f *fakeFacts) {
			f.faultKind, f.unknown, f.lastWait = core.FaultMinor, true, true
		}, PlanHint, false},
		{"minor fault on the own file, which holds the page: continue", func(f *fakeFacts) {
			f.faultKind = core.FaultMinor
			f.resident = map[core.Device]bool{dev0: true}
		}, PlanContinue, false},
		{"minor fault on a stray page of the own file: migrate", func(f *fakeFacts) { f.faultKind = core.FaultMinor }, PlanMigrate, true},
		{"mapping changing to the file that holds the page: wait", func(f *fakeFacts) { f.unknown, f.ownHolds = true, true }, PlanWaitMapping, false},
		{"mapping changing, waited enough: pending", func(f *fakeFacts) { f.unknown, f.ownHolds, f.lastWait = true, true, true }, PlanPending, false},
		{"mapping changing elsewhere: pending", func(f *fakeFacts) { f.unknown = true }, PlanPending, false},
		{"write-protect fault", func(f *fakeFacts) { f.faultKind = core.FaultWP }, PlanWP, false},
		{"already where the view maps: wake", func(f *fakeFacts) { f.resident[dev0] = true }, PlanWake, false},
		{"came here while the view maps the old place: wait", func(f *fakeFacts) {
			f.m, f.src = host, dev1
			f.resident = map[core.Device]bool{dev0: true}
		}, PlanWaitMapping, false},
		{"came here, but policy wants it elsewhere: migrate", func(f *fakeFacts) {
			f.m, f.src, f.desired = dev1, dev0, dev1
			f.resident = map[core.Device]bool{dev0: true}
		}, PlanMigrate, true},
		{"read of a read-mostly page: duplicate", func(f *fakeFacts) { f.mostlyRead = true }, PlanDuplicate, false},
		{"write of a read-mostly page: migrate", func(f *fakeFacts) { f.mostlyRead, f.isWrite = true, true }, PlanMigrate, true},
		{"first touch of a read-mostly page: migrate", func(f *fakeFacts) { f.mostlyRead, f.unpopulated = true, true }, PlanMigrate, false},
		{"host read where clean eviction applies: duplicate", func(f *fakeFacts) { f.clean = true }, PlanDuplicate, false},
		{"host write where clean eviction applies: migrate", func(f *fakeFacts) { f.clean, f.isWrite = true, true }, PlanMigrate, true},
		{"thrashing: throttle", func(f *fakeFacts) { f.thrash = thrashThrottle }, PlanThrottle, true},
		{"thrashing, napped once: migrate without asking", func(f *fakeFacts) { f.thrash, f.napped = thrashThrottle, true }, PlanMigrate, false},
		{"pinned in host memory: bring it there and wait", func(f *fakeFacts) {
			f.thrash, f.desired = thrashPinned, host
			f.src, f.resident = dev1, map[core.Device]bool{dev1: true}
		}, PlanPinToHost, true},
		{"pinned, waited enough: migrate anyway", func(f *fakeFacts) {
			f.thrash, f.desired, f.lastWait = thrashPinned, host, true
			f.src, f.resident = dev1, map[core.Device]bool{dev1: true}
		}, PlanMigrateAnyway, true},
		{"pinned, but policy keeps the device on its own file: migrate", func(f *fakeFacts) { f.thrash = thrashPinned }, PlanMigrate, true},
		{"pinned, the host faults: migrate", func(f *fakeFacts) {
			f.thrash, f.view, f.m, f.desired = thrashPinned, host, host, host
			f.src, f.resident = dev0, map[core.Device]bool{dev0: true}
		}, PlanMigrate, true},
		{"launch model: the CPU during a kernel is refused", func(f *fakeFacts) {
			f.launchLocked, f.view, f.m = true, host, host
			f.src, f.resident = dev0, map[core.Device]bool{dev0: true}
		}, PlanLaunchRefuse, false},
		{"launch model: a kernel on memory its launch did not take is refused", func(f *fakeFacts) { f.launchLocked = true }, PlanLaunchRefuse, false},
		{"launch model: a host fault copies the page back, the device keeps it", func(f *fakeFacts) {
			f.launchHostCopy, f.view, f.m, f.desired = true, host, host, host
			f.src, f.resident = dev0, map[core.Device]bool{dev0: true}
		}, PlanDuplicate, false},
		{"launch model: a host write copies too", func(f *fakeFacts) {
			f.launchHostCopy, f.isWrite, f.view, f.m, f.desired = true, true, host, host, host
			f.src, f.resident = dev0, map[core.Device]bool{dev0: true}
		}, PlanDuplicate, false},
		{"launch model: a host first touch populates", func(f *fakeFacts) {
			f.launchHostCopy, f.view, f.m, f.desired = true, host, host, host
			f.unpopulated, f.resident = true, map[core.Device]bool{}
		}, PlanMigrate, false},
		{"first touch: migrate (populate)", func(f *fakeFacts) { f.unpopulated, f.resident = true, map[core.Device]bool{} }, PlanMigrate, false},
		{"ordinary fault: migrate", func(*fakeFacts) {}, PlanMigrate, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := base()
			tc.change(&f)
			if got := decideFault(&f); got != tc.want {
				t.Errorf("decideFault = %v, want %v", got, tc.want)
			}
			if f.askedThrashing != tc.askThrashes {
				t.Errorf("asked the thrashing policy: %v, want %v", f.askedThrashing, tc.askThrashes)
			}
		})
	}
}
