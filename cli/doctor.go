package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/softuvm/softuvm/bpf"
	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/bench"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/lab"
	"github.com/softuvm/softuvm/libuvm"
	"github.com/softuvm/softuvm/uffd"
)

// `uvm doctor` says what this machine gives softuvm and what it lacks,
// each lack with what it costs and what fixes it. Every check is the
// probe the part itself uses (the server's userfaultfd and large-folio
// probes, the eBPF counters' loader, uvm run's heap probe, the
// benchmarks' cgroup and zram set-up, uvm lab bound's valgrind lookup),
// asked without changing the machine.

// Exit statuses of `uvm doctor`.
const (
	doctorStatusOK      = 0 // everything uvm run and programs on managed memory need is here
	doctorStatusMissing = 1 // something they need is missing (a check marked MISSING)
)

// doctorCheck is one thing the machine gives or lacks.
type doctorCheck struct {
	Name     string `json:"name"` // a stable identifier: userfaultfd, managed-heap, ...
	What     string `json:"what"` // what it is, in words
	OK       bool   `json:"ok"`
	Required bool   `json:"required"` // uvm run and programs on managed memory need it
	Found    string `json:"found"`    // what this machine has
	// Consequence is what is lost without it, and Fix what gives it;
	// both empty where OK.
	Consequence string `json:"consequence,omitempty"`
	Fix         string `json:"fix,omitempty"`
}

// doctorReport is what `uvm doctor --json` prints.
type doctorReport struct {
	OK     bool          `json:"ok"` // every required check passed: the exit status is 0
	Checks []doctorCheck `json:"checks"`
}

func runDoctor(args []string) error {
	fs := newFlagSet("doctor", "[--json] [--preload PATH]",
		"Say what this machine gives softuvm and what it lacks, each lack with what it costs and how to fix it: userfaultfd for this user "+
			"(and vm.unprivileged_userfaultfd), libuvm-preload.so and jemalloc for uvm run's managed heap, a C compiler and pkg-config for C programs, "+
			"tracefs and BPF for the eBPF access counters, a huge-page tmpfs for large folios, memory cgroups and zram for the kernel baseline of uvm bench run and oversub, "+
			"and valgrind for uvm lab bound. Nothing on the machine is changed. "+
			"Exit status: 0 when everything uvm run and programs on managed memory need is here (optional parts may be missing: they are listed, as missing (optional)), "+
			"1 when something they need is missing (marked MISSING), 2 for bad flags")
	asJSON := fs.Bool("json", false, "print JSON: {ok, checks: [{name, what, ok, required, found, consequence, fix}]}")
	preload := fs.String("preload", "", "the libuvm-preload.so to check the managed heap with (default: the one uvm run would use, built into the cache if this uvm has none beside it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep := doctor(*preload)
	if *asJSON {
		if err := writeJSON(os.Stdout, rep); err != nil {
			return err
		}
	} else {
		printDoctor(os.Stdout, rep)
	}
	if !rep.OK {
		return exitStatus(doctorStatusMissing)
	}
	return nil
}

// doctor runs every check.
func doctor(preload string) doctorReport {
	lib, libCheck := checkPreloadLibrary(preload)
	checks := []doctorCheck{
		checkUserfaultfd(),
		libCheck,
		checkManagedHeap(lib),
		checkCompiler(),
		checkPkgConfig(),
		checkEBPF(),
		checkLargeFolios(),
		checkMemoryCgroup(),
		checkZram(),
		checkValgrind(),
	}
	rep := doctorReport{OK: true, Checks: checks}
	for _, c := range checks {
		if c.Required && !c.OK {
			rep.OK = false
		}
	}
	return rep
}

func printDoctor(w io.Writer, rep doctorReport) {
	fmt.Fprintf(w, "uvm doctor: what this machine gives softuvm, and what it lacks\n\n")
	optional := 0
	for _, c := range rep.Checks {
		status := "ok"
		switch {
		case !c.OK && c.Required:
			status = "MISSING"
		case !c.OK:
			status, optional = "missing (optional)", optional+1
		}
		fmt.Fprintf(w, "  %-18s %-24s %s\n", status, c.What, c.Found)
		if !c.OK {
			fmt.Fprintf(w, "  %-18s %-24s without it: %s\n", "", "", c.Consequence)
			fmt.Fprintf(w, "  %-18s %-24s fix: %s\n", "", "", c.Fix)
		}
	}
	fmt.Fprintln(w)
	switch {
	case !rep.OK:
		fmt.Fprintf(w, "Something uvm run or programs on managed memory need is MISSING (above): exit status %d.\n", doctorStatusMissing)
	case optional > 0:
		fmt.Fprintf(w, "Everything uvm run and programs on managed memory need is here; %d optional part(s) missing (above).\n", optional)
	default:
		fmt.Fprintf(w, "Everything softuvm uses is here.\n")
	}
}

// asRoot is the fix's prefix where this user is not root.
func asRoot() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "sudo "
}

