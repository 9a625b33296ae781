package lint

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"sort"
	"strings"
	"testing"
)

// hidden are the packages whose types the public packages must not
// expose: the server, the wire protocol, the copy engine and the device
// runtime are the implementation. core, config and policy hold the
// shared data types, which uvm exposes by aliases.
var hidden = []string{"internal/server", "internal/wire", "internal/engine", "internal/device"}

// knownLeaks are exposures the API has today, each to be removed: a test
// fails when one is gone, so the list cannot outlive them.
var knownLeaks = map[string]bool{}

// loadTypes type-checks nothing: it reads the export data of path, which
// the go command builds (or finds in its cache) for `go list -export`,
// with the gc importer. That is what the compiler itself sees of the
// package, so it needs no source importer, nor golang.org/x/tools.
func loadTypes(t *testing.T, path string) *types.Package {
	t.Helper()
	exports := map[string]string{}
	for _, p := range goList(t, "-export", "-deps", path) {
		exports[p.ImportPath] = p.Export
	}
	pkg, err := exportImporter(exports).Import(path)
	if err != nil {
		t.Fatalf("import %s from its export data: %v", path, err)
	}
	return pkg
}

// exportImporter imports packages from the export data files of
// exports, by import path.
func exportImporter(exports map[string]string) types.Importer {
	lookup := func(p string) (io.ReadCloser, error) {
		file := exports[p]
		if file == "" {
			return nil, fmt.Errorf("no export data for %s", p)
		}
		return os.Open(file)
	}
	return importer.ForCompiler(token.NewFileSet(), "gc", lookup)
}

// apiWalker walks every type a package's exported API mentions: the
// signatures of its exported funcs and of the exported methods of its
// types, the exported fields (and embedded ones) of its structs, its
// interfaces, type parameters, aliases, vars and consts. Types of the
// package itself, exported or not, are walked into; other packages' are
// checked by name, not walked (core's, config's and policy's cannot
// mention the hidden packages: TestLayers keeps them from importing
// them).
type apiWalker struct {
	pkg    *types.Package
	hidden func(path string) bool
	seen   map[*types.Named]bool
	leaks  map[string]bool
}

func (w *apiWalker) qualifier(p *types.Package) string { return p.Name() }

