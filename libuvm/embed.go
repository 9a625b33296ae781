package libuvm

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// sources are the files the Makefile builds libuvm-preload.so from, under
// their paths in this directory.
//
//go:embed src/*.c src/*.h include/uvm.h preload/preload.c
var sources embed.FS

// PreloadName is the file name of the preload library.
const PreloadName = "libuvm-preload.so"

// buildVersion names the layout of a build; a change to how the builder
// works (not to the sources or flags, which are hashed) bumps it.
const buildVersion = "softuvm-preload-build-1"

// The Makefile's flags (LIBUVM_CFLAGS less the warnings, which change no
// code, and less -DUVM_BINDIR, whose value there is by default the one
// session.c falls back to), with the include directories relative to the
// build directory the sources are written into.
var (
	compileFlags = []string{"-O2", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-pthread", "-Iinclude"}
	preloadFlags = []string{"-Isrc"} // preload.c only, as in the Makefile
	linkFlags    = []string{"-shared", "-pthread", "-Wl,-soname," + PreloadName}
	// With jemalloc's header: preload.c only. It is never linked with
	// jemalloc: it loads libjemalloc.so.2 with dlopen at run time, so that
	// jemalloc's constructor and fork handlers come after the core's.
	jemallocDefine = "-DUVM_PRELOAD_JEMALLOC"
)

// jemallocProbe is the file whose compiling says that jemalloc's header
// is there.
const jemallocProbe = "#include <jemalloc/jemalloc.h>\n"

// ErrNoCompiler is what Preload's error wraps when it finds no C compiler.
var ErrNoCompiler = errors.New("no C compiler")

// BuildError is a failed compiler command: the command and what the
// compiler said.
type BuildError struct {
	Command string // the command line, in the build directory
	Err     error  // how it ended: an exit status, usually
	Output  string // the compiler's standard output and error
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("%s: %v\n%s", e.Command, e.Err, strings.TrimRight(e.Output, "\n"))
}

func (e *BuildError) Unwrap() error { return e.Err }

// Options are Preload's choices; the zero value is the default.
type Options struct {
	// CacheDir holds the builds, one subdirectory each; default
	// os.UserCacheDir()/softuvm.
	CacheDir string
	// Building, if not nil, is called before a build starts, with the
	// directory the library will be in: a build takes seconds.
	Building func(dir string)
}

// Preload returns the path of libuvm-preload.so built from the embedded
// sources, building it first if the cache holds none for these sources,
// flags and C compiler's view of jemalloc. A build is written into a
// temporary directory beside the builds and renamed into place, so that
// concurrent callers see either no library or a whole one (each may
// build; the last rename wins, and a program that already mapped an
// earlier file keeps it).
//
// With no C compiler the error wraps ErrNoCompiler; a command that fails
// gives a *BuildError with the compiler's output.
func Preload(opt Options) (string, error) {
	root := opt.CacheDir
	if root == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache directory to build %s into: %v (set XDG_CACHE_HOME or HOME)", PreloadName, err)
		}
		root = filepath.Join(base, "softuvm")
	}
	cc, err := compiler()
	if err != nil {
		return "", err
	}
	jemalloc, err := haveJemalloc(cc)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, buildKey(cc[1:], jemalloc))
	lib := filepath.Join(dir, PreloadName)
	if fi, err := os.Stat(lib); err == nil && fi.Mode().IsRegular() {
		return lib, nil
	}
	if opt.Building != nil {
		opt.Building(dir)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	removeStaleBuilds(root)
	tmp, err := os.MkdirTemp(root, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := build(cc, tmp, jemalloc); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, PreloadName), lib); err != nil {
		return "", err
	}
	return lib, nil
}

// BuildProgram compiles the one C source file src (-O2) into the
// executable bin with the C compiler Preload uses. With no C compiler
// the error wraps ErrNoCompiler; a failed command is a *BuildError with
// the compiler's output.
func BuildProgram(bin, src string) error { return buildOne(bin, src) }

// BuildLibrary compiles the one C source file src (-O2 -fPIC) into the
// shared library lib, for LD_PRELOAD, as BuildProgram builds programs.
func BuildLibrary(lib, src string) error { return buildOne(lib, src, "-shared", "-fPIC") }

func buildOne(out, src string, flags ...string) error {
	cc, err := compiler()
	if err != nil {
		return err
	}
	args := append(append(cc[1:len(cc):len(cc)], flags...), "-O2", "-o", out, src)
	if out, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
		return &BuildError{Command: strings.Join(append(cc[:1:1], args...), " "), Err: err, Output: string(out)}
	}
	return nil
}