func checkUserfaultfd() doctorCheck {
	c := doctorCheck{Name: "userfaultfd", What: "userfaultfd", Required: true,
		Consequence: "no fault server can run: uvm run, uvm serve, uvm demo and every program on managed memory fail"}
	dev, sys := uffd.OpenMethods()
	unpriv := "unreadable"
	if b, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); err == nil {
		unpriv = strings.TrimSpace(string(b))
	}
	c.Found = fmt.Sprintf("/dev/userfaultfd: %s; userfaultfd(2): %s; vm.unprivileged_userfaultfd=%s", errText(dev), errText(sys), unpriv)
	var missing uffd.Feature
	if f, err := uffd.Supported(); err == nil {
		missing = core.RequiredFeatures &^ f
	}
	switch {
	case dev != nil && sys != nil:
		c.Fix = "run as root; or give this user /dev/userfaultfd (" + asRoot() + "setfacl -m u:" + userName() + ":rw /dev/userfaultfd, or a group of its own); " +
			"or let every user handle kernel-mode faults: " + asRoot() + "sysctl vm.unprivileged_userfaultfd=1"
	case missing != 0:
		c.Found += "; the kernel lacks " + missing.String()
		c.Fix = "a kernel with userfaultfd's " + missing.String() + " (Linux 6.1 or later has every feature the server needs)"
	default:
		c.OK, c.Consequence = true, ""
		c.Found += "; every feature the server needs"
	}
	return c
}

// userName is this user's login name, for a command that names it.
func userName() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return fmt.Sprint(os.Geteuid())
}

// checkPreloadLibrary finds libuvm-preload.so as uvm run does (building
// it into the cache where this uvm has none beside it).
func checkPreloadLibrary(flagPath string) (string, doctorCheck) {
	c := doctorCheck{Name: "preload-library", What: preloadName, Required: true}
	lib, err := findPreload(flagPath)
	if err != nil {
		c.Found = err.Error()
		c.Consequence = "uvm run cannot run any program"
		c.Fix = "install a C compiler (" + asRoot() + "apt-get install gcc libc6-dev), or `make lib` in a softuvm checkout and pass --preload or set UVM_PRELOAD"
		return "", c
	}
	c.OK, c.Found = true, lib
	return lib, c
}

// checkManagedHeap asks lib whether jemalloc loads, as uvm run asks it
// before every run.
func checkManagedHeap(lib string) doctorCheck {
	c := doctorCheck{Name: "managed-heap", What: "jemalloc (managed heap)", Required: true,
		Consequence: "uvm run manages only allocations of at least --min-size (1 MiB): programs that allocate in small pieces (awk, sort, an interpreter, a database) run with little or nothing managed, and uvm run says so once per run"}
	if lib == "" {
		c.Found = "not checked: no " + preloadName + " (above)"
		c.Fix = "first make " + preloadName + " available (above)"
		return c
	}
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	p, err := libuvm.ProbeHeap(runEnv(os.Environ(), "", config.DefaultMinSize, "managed", false, lib, self))
	switch {
	case err != nil:
		c.Found = err.Error()
		c.Fix = "a dynamically linked true or sh in PATH, for the probe"
	case !p.Managed:
		c.Found, c.Fix = p.Why, p.Fix
		if strings.HasPrefix(c.Fix, "install jemalloc") {
			c.Fix = asRoot() + "apt-get install " + libuvm.JemallocPackage
		}
	default:
		name := os.Getenv(libuvm.EnvJemalloc)
		if name == "" {
			name = libuvm.DefaultJemalloc
		}
		c.OK, c.Consequence = true, ""
		c.Found = fmt.Sprintf("jemalloc %s (%s) loads under %s", p.Version, name, preloadName)
	}
	return c
}

