package lint

import (
	"fmt"
	"strings"
	"testing"
)

// allowedUnix are the packages that may import golang.org/x/sys/unix: the
// userfaultfd binding and devmem's small memfd/NUMA helper own the kernel
// boundary; everything else goes through them (or the standard library).
var allowedUnix = map[string]bool{
	"github.com/softuvm/softuvm/uffd":                   true,
	"github.com/softuvm/softuvm/devmem/internal/memsys": true,
}

func TestImportFence(t *testing.T) {
	pkgs := goList(t, module+"/...")
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			if imp == "golang.org/x/sys/unix" && !allowedUnix[p.ImportPath] {
				t.Errorf("%s imports golang.org/x/sys/unix: raw system calls belong in uffd or devmem/internal/memsys", p.ImportPath)
			}
		}
	}
	if len(pkgs) < 4 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
}

// layers are the runtime's packages in order, each layer a few roots
// with the packages below them (relative to the module): a package
// imports packages of its own layer and of earlier ones, never of a
// later one. The shared data types come first (core, then the policies,
// the refault bookkeeping, the block engine that moves pages and decides
// how, which the server and the lab both run, the lab that replays the
// policies over traces, then the configuration); then the wire protocol,
// the copy engine, the device processes, the fault server; then the
// public client; then the benchmarks (`uvm bench`, and the real programs
// they run), which measure through the public client; and on top the
// commands with package cli, the uvm command as a library, which they
// and a course's own uvm binaries (policy/coursework/cmd) and the lab's
// course kit (lab/course) build on.
// A package belongs to the layer of the longest root it is under, so
// that a command kept beside the policies it links is a command.
var layers = [][]string{
	{"internal/core"},
	{"policy"},
	{"internal/workingset"},
	{"internal/block"},
	{"lab"},
	{"internal/config"},
	{"internal/wire"},
	{"internal/engine"},
	{"internal/device"},
	{"internal/guard"},
	{"internal/server", "internal/metrics"},
	{"uvm"},
	{"internal/bench"},
	{"cli", "cmd", "policy/coursework/cmd", "lab/course", "lab/programs"},
}

// layerOrder writes the layers for a message: "core < policy < ... <
// {cli cmd ...}".
func layerOrder() string {
	var s []string
	for _, l := range layers {
		if len(l) == 1 {
			s = append(s, l[0])
		} else {
			s = append(s, "{"+strings.Join(l, " ")+"}")
		}
	}
	return strings.Join(s, " < ")
}

// foundation are the packages below every layer, which own the kernel
// boundary (userfaultfd, memory files, eBPF, what /proc tells of other
// processes), the trace format (which readers outside use without the
// runtime) or help tests: they import no package of the layers.
var foundation = []string{"uffd", "devmem", "bpf", "libuvm", "trace", "internal/fdleak", "internal/proctest", "internal/procinfo"}

// outside are the packages that check the others from outside, and may
// import any of them.
var outside = []string{"integration", "internal/lint"}

// onlyImports bound the imports of this module's packages by a few
// packages (exactly these, not the ones below them): the policies see
// only core's data types, so that a policy written against package
// policy depends on nothing of the server's; and core depends on no
// layer at all.
var onlyImports = map[string][]string{
	"policy":        {"internal/core"},
	"internal/core": {"uffd", "devmem"},
}

// layerOf returns the index of rel's layer, or -1.
func layerOf(rel string) int {
	best, longest := -1, 0
	for i, l := range layers {
		for _, root := range l {
			if within(rel, root) && len(root) > longest {
				best, longest = i, len(root)
			}
		}
	}
	return best
}

func inAny(rel string, roots []string) bool {
	for _, r := range roots {
		if within(rel, r) {
			return true
		}
	}
	return false
}

