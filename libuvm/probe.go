package libuvm

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// The managed heap of libuvm-preload.so loads jemalloc when a program
// starts. These are the names the library reads for it, and the
// environment it needs.
const (
	// EnvJemalloc names the jemalloc library the managed heap loads with
	// dlopen: a name for the loader to find, or a path. Unset or empty:
	// DefaultJemalloc.
	EnvJemalloc = "UVM_JEMALLOC"
	// DefaultJemalloc is jemalloc 5's shared library by its soname
	// (Debian and Ubuntu: package libjemalloc2).
	DefaultJemalloc = "libjemalloc.so.2"
	// JemallocPackage is the Debian and Ubuntu package that installs it.
	JemallocPackage = "libjemalloc2"

	// envProbe=heap makes the library answer whether the managed heap can
	// be had, and end the process before its main (ProbeHeap).
	envProbe = "UVM_PRELOAD_PROBE"

	// StaticTLSTunable is glibc's tunable for the static TLS it keeps for
	// libraries loaded with dlopen. jemalloc as Debian builds it keeps
	// its thread state in static TLS (2.6 KiB), more than glibc leaves
	// for libraries loaded late (512 bytes), so a program whose heap is
	// managed needs more: StaticTLSRoom.
	StaticTLSTunable = "glibc.rtld.optional_static_tls"
	StaticTLSRoom    = 16384
)

// HeapTunables returns GLIBC_TUNABLES's value for a program whose heap
// is managed, given the caller's (possibly empty): the caller's, with
// room made for jemalloc's static TLS unless the caller sets that
// tunable itself.
func HeapTunables(caller string) string {
	if strings.Contains(caller, StaticTLSTunable+"=") {
		return caller
	}
	if caller != "" {
		caller += ":"
	}
	return fmt.Sprintf("%s%s=%d", caller, StaticTLSTunable, StaticTLSRoom)
}

// HeapProbe is what the preload library found of jemalloc in a process
// started only to ask.
type HeapProbe struct {
	Managed bool   // jemalloc 5 loaded: the managed heap can be had
	Version string // jemalloc's version, where Managed
	Why     string // why not, where not Managed
	Fix     string // what would fix that
}

// ErrNoProbeProgram is what ProbeHeap's error wraps when it finds no
// dynamically linked program to start under the library.
var ErrNoProbeProgram = errors.New("no dynamically linked program to probe with")

// ProbeHeap asks the preload library whether the managed heap can be had
// in env, the environment a program would run with (LD_PRELOAD naming
// the library, and GLIBC_TUNABLES as HeapTunables makes it): it starts a
// small dynamically linked program (true, else sh, from PATH) with
// UVM_PRELOAD_PROBE=heap added, whose loader loads the library, which
// loads jemalloc as it would for the program, answers on standard output
// and ends the process before its main. The answer is the real loader's,
// with the program's library path and tunables, for every reason it may
// fail (missing, not jemalloc, not jemalloc 5, no room for its TLS).
func ProbeHeap(env []string) (HeapProbe, error) {
	prog, err := probeProgram()
	if err != nil {
		return HeapProbe{}, err
	}
	cmd := exec.Command(prog)
	cmd.Env = append(withoutVars(env, "UVM_HEAP", envProbe), "UVM_HEAP=managed", envProbe+"=heap")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return HeapProbe{}, fmt.Errorf("probing the managed heap with %s: %v: %s", prog, err, strings.TrimSpace(stderr.String()))
	}
	return parseHeapProbe(string(out), prog)
}

// parseHeapProbe reads the library's answer: "managed<TAB>VERSION" or
// "system<TAB>WHY<TAB>FIX", one line.
func parseHeapProbe(out, prog string) (HeapProbe, error) {
	line, _, _ := strings.Cut(out, "\n")
	f := strings.Split(line, "\t")
	switch {
	case len(f) == 2 && f[0] == "managed":
		return HeapProbe{Managed: true, Version: f[1]}, nil
	case len(f) == 3 && f[0] == "system":
		return HeapProbe{Why: f[1], Fix: f[2]}, nil
	case out == "":
		return HeapProbe{}, fmt.Errorf("probing the managed heap with %s: no answer: the library was not loaded (LD_PRELOAD unset, or %s statically linked?)", prog, prog)
	}
	return HeapProbe{}, fmt.Errorf("probing the managed heap with %s: unexpected answer %q", prog, out)
}

// probeProgram is the first of true and sh in PATH that has an ELF
// interpreter, so that the loader (and with it the preload library)
// runs in it.
func probeProgram() (string, error) {
	var tried []string
	for _, name := range []string{"true", "sh"} {
		p, err := exec.LookPath(name)
		if err != nil {
			tried = append(tried, name+": not in PATH")
			continue
		}
		if Dynamic(p) {
			return p, nil
		}
		tried = append(tried, p+": statically linked")
	}
	return "", fmt.Errorf("%w (%s)", ErrNoProbeProgram, strings.Join(tried, "; "))
}

// Dynamic says whether path is an ELF executable with an interpreter
// (PT_INTERP): the dynamic loader runs for it, and with it LD_PRELOAD.
func Dynamic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// withoutVars is env less the variables named.
func withoutVars(env []string, names ...string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