func (w *apiWalker) walk(where string, t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		w.walk(where, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && w.hidden(obj.Pkg().Path()) {
			w.leaks[fmt.Sprintf("%s exposes %s", where, types.TypeString(t, w.qualifier))] = true
		}
		for i := range t.TypeArgs().Len() {
			w.walk(where, t.TypeArgs().At(i))
		}
		if obj.Pkg() == w.pkg {
			w.named(t.Origin())
		}
	case *types.Pointer:
		w.walk(where, t.Elem())
	case *types.Slice:
		w.walk(where, t.Elem())
	case *types.Array:
		w.walk(where, t.Elem())
	case *types.Chan:
		w.walk(where, t.Elem())
	case *types.Map:
		w.walk(where, t.Key())
		w.walk(where, t.Elem())
	case *types.Signature:
		w.typeParams(where, t.TypeParams())
		w.tuple(where, t.Params())
		w.tuple(where, t.Results())
	case *types.Struct:
		for i := range t.NumFields() {
			if f := t.Field(i); f.Exported() || f.Embedded() {
				w.walk(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := range t.NumEmbeddeds() {
			w.walk(where, t.EmbeddedType(i))
		}
		for i := range t.NumExplicitMethods() {
			if m := t.ExplicitMethod(i); m.Exported() {
				w.walk(where+"."+m.Name(), m.Type())
			}
		}
	case *types.Union:
		for i := range t.Len() {
			w.walk(where, t.Term(i).Type())
		}
	case *types.TypeParam:
		// Its constraint is walked where it is declared.
	case *types.Tuple:
		w.tuple(where, t)
	case *types.Basic:
	default:
		panic(fmt.Sprintf("%s: unexpected type %T", where, t))
	}
}

func (w *apiWalker) tuple(where string, t *types.Tuple) {
	for i := range t.Len() {
		w.walk(where, t.At(i).Type())
	}
}

func (w *apiWalker) typeParams(where string, l *types.TypeParamList) {
	for i := range l.Len() {
		w.walk(where, l.At(i).Constraint())
	}
}

// named walks a type of the package: its definition and its exported
// methods, under its own name.
func (w *apiWalker) named(t *types.Named) {
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	name := w.pkg.Name() + "." + t.Obj().Name()
	w.typeParams(name, t.TypeParams())
	w.walk(name, t.Underlying())
	for i := range t.NumMethods() {
		if m := t.Method(i); m.Exported() {
			w.walk(name+"."+m.Name(), m.Type())
		}
	}
}

// apiLeaks returns what pkg's exported API exposes of the hidden
// packages, sorted.
func apiLeaks(pkg *types.Package, hidden []string) []string {
	w := &apiWalker{
		pkg: pkg,
		hidden: func(path string) bool {
			r, ok := rel(path)
			return ok && inAny(r, hidden)
		},
		seen:  map[*types.Named]bool{},
		leaks: map[string]bool{},
	}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		where := pkg.Name() + "." + name
		switch obj := obj.(type) {
		case *types.TypeName:
			if obj.IsAlias() {
				// An alias of a hidden type is a leak, of core's,
				// config's or policy's is the point.
				w.walk(where, obj.Type())
			} else {
				w.named(obj.Type().(*types.Named))
			}
		default: // funcs, vars, consts
			w.walk(where, obj.Type())
		}
	}
	var leaks []string
	for l := range w.leaks {
		leaks = append(leaks, l)
	}
	sort.Strings(leaks)
	return leaks
}

// TestPublicAPIHidesInternals: package uvm exposes no type of the
// server, the wire protocol, the copy engine or the device runtime.
func TestPublicAPIHidesInternals(t *testing.T) {
	pkg := loadTypes(t, module+"/uvm")
	if n := len(pkg.Scope().Names()); n < 50 {
		t.Fatalf("package uvm has only %d names: the export data was not read whole", n)
	}
	leaks := apiLeaks(pkg, hidden)
	found := map[string]bool{}
	for _, l := range leaks {
		if knownLeaks[l] {
			found[l] = true
			continue
		}
		t.Errorf("%s: the public API must not show internal packages' types (aliases of core, config and policy types are fine)", l)
	}
	for l := range knownLeaks {
		if !found[l] {
			t.Errorf("knownLeaks has %q, which is gone: remove it from internal/lint/api_test.go", l)
		}
	}
	if testing.Verbose() {
		t.Logf("walked %d names of package uvm; leaks: %s", len(pkg.Scope().Names()), strings.Join(leaks, "; "))
	}
}

// TestAPILeaksFound: the walk finds a hidden type wherever the API can
// show one, in a package made up for the test, and lets core's and
// policy's types through.
func TestAPILeaksFound(t *testing.T) {
	exports := map[string]string{}
	for _, p := range goList(t, "-export", "-deps", module+"/internal/server", module+"/internal/engine", module+"/policy") {
		exports[p.ImportPath] = p.Export
	}
	const src = `package uvm

import (
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
)

func Result() *server.Server { return nil }
func Param(map[string][]wire.Header) {}
type Alias = device.Kernel
type Stats = core.Stats
type Spec = policy.PrefetchSpec
type Public struct {
	Field  chan engine.CopyEngines
	hidden *server.Server
	embedded
}
type embedded struct{ Promoted *wire.DirectConn }
func (Public) Method() (int, error, func(*device.DeviceMapping)) { return 0, nil, nil }
func (Public) unexported() *server.Server { return nil }
type Iface interface{ Do(core.Device) []*wire.Client }
type Generic[T any] struct{ V T }
var Instance Generic[*server.Server]
func Returns() private { return private{} }
type private struct{ Out *engine.CopyEngines }
func Constrained[T interface{ ~int | *server.Server }]() {}
func Fine(core.Device, policy.PrefetchSpec) core.Stats { return core.Stats{} }
var unexportedVar *server.Server
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "leaks.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: exportImporter(exports)}
	pkg, err := conf.Check(module+"/uvm", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"uvm.Alias exposes device.Kernel",
		"uvm.Constrained exposes server.Server",
		"uvm.Iface.Do exposes wire.Client",
		"uvm.Instance exposes server.Server",
		"uvm.Param exposes wire.Header",
		"uvm.Public.Field exposes engine.CopyEngines",
		"uvm.Public.Method exposes device.DeviceMapping",
		"uvm.Result exposes server.Server",
		"uvm.embedded.Promoted exposes wire.DirectConn",
		"uvm.private.Out exposes engine.CopyEngines",
	}
	if got := apiLeaks(pkg, hidden); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("leaks found:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}
