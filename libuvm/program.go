package libuvm

import (
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildProgramWithLibuvm compiles the C program src, which includes
// <uvm.h>, into the executable bin, linked with the libuvm.a StaticDir
// builds from the sources inside this binary (opt as StaticDir takes
// it): the program carries its own libuvm, built from exactly the
// sources of this uvm, so that it speaks this uvm's wire protocol
// whatever libuvm is installed. The program is compiled -O2 -g, so that
// a crash report names its kernels. With no C compiler the error wraps
// ErrNoCompiler; a failed command is a *BuildError with the compiler's
// output.
func BuildProgramWithLibuvm(opt Options, bin, src string) error {
	lib, err := StaticDir(opt)
	if err != nil {
		return err
	}
	cc, err := compiler()
	if err != nil {
		return err
	}
	args := append(cc[1:len(cc):len(cc)], "-O2", "-g", "-std=gnu11", "-pthread", "-I", filepath.Join(lib, "include"),
		"-o", bin, src, filepath.Join(lib, "libuvm.a"), "-pthread", "-lm")
	if out, err := exec.Command(cc[0], args...).CombinedOutput(); err != nil {
		return &BuildError{Command: strings.Join(append(cc[:1:1], args...), " "), Err: err, Output: string(out)}
	}
	return nil
}
