package libuvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildProgramWithLibuvm compiles the C program src, which includes
// <uvm.h>, together with libuvm's sources built into this binary, into
// the executable bin: the program carries its own libuvm, built from
// exactly the sources of this uvm, so that it speaks this uvm's wire
// protocol whatever libuvm is installed. It uses the C compiler Preload
// uses, with the Makefile's flags for libuvm (less -fvisibility=hidden,
// which changes nothing in a program) and -g, so that a crash report
// names its kernels. With no C compiler the error wraps ErrNoCompiler;
// a failed command is a *BuildError with the compiler's output.
func BuildProgramWithLibuvm(bin, src string) error {
	cc, err := compiler()
	if err != nil {
		return err
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return err
	}
	if src, err = filepath.Abs(src); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "softuvm-program-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	units, err := writeSources(dir)
	if err != nil {
		return err
	}
	args := append(cc[1:len(cc):len(cc)], "-O2", "-g", "-std=gnu11", "-pthread", "-Iinclude", "-o", bin, src)
	for _, u := range units {
		if strings.HasPrefix(u, "src/") { // not the preload library's interposer
			args = append(args, u)
		}
	}
	cmd := exec.Command(cc[0], args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return &BuildError{Command: strings.Join(append(cc[:1:1], args...), " "), Err: err, Output: string(out)}
	}
	return nil
}