// layerViolations returns what is wrong with a package's imports (of the
// module's packages; its tests' imports are not checked).
func layerViolations(pkg string, imports []string) []string {
	from, _ := rel(pkg)
	fromLayer := layerOf(from)
	if fromLayer < 0 && !inAny(from, foundation) && !inAny(from, outside) {
		return []string{fmt.Sprintf("%s is in no layer: add it to layers, foundation or outside in internal/lint/fence_test.go", pkg)}
	}
	var bad []string
	for _, imp := range imports {
		to, ok := rel(imp)
		if !ok {
			continue
		}
		if allowed, bounded := onlyImports[from]; bounded && !inAny(to, allowed) {
			bad = append(bad, fmt.Sprintf("%s imports %s: it may import only %s of this module", from, to, strings.Join(allowed, " and ")))
			continue
		}
		toLayer := layerOf(to)
		switch {
		case inAny(from, outside) || toLayer < 0:
		case inAny(from, foundation):
			bad = append(bad, fmt.Sprintf("%s imports %s: %s is below every layer and imports none (layers: %s)", from, to, from, layerOrder()))
		case toLayer > fromLayer:
			bad = append(bad, fmt.Sprintf("%s imports %s, which comes later in the order %s", from, to, layerOrder()))
		}
	}
	return bad
}

// TestLayers: every package of the module imports within the order of
// layers, the bounded packages import only what they may, and every
// package has a place.
func TestLayers(t *testing.T) {
	pkgs := goList(t, module+"/...")
	var seen []string
	for _, p := range pkgs {
		r, _ := rel(p.ImportPath)
		seen = append(seen, r)
		for _, v := range layerViolations(p.ImportPath, p.Imports) {
			t.Error(v)
		}
	}
	roots := append([]string(nil), foundation...)
	for _, l := range layers {
		roots = append(roots, l...)
	}
	for _, root := range roots {
		found := false
		for _, r := range seen {
			found = found || within(r, root)
		}
		if !found {
			t.Errorf("no package %s: the lists in fence_test.go are out of date", root)
		}
	}
}

// serverFree are packages that must not depend on the fault server, even
// through others: the block engine, which the server and the lab run
// alike and knows the kernel only through its Memory interface, and the
// lab, which runs the engine over simulated memory. The layers forbid
// the direct import; this checks every dependency, so that the rule
// holds if the layers are ever reordered.
var serverFree = []string{"internal/block", "lab"}

// TestEngineAndLabDoNotImportServer: neither the block engine nor the
// lab depends on internal/server, directly or not.
func TestEngineAndLabDoNotImportServer(t *testing.T) {
	for _, root := range serverFree {
		for _, p := range goDeps(t, module+"/"+root) {
			if r, ok := rel(p); ok && within(r, "internal/server") {
				t.Errorf("%s depends on %s: the engine and the lab know the kernel only through block.Memory", root, p)
			}
		}
	}
}

// throughTheClient are packages that measure softuvm as its users get
// it, through the public client: they import none of the packages the
// client hides (hidden, api_test.go) directly.
var throughTheClient = []string{"internal/bench"}

// TestBenchmarksMeasureThroughTheClient: the benchmarks import nothing
// of the server, the wire protocol, the copy engine or the device
// runtime.
func TestBenchmarksMeasureThroughTheClient(t *testing.T) {
	pkgs := goList(t, module+"/...")
	checked := 0
	for _, p := range pkgs {
		from, _ := rel(p.ImportPath)
		if !inAny(from, throughTheClient) {
			continue
		}
		checked++
		for _, v := range clientViolations(from, p.Imports) {
			t.Error(v)
		}
	}
	if checked == 0 {
		t.Fatalf("no package under %v: the list in fence_test.go is out of date", throughTheClient)
	}
}

// clientViolations returns the imports of from, a package of
// throughTheClient, that the public client hides.
func clientViolations(from string, imports []string) []string {
	var bad []string
	for _, imp := range imports {
		if to, ok := rel(imp); ok && inAny(to, hidden) {
			bad = append(bad, fmt.Sprintf("%s imports %s: a benchmark measures through the public client (uvm), as a user would", from, to))
		}
	}
	return bad
}

