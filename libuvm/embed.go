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
// their paths in this directory, and the headers it installs.
//
//go:embed src/*.c src/*.h include/*.h preload/preload.c preload/jemalloc_abi.h
var sources embed.FS

// PreloadName is the file name of the preload library.
const PreloadName = "libuvm-preload.so"

// buildVersion names the layout of a build; a change to how the builder
// works (not to the sources or flags, which are hashed) bumps it.
const buildVersion = "softuvm-preload-build-2"

// The Makefile's flags (LIBUVM_CFLAGS less the warnings, which change no
// code, and less -DUVM_BINDIR, whose value there is by default the one
// session.c falls back to), with the include directories relative to the
// build directory the sources are written into.
var (
	compileFlags = []string{"-O2", "-std=gnu11", "-fPIC", "-fvisibility=hidden", "-pthread", "-Iinclude"}
	preloadFlags = []string{"-Isrc"} // preload.c only, as in the Makefile
	// Never -ljemalloc: preload.c declares what it uses of jemalloc
	// (preload/jemalloc_abi.h) and loads libjemalloc.so.2 with dlopen
	// when a program starts, so that building needs no jemalloc and
	// jemalloc's constructor and fork handlers come after the core's.
	linkFlags = []string{"-shared", "-pthread", "-Wl,-soname," + PreloadName}
)

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
// sources, building it first if the cache holds none for these sources
// and flags. A build is written into a
// temporary directory beside the builds and renamed into place, so that
// concurrent callers see either no library or a whole one (each may
// build; the last rename wins, and a program that already mapped an
// earlier file keeps it).
//
// With no C compiler the error wraps ErrNoCompiler; a command that fails
// gives a *BuildError with the compiler's output.
func Preload(opt Options) (string, error) {
	root, cc, err := cacheAndCompiler(opt)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, buildKey(cc[1:]))
	if err := cached(opt, root, dir, PreloadName, func(tmp string) error { return build(cc, tmp, false) }); err != nil {
		return "", err
	}
	return filepath.Join(dir, PreloadName), nil
}

// StaticDir returns a directory holding libuvm.a, the library built from
// the embedded sources (without the preload's interposer), with uvm.h and
// uvm_cuda.h in its include/: what a C program that uses the API links
// with, cc -I DIR/include prog.c DIR/libuvm.a -pthread -lm (the
// benchmarks build their C programs so). It builds it first when the
// cache holds none for these sources and flags, as Preload does; the
// errors are Preload's.
func StaticDir(opt Options) (string, error) {
	root, cc, err := cacheAndCompiler(opt)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "static-"+buildKey(cc[1:]))
	if err := cached(opt, root, dir, "", func(tmp string) error { return build(cc, tmp, true) }); err != nil {
		return "", err
	}
	return dir, nil
}

// cached makes dir hold a build, building it first when it does not: into
// a temporary directory beside it, then moved into place, so that
// concurrent callers see either nothing or a whole build (each may build;
// the last move wins, and a program that mapped an earlier file keeps it).
// product is the one file of the build that moves into dir; "" moves the
// whole directory (libuvm.a and its headers), which a concurrent build
// that got there first leaves as it is, as good as this one.
func cached(opt Options, root, dir, product string, buildInto func(tmp string) error) error {
	done := filepath.Join(dir, product)
	if product == "" {
		done = filepath.Join(dir, "libuvm.a")
	}
	if fi, err := os.Stat(done); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	if opt.Building != nil {
		opt.Building(dir)
	}
	tmp, err := os.MkdirTemp(root, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := buildInto(tmp); err != nil {
		return err
	}
	if product == "" {
		if err := os.Rename(tmp, dir); err != nil {
			if _, serr := os.Stat(done); serr != nil {
				return err
			}
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Rename(filepath.Join(tmp, product), done)
}

// cacheAndCompiler is the cache directory, made, and the C compiler.
func cacheAndCompiler(opt Options) (string, []string, error) {
	root := opt.CacheDir
	if root == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", nil, fmt.Errorf("no cache directory to build libuvm into: %v (set XDG_CACHE_HOME or HOME)", err)
		}
		root = filepath.Join(base, "softuvm")
	}
	cc, err := compiler()
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", nil, err
	}
	removeStaleBuilds(root)
	return root, cc, nil
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

// Compiler is the C compiler Preload, BuildProgram and BuildLibrary use:
// $CC (split at spaces, as make would pass it to the shell, so "ccache
// gcc" works), else cc, else gcc, with its program resolved in PATH. With
// none, the error wraps ErrNoCompiler.
func Compiler() ([]string, error) { return compiler() }

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

// buildKey names a build: a hash of the builder's version, the sources
// (paths and contents), the flags and any in $CC after the program.
func buildKey(ccArgs []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", buildVersion)
	for _, name := range sourceNames() {
		b, _ := sources.ReadFile(name) // listed from sources: cannot fail
		fmt.Fprintf(h, "file %q %d\n", name, len(b))
		h.Write(b)
	}
	for _, f := range [][]string{ccArgs, compileFlags, preloadFlags, linkFlags} {
		fmt.Fprintf(h, "flags %q\n", f)
	}
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
// there, or (static) dir/libuvm.a without the preload's object: one object
// per C file, as many compilers at once as CPUs, then the link (ar).
func build(cc []string, dir string, static bool) error {
	var units []string
	for _, name := range sourceNames() {
		b, _ := sources.ReadFile(name)
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		if strings.HasSuffix(name, ".c") && !(static && name == "preload/preload.c") {
			units = append(units, name)
		}
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
	if static {
		cmd := exec.Command("ar", append([]string{"rcs", "libuvm.a"}, objs...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return &BuildError{Command: "ar rcs libuvm.a " + strings.Join(objs, " "), Err: err, Output: string(out)}
		}
		return nil
	}
	args := append(append([]string(nil), linkFlags...), "-o", PreloadName)
	args = append(args, objs...)
	return run(args...)
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
