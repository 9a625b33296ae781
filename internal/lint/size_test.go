package lint

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// maxPackageLines bounds a package: past it, a package has stopped being
// one thing (the server grew back to 11,774 lines, cli to 9,548, before
// they were split). Tests and generated files do not count.
const maxPackageLines = 8000

// maxFunctionLines bounds a function of the packages in shortFunctions:
// the lines of its body, from its opening brace to its closing one. A
// function longer than that is steps that want names.
const maxFunctionLines = 100

// shortFunctions are the packages (with those below them) whose every
// function, tests aside, stays within maxFunctionLines: the command's
// shell and the benchmarks, where the project's longest functions were.
var shortFunctions = []string{"cli", "internal/bench"}

// generatedLine is the line that marks a generated Go file
// (https://go.dev/s/generatedcode), before the package clause.
var generatedLine = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)

// goSource says whether a file of a package's listing is source that
// counts: not a test, not generated, not a program kept beside the
// package and built only by hand (//go:build ignore).
func goSource(path string) (bool, error) {
	if strings.HasSuffix(path, "_test.go") {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case generatedLine.MatchString(line), line == "//go:build ignore":
			return false, nil
		case strings.HasPrefix(line, "package "):
			return true, nil
		}
	}
	return true, sc.Err()
}

// packageLines counts the lines of a package's source files (goSource)
// among files, in dir.
func packageLines(dir string, files []string) (int, error) {
	n := 0
	for _, name := range files {
		path := filepath.Join(dir, name)
		ok, err := goSource(path)
		if err != nil || !ok {
			if err != nil {
				return 0, err
			}
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		n += strings.Count(string(b), "\n")
		if len(b) > 0 && b[len(b)-1] != '\n' {
			n++
		}
	}
	return n, nil
}

// TestPackageSize: no package of the module has more than
// maxPackageLines lines of source, tests and generated files aside.
func TestPackageSize(t *testing.T) {
	pkgs := goList(t, module+"/...")
	largest, largestLines := "", 0
	for _, p := range pkgs {
		files := append(append(append([]string(nil), p.GoFiles...), p.CgoFiles...), p.IgnoredGoFiles...)
		n, err := packageLines(p.Dir, files)
		if err != nil {
			t.Fatalf("%s: %v", p.ImportPath, err)
		}
		if n > largestLines {
			largest, largestLines = p.ImportPath, n
		}
		if n > maxPackageLines {
			t.Errorf("%s has %d lines of source (tests and generated files aside), over %d: split it where its parts no longer need each other", p.ImportPath, n, maxPackageLines)
		}
	}
	if largestLines == 0 {
		t.Fatalf("counted no lines in %d packages", len(pkgs))
	}
	t.Logf("largest package: %s, %d lines", largest, largestLines)
}

// longFunctions returns the functions of the files whose bodies run over
// limit lines, as "file:line: name is N lines", methods named
// Type.Method.
func longFunctions(fset *token.FileSet, files []*ast.File, limit int) []string {
	var long []string
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			open, end := fset.Position(fn.Body.Lbrace), fset.Position(fn.Body.Rbrace)
			if n := end.Line - open.Line + 1; n > limit {
				long = append(long, fmt.Sprintf("%s:%d: %s is %d lines", filepath.Base(open.Filename), open.Line, funcName(fn), n))
			}
		}
	}
	sort.Strings(long)
	return long
}

// funcName is fn's name, a method's with its receiver's type.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	if idx, ok := t.(*ast.IndexExpr); ok { // a generic type's method
		t = idx.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}

// TestFunctionLength: no function of the packages of shortFunctions,
// tests aside, is over maxFunctionLines lines.
func TestFunctionLength(t *testing.T) {
	checked := 0
	for _, p := range goList(t, module+"/...") {
		r, _ := rel(p.ImportPath)
		if !inAny(r, shortFunctions) {
			continue
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range append(append([]string(nil), p.GoFiles...), p.CgoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
			checked++
		}
		for _, l := range longFunctions(fset, files, maxFunctionLines) {
			t.Errorf("%s: %s, over %d: split it into steps that say what they do", r, l, maxFunctionLines)
		}
	}
	if checked == 0 {
		t.Fatalf("no file of %v: the list in size_test.go is out of date", shortFunctions)
	}
}

// TestPackageLinesCounts: the count takes a package's source files,
// each line once (a last line without a newline too), and leaves out
// tests, generated files (the marker before the package clause only) and
// programs built by hand.
func TestPackageLinesCounts(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.go":         "package p\n\nfunc A() {}\n\n// two more\n",                                              // 5
		"b.go":         "package p\n\nvar B = 1",                                                                 // 3, no newline at the end
		"late.go":      "package p\n\n// Code generated by hand. DO NOT EDIT.\nvar Late = 1\n",                   // 4: the marker after the package clause is a comment
		"gen.go":       "// Code generated by stringer. DO NOT EDIT.\n\npackage p\n" + strings.Repeat("\n", 500), // left out
		"tool.go":      "//go:build ignore\n\npackage main\n" + strings.Repeat("\n", 500),                        // left out
		"p_test.go":    "package p\n" + strings.Repeat("\n", 500),                                                // left out
		"notgo.go.txt": "not listed",
	}
	var names []string
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, ".go") {
			names = append(names, name)
		}
	}
	n, err := packageLines(dir, names)
	if err != nil {
		t.Fatal(err)
	}
	if n != 5+3+4 {
		t.Errorf("packageLines = %d, want %d", n, 5+3+4)
	}
}

// TestLongFunctionsFound: a body of 101 lines (braces included) is over
// the limit of 100, one of 100 is not, and methods are named by their
// receiver's type, pointer or generic.
func TestLongFunctionsFound(t *testing.T) {
	body := func(lines int) string { // lines from the opening brace to the closing one
		return "{\n" + strings.Repeat("\t_ = 0\n", lines-2) + "}\n"
	}
	src := "package p\n\ntype T struct{}\ntype G[X any] struct{}\n\n" +
		"func atLimit() " + body(100) +
		"func overLimit() " + body(101) +
		"func (t *T) method() " + body(150) +
		"func (g G[X]) generic() " + body(102) +
		"func short() " + body(3) +
		"func declared()\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := longFunctions(fset, []*ast.File{f}, 100)
	// Lines: 6 starts atLimit (100 lines), 106 overLimit (101), 207 the
	// method (150), 357 the generic one (102).
	want := []string{"p.go:106: overLimit is 101 lines", "p.go:207: T.method is 150 lines", "p.go:357: G.generic is 102 lines"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("longFunctions:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}