// compiler is the C compiler's command: $CC (split at spaces, as make
// would pass it to the shell, so "ccache gcc" works), else cc, else gcc,
// with its program resolved in PATH.
func compiler() ([]string, error) {
	if env := os.Getenv("CC"); strings.TrimSpace(env) != "" {
		cc := strings.Fields(env)
		p, err := exec.LookPath(cc[0])
		if err != nil {
			return nil, fmt.Errorf("%w: CC=%s: %v", ErrNoCompiler, env, err)
		}
		cc[0] = p
		return cc, nil
	}
	for _, name := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(name); err == nil {
			return []string{p}, nil
		}
	}
	return nil, fmt.Errorf("%w: CC is not set, and neither cc nor gcc is in PATH", ErrNoCompiler)
}

// haveJemalloc says whether cc compiles the jemalloc probe.
func haveJemalloc(cc []string) (bool, error) {
	dir, err := os.MkdirTemp("", "softuvm-jemalloc-")
	if err != nil {
		return false, fmt.Errorf("checking for jemalloc: %v", err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "probe.c"), []byte(jemallocProbe), 0o644); err != nil {
		return false, fmt.Errorf("checking for jemalloc: %v", err)
	}
	cmd := exec.Command(cc[0], append(cc[1:], "-fsyntax-only", "probe.c")...)
	cmd.Dir = dir
	return cmd.Run() == nil, nil
}

// buildKey names a build: a hash of the builder's version, the sources
// (paths and contents), the flags, any in $CC after the program, and
// whether jemalloc is used.
func buildKey(ccArgs []string, jemalloc bool) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", buildVersion)
	for _, name := range sourceNames() {
		b, _ := sources.ReadFile(name) // listed from sources: cannot fail
		fmt.Fprintf(h, "file %q %d\n", name, len(b))
		h.Write(b)
	}
	for _, f := range [][]string{ccArgs, compileFlags, preloadFlags, linkFlags, {jemallocDefine}} {
		fmt.Fprintf(h, "flags %q\n", f)
	}
	fmt.Fprintf(h, "jemalloc %t\n", jemalloc)
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// sourceNames are the embedded files' paths, sorted.
func sourceNames() []string {
	var names []string
	fs.WalkDir(sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return err
	})
	sort.Strings(names)
	return names
}

// build writes the sources into dir and builds dir/libuvm-preload.so
// there: one object per C file, as many compilers at once as CPUs, then
// the link.
func build(cc []string, dir string, jemalloc bool) error {
	units, err := writeSources(dir)
	if err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "obj"), 0o755); err != nil {
		return err
	}
	run := func(args ...string) error {
		cmd := exec.Command(cc[0], append(cc[1:], args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return &BuildError{Command: strings.Join(append(cc[:1:1], append(cc[1:], args...)...), " "), Err: err, Output: string(out)}
		}
		return nil
	}
	objs := make([]string, len(units))
	errs := make([]error, len(units))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, unit := range units {
		objs[i] = path.Join("obj", strings.ReplaceAll(strings.TrimSuffix(unit, ".c"), "/", "_")+".o")
		args := append([]string(nil), compileFlags...)
		if unit == "preload/preload.c" {
			args = append(args, preloadFlags...)
			if jemalloc {
				args = append(args, jemallocDefine)
			}
		}
		args = append(args, "-c", "-o", objs[i], unit)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = run(args...)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the first file's: a broken header breaks them all alike
		}
	}
	args := append(append([]string(nil), linkFlags...), "-o", PreloadName)
	args = append(args, objs...)
	return run(args...)
}

// writeSources writes the embedded files into dir under their paths,
// and returns the paths of the C files among them.
func writeSources(dir string) ([]string, error) {
	var units []string
	for _, name := range sourceNames() {
		b, _ := sources.ReadFile(name)
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
		if strings.HasSuffix(name, ".c") {
			units = append(units, name)
		}
	}
	return units, nil
}

// removeStaleBuilds removes temporary build directories an hour old or
// more: those of builds that were killed (a Ctrl-C during a first run).
func removeStaleBuilds(root string) {
	old, _ := filepath.Glob(filepath.Join(root, ".build-*"))
	for _, p := range old {
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.RemoveAll(p)
		}
	}
}