// checkCompiler builds a small C program with the compiler uvm uses.
func checkCompiler() doctorCheck {
	c := doctorCheck{Name: "c-compiler", What: "C compiler",
		Consequence: "C programs cannot be built against uvm.h (docs/c-api.md), and a uvm with no " + preloadName + " beside it cannot build one for uvm run",
		Fix:         asRoot() + "apt-get install gcc libc6-dev (or set CC)"}
	cc, err := libuvm.Compiler()
	if err != nil {
		c.Found = err.Error()
		return c
	}
	dir, err := os.MkdirTemp("", "uvm-doctor-")
	if err != nil {
		c.Found = err.Error()
		return c
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "hello.c")
	if err := os.WriteFile(src, []byte("#include <stdio.h>\nint main(void) { return puts(\"\") < 0; }\n"), 0o644); err != nil {
		c.Found = err.Error()
		return c
	}
	if err := libuvm.BuildProgram(filepath.Join(dir, "hello"), src); err != nil {
		c.Found = fmt.Sprintf("%s cannot build a program: %v", strings.Join(cc, " "), err)
		return c
	}
	c.OK, c.Consequence, c.Fix = true, "", ""
	c.Found = strings.Join(cc, " ") + " builds programs"
	return c
}

func checkPkgConfig() doctorCheck {
	c := doctorCheck{Name: "pkg-config", What: "pkg-config",
		Consequence: "`cc prog.c $(pkg-config --cflags --libs uvm)`, as docs/c-api.md builds C programs, does not work",
		Fix:         asRoot() + "apt-get install pkg-config"}
	p, err := exec.LookPath("pkg-config")
	if err != nil {
		c.Found = "not in PATH"
		return c
	}
	c.OK, c.Consequence, c.Fix = true, "", ""
	c.Found = p
	if out, err := exec.Command(p, "--variable=prefix", "uvm").Output(); err == nil {
		c.Found += "; uvm.pc installed under " + strings.TrimSpace(string(out))
	} else {
		c.Found += "; uvm.pc not installed yet (make install PREFIX=..., then PKG_CONFIG_PATH=PREFIX/lib/pkgconfig where PREFIX is not a system one)"
	}
	return c
}

// checkEBPF loads the access counters as a server does, and unloads them.
func checkEBPF() doctorCheck {
	c := doctorCheck{Name: "ebpf-counters", What: "eBPF access counters",
		Consequence: "access counting falls back to user space (MINOR-mode hint faults: a fault per sampled access), and there is no fault anatomy (uvm stat --anatomy, uvm bench access)"}
	tracefs := "tracefs not mounted"
	for _, d := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(filepath.Join(d, "events")); err == nil {
			tracefs = "tracefs at " + d
			break
		}
	}
	counters, err := bpf.Load(bpf.DefaultThreshold)
	if err == nil {
		counters.Close()
		c.OK, c.Consequence = true, ""
		c.Found = tracefs + "; the counters load on exceptions:page_fault_user"
		return c
	}
	c.Found = tracefs + "; " + err.Error()
	switch {
	case errors.Is(err, os.ErrPermission):
		c.Fix = "run the server as root (or with CAP_BPF and CAP_PERFMON)"
	case tracefs == "tracefs not mounted":
		c.Fix = asRoot() + "mount -t tracefs nodev /sys/kernel/tracing"
	default:
		c.Fix = "a kernel with BPF and the exceptions:page_fault_user tracepoint (CONFIG_BPF_SYSCALL, CONFIG_TRACEPOINTS)"
	}
	return c
}

