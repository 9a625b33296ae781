package lint

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/softuvm/softuvm/libuvm"
)

// cFile is what one of libuvm's C files defines and calls.
type cFile struct {
	defines map[string]bool // functions defined at the top level
	calls   map[string]bool // identifiers called in function bodies
}

// stripC blanks C comments, string and character literals and
// preprocessor lines, keeping the lines where they were.
func stripC(src string) string {
	var b strings.Builder
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				end = len(src) - i - 2
			}
			for _, r := range src[i : i+2+end+2] {
				if r == '\n' {
					b.WriteByte('\n')
				}
			}
			i += 2 + end + 1
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
			b.WriteByte('\n')
		case c == '"' || c == '\'':
			b.WriteByte(' ')
			for i++; i < len(src) && src[i] != c; i++ {
				if src[i] == '\\' {
					i++
				}
			}
		case c == '#' && (i == 0 || src[i-1] == '\n'):
			// A directive, with its continuation lines.
			for i < len(src) && (src[i] != '\n' || src[i-1] == '\\') {
				i++
			}
			b.WriteByte('\n')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// notCalls are the words followed by a parenthesis that call nothing.
var notCalls = map[string]bool{
	"if": true, "for": true, "while": true, "switch": true, "return": true, "sizeof": true, "_Alignas": true, "_Static_assert": true,
	"__attribute__": true, "alignof": true, "_Alignof": true, "__builtin_expect": true, "typeof": true, "__typeof__": true,
}

// parseC finds the top-level function definitions of a C file (a name
// and its parameter list, then a body, at brace depth 0) and every
// identifier called in a body.
func parseC(src string) cFile {
	s := stripC(src)
	f := cFile{defines: map[string]bool{}, calls: map[string]bool{}}
	depth, parens := 0, 0
	// At depth 0: the first name followed by '(' in the current
	// declaration, and whether an '=' came before it (an initializer).
	// body: the braces open at depth 0 are a function's body, not an
	// initializer's.
	candidate, assigned, body := "", false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isIdent(c) && (i == 0 || !isIdent(s[i-1])):
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
				k++
			}
			if k < len(s) && s[k] == '(' && !notCalls[word] && (word[0] < '0' || word[0] > '9') {
				if depth > 0 {
					if body {
						f.calls[word] = true
					}
				} else if parens == 0 && candidate == "" && !assigned {
					candidate = word
				}
			}
			i = j - 1
		case c == '(':
			parens++
		case c == ')':
			parens--
		case c == '=' && depth == 0 && parens == 0:
			assigned = true
		case c == ';' && depth == 0:
			candidate, assigned = "", false
		case c == '{':
			if depth == 0 {
				body = candidate != "" && !assigned
				if body {
					f.defines[candidate] = true
				}
			}
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				candidate, assigned = "", false
			}
		}
	}
	return f
}

// libuvmFiles parses every C file of libuvm/src and the preload library,
// by the name the layers give them.
func libuvmFiles(t *testing.T) map[string]cFile {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", "libuvm")) // tests run in their package's directory
	require(t, err)
	paths, err := filepath.Glob(filepath.Join(root, "src", "*.c"))
	require(t, err)
	paths = append(paths, filepath.Join(root, "preload", "preload.c"))
	files := map[string]cFile{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require(t, err)
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)] = parseC(string(b))
	}
	return files
}

func require(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLibuvmLayers: libuvm's C files call each other one way, down the
// layers libuvm.SourceLayers lists (libuvm/layers.go says why): a file
// calls only functions of files in lower layers, none of its own
// layer's other files, and every file is in a layer.
func TestLibuvmLayers(t *testing.T) {
	files := libuvmFiles(t)
	layerOf := map[string]int{}
	for i, layer := range libuvm.SourceLayers {
		for _, f := range layer {
			if _, ok := files[f]; !ok {
				t.Errorf("libuvm.SourceLayers names %s, which is not a C file of libuvm", f)
			}
			layerOf[f] = i
		}
	}
	definedIn := map[string]string{}
	var names []string
	for name, f := range files {
		names = append(names, name)
		if _, ok := layerOf[name]; !ok {
			t.Errorf("%s is in no layer: add it to libuvm.SourceLayers (libuvm/layers.go)", name)
		}
		for fn := range f.defines {
			definedIn[fn] = name
		}
	}
	sort.Strings(names)
	for _, name := range names {
		var bad []string
		for fn := range files[name].calls {
			to, ok := definedIn[fn]
			if !ok || files[name].defines[fn] { // a static function of its own, whatever others call theirs
				continue
			}
			if layerOf[to] >= layerOf[name] {
				bad = append(bad, fmt.Sprintf("%s (%s, layer %d)", fn, to, layerOf[to]))
			}
		}
		sort.Strings(bad)
		for _, b := range bad {
			t.Errorf("%s (layer %d) calls %s: calls run down the layers only (libuvm/layers.go)", name, layerOf[name], b)
		}
	}
}

// TestParseC: the parser finds definitions and calls, and not the words
// of comments, strings, declarations and initializers.
func TestParseC(t *testing.T) {
	f := parseC(`#include "x.h"
static int helper(int a); /* decl(not) */
static struct s table[2] = {{.f = init(1)}};
UVM_HIDDEN uvmError_t uvm__thing(int a, const char *s)
{
	if (a) return other("call(in string)") + helper(a);
	return sizeof(a) + (int)callee ( 2 );
}
static void helper2(void) __attribute__((noreturn));
static int helper(int a) { return a; }
`)
	for _, want := range []string{"uvm__thing", "helper"} {
		if !f.defines[want] {
			t.Errorf("%s not found defined: %v", want, f.defines)
		}
	}
	for _, not := range []string{"decl", "init", "helper2", "table", "other", "callee"} {
		if f.defines[not] {
			t.Errorf("%s taken for a definition", not)
		}
	}
	for _, want := range []string{"other", "helper", "callee"} {
		if !f.calls[want] {
			t.Errorf("%s not found called: %v", want, f.calls)
		}
	}
	for _, not := range []string{"call", "if", "sizeof", "init", "decl"} {
		if f.calls[not] {
			t.Errorf("%s taken for a call", not)
		}
	}
}
