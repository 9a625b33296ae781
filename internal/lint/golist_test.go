package lint

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// module is this module's path.
const module = "github.com/softuvm/softuvm"

// listedPackage is what the checks read of `go list -json`.
type listedPackage struct {
	ImportPath string
	Imports    []string
	Export     string
	// Dir holds the package's files: those built here, those with cgo,
	// and those other platforms build (IgnoredGoFiles, tests among them).
	Dir            string
	GoFiles        []string
	CgoFiles       []string
	IgnoredGoFiles []string
}

// goList runs `go list -json` with args and returns the packages it
// describes. The go command is the one that runs the test: go test puts
// its GOROOT/bin first in PATH.
func goList(t *testing.T, args ...string) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Imports,Export,Dir,GoFiles,CgoFiles,IgnoredGoFiles"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []listedPackage
	for {
		var p listedPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// rel is a package's path relative to the module, "" for another
// module's or the standard library's.
func rel(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// within says if package path rel is root or below it.
func within(rel, root string) bool {
	return rel == root || strings.HasPrefix(rel, root+"/")
}

// goDeps lists every package pkg depends on, directly or not.
func goDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}