// checkLargeFolios makes the server's private huge-page tmpfs, as a
// server does at start.
func checkLargeFolios() doctorCheck {
	c := doctorCheck{Name: "large-folios", What: "large folios (THP)",
		Consequence: "location files take 4 KiB pages: a 2 MiB block moving whole costs 512 page allocations and frees instead of one"}
	shmem := "no transparent huge pages in this kernel"
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled"); err == nil {
		shmem = "shmem_enabled " + strings.TrimSpace(string(b))
	}
	if err := devmem.LargeFoliosAvailable(); err != nil {
		c.Found = shmem + "; a private huge=always tmpfs cannot be made: " + err.Error()
		switch {
		case os.Geteuid() != 0:
			c.Fix = "run the server as root (making the tmpfs needs CAP_SYS_ADMIN)"
		default:
			c.Fix = "a kernel with transparent huge pages for shmem (CONFIG_TRANSPARENT_HUGEPAGE)"
		}
		return c
	}
	c.OK, c.Consequence = true, ""
	c.Found = shmem + "; the server's huge=always tmpfs can be made (UVM_LARGE_FOLIOS=auto uses it)"
	return c
}

// benchBaselineLoss is what the benchmarks lose without a memory cgroup
// or zram.
const benchBaselineLoss = "uvm bench run and uvm bench oversub skip their kernel baseline (the program in a memory cgroup of the budget with zram swap)"

// benchBaselineNeedsRoot finishes a check of what the benchmarks'
// baseline needs, found here: it is there for root alone, which can make
// the cgroup and the swap device.
func benchBaselineNeedsRoot(c doctorCheck) doctorCheck {
	if os.Geteuid() != 0 {
		c.Found += "; not root"
		c.Fix = "run the benchmarks as root: they make the cgroup and the zram swap device"
		return c
	}
	c.OK, c.Consequence = true, ""
	return c
}

func checkMemoryCgroup() doctorCheck {
	c := doctorCheck{Name: "memory-cgroup", What: "memory cgroup", Consequence: benchBaselineLoss}
	mount, v2, err := bench.MemoryCgroupMount()
	switch {
	case err != nil:
		c.Found = err.Error()
		c.Fix = "a kernel with the memory controller enabled (cgroup_enable=memory on its command line)"
		return c
	case mount == "":
		c.Found = "the memory controller is enabled but on no mounted hierarchy (the benchmarks mount a v1 one)"
	case v2:
		c.Found = "the memory controller on the unified (v2) hierarchy at " + mount
	default:
		c.Found = "the memory controller on a v1 hierarchy at " + mount
	}
	return benchBaselineNeedsRoot(c)
}

func checkZram() doctorCheck {
	c := doctorCheck{Name: "zram", What: "zram", Consequence: benchBaselineLoss}
	found, err := bench.ZramPresent(false)
	if err != nil {
		c.Found = err.Error()
		c.Fix = "a kernel with zram (CONFIG_ZRAM, built in or as a module)"
		if errors.Is(err, exec.ErrNotFound) {
			c.Fix = asRoot() + "apt-get install kmod (for modprobe), and a kernel with zram"
		}
		return c
	}
	c.Found = found
	return benchBaselineNeedsRoot(c)
}

func checkValgrind() doctorCheck {
	c := doctorCheck{Name: "valgrind", What: "valgrind",
		Consequence: "uvm lab bound cannot run (it runs the program under valgrind's lackey tool)",
		Fix:         asRoot() + "apt-get install valgrind"}
	p, err := lab.LookValgrind()
	if err != nil {
		c.Found = "not in PATH"
		return c
	}
	c.OK, c.Consequence, c.Fix = true, "", ""
	c.Found = p
	return c
}