func TestClientViolations(t *testing.T) {
	m := func(r string) string { return module + "/" + r }
	got := clientViolations("internal/bench", []string{m("uvm"), m("internal/server"), "fmt", m("internal/wire/internal/gencheader"), m("lab")})
	want := []string{
		"internal/bench imports internal/server: a benchmark measures through the public client (uvm), as a user would",
		"internal/bench imports internal/wire/internal/gencheader: a benchmark measures through the public client (uvm), as a user would",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestLayerViolations: the check finds what it is meant to.
func TestLayerViolations(t *testing.T) {
	m := func(r string) string { return module + "/" + r }
	for _, c := range []struct {
		pkg     string
		imports []string
		want    string
	}{
		{"policy", []string{"internal/config"}, "policy imports internal/config: it may import only internal/core of this module"},
		{"policy", []string{"uffd"}, "policy imports uffd: it may import only internal/core"},
		{"internal/core", []string{"policy"}, "internal/core imports policy: it may import only uffd and devmem"},
		{"internal/wire", []string{"internal/server"}, "internal/wire imports internal/server, which comes later"},
		{"internal/block", []string{"internal/server"}, "internal/block imports internal/server, which comes later"},
		{"internal/block", []string{"internal/engine"}, "internal/block imports internal/engine, which comes later"},
		{"lab", []string{"internal/server"}, "lab imports internal/server, which comes later"},
		{"internal/server", []string{"uvm"}, "internal/server imports uvm, which comes later"},
		{"uvm", []string{"cmd/uvm"}, "uvm imports cmd/uvm, which comes later"},
		{"uvm", []string{"cli"}, "uvm imports cli, which comes later"},
		{"uvm", []string{"internal/bench"}, "uvm imports internal/bench, which comes later"},
		{"internal/bench", []string{"cli"}, "internal/bench imports cli, which comes later"},
		{"internal/bench/workloads", []string{"cli"}, "internal/bench/workloads imports cli, which comes later"},
		{"internal/server", []string{"policy/coursework/cmd/uvm-coursework"}, "internal/server imports policy/coursework/cmd/uvm-coursework, which comes later"},
		{"policy/coursework", []string{"cli"}, "policy/coursework imports cli, which comes later"},
		{"policy/coursework", []string{"internal/engine"}, "policy/coursework imports internal/engine, which comes later"},
		{"devmem", []string{"internal/core"}, "devmem imports internal/core: devmem is below every layer"},
		{"internal/newthing", nil, "internal/newthing is in no layer"},
	} {
		var imps []string
		for _, i := range c.imports {
			imps = append(imps, m(i))
		}
		got := strings.Join(layerViolations(m(c.pkg), imps), "\n")
		if !strings.Contains(got, c.want) {
			t.Errorf("%s importing %v: got %q, want %q", c.pkg, c.imports, got, c.want)
		}
	}
	for _, ok := range []struct {
		pkg     string
		imports []string
	}{
		{"policy", []string{"internal/core"}},
		{"lab", []string{"internal/block", "policy", "trace"}},
		{"internal/block", []string{"policy", "internal/workingset", "devmem"}},
		{"policy/coursework", []string{"policy"}},
		{"internal/core", []string{"uffd"}},
		{"internal/server", []string{"internal/device", "internal/engine", "policy", "uffd", "bpf"}},
		{"cmd/uvm", []string{"uvm", "internal/server"}},
		{"cmd/uvm", []string{"cli"}},
		{"cli", []string{"uvm", "internal/server", "policy"}},
		{"cli", []string{"internal/bench", "internal/bench/workloads"}},
		{"internal/bench", []string{"uvm", "lab", "trace", "policy", "internal/bench/workloads"}},
		{"policy/coursework/cmd/uvm-coursework", []string{"cli", "policy/coursework"}},
		{"integration", []string{"uvm", "cmd/uvm"}},
	} {
		var imps []string
		for _, i := range ok.imports {
			imps = append(imps, m(i))
		}
		if v := layerViolations(m(ok.pkg), imps); len(v) > 0 {
			t.Errorf("%s importing %v: %v", ok.pkg, ok.imports, v)
		}
	}
}
