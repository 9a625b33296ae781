package uvm

import (
	"fmt"
	"reflect"
	"sync"
	"unsafe"
)

// TypedKernel is a kernel that receives its launch's parameters as a
// value of type P (RegisterTypedKernel). Like a Kernel, it runs once for
// each thread index tid in [0, nthreads).
//
// A launch's parameters are bytes (Launch); LaunchTyped makes them from
// a P, and the kernel gets them back as one. The bytes are the memory of
// the C struct with P's fields in P's order, what the C library's
// uvmLaunchKernel copies from a pointer to that struct and its sizeof:
// one parameter block means the same to a Go kernel and to a C one, a Go
// kernel can hand a pointer to its parameters to C code (cgo), and a
// launch from bytes built the C way reaches a typed kernel intact.
//
//   - P is plain (see SliceAt): bools, integers, uintptr,
//     floating-point and complex numbers, and arrays and structs of them.
//     A pointer would mean nothing in the device's process: pass
//     addresses as uintptr, and reach them with SliceAt.
//   - Each field lies at its offset in Go's layout of P, which is C's:
//     every field aligned to its size (to its element's for arrays and
//     complex numbers, to its most aligned field's for structs), and the
//     struct's size rounded up to its alignment. The gc compiler lays out
//     structs so on the 64-bit platforms softuvm runs on; a first field
//     of type structs.HostLayout makes it a promise.
//   - Numbers are in the host's byte order, as C stores them:
//     little-endian on amd64 and arm64.
//   - Padding is zero.
//
// The C types of the Go ones: bool is bool (_Bool, 0 or 1); int8 to
// int64 and uint8 to uint64 are int8_t to uint64_t; int and uint are 8
// bytes (int64_t and uint64_t, not C's int); uintptr is uintptr_t;
// float32 and float64 are float and double; complex64 and complex128 are
// float _Complex and double _Complex; [n]T is T[n]. A struct whose last
// field has size 0 is refused: Go pads a struct past such a field and C
// does not, so the sizes would differ.
type TypedKernel[P any] func(tid, nthreads int, p P)

// Not encoding/binary: it packs fields without padding, which is the
// layout of no C struct with fields of mixed sizes, and it refuses int,
// uint and uintptr. Copying the value's memory is the C layout, and
// costs a memmove per thread.

// paramLayout is what encoding and decoding a parameter type needs.
type paramLayout struct {
	typ  reflect.Type
	size int
	// runs are the bytes that hold values, adjacent ones merged; the
	// others are padding.
	runs []span
	// bools are the offsets of the bools: a byte other than 0 or 1 from
	// C is read as true.
	bools []uintptr
}

type span struct{ start, end uintptr }

var paramLayouts sync.Map // reflect.Type → *paramLayout

// layoutOf checks that t may be a kernel's parameter type and returns its
// layout. The error names t, and its callers wrap it in ErrInvalidValue
// and what they were doing.
func layoutOf(t reflect.Type) (*paramLayout, error) {
	if v, ok := paramLayouts.Load(t); ok {
		return v.(*paramLayout), nil
	}
	if path, part, ok := pointerPart(t); !ok {
		return nil, fmt.Errorf("kernel parameters of type %v: %s; parameters are copied as bytes into the device's process, where a pointer into this one means nothing (pass addresses as uintptr): %s",
			t, describeNotPlain(t, path, part), plainRule)
	}
	if t.Size() > MaxKernelParams {
		return nil, fmt.Errorf("kernel parameters of type %v are %d bytes: at most MaxKernelParams, %d bytes",
			t, t.Size(), MaxKernelParams)
	}
	l := &paramLayout{typ: t, size: int(t.Size())}
	if err := l.walk(t, 0, ""); err != nil {
		return nil, err
	}
	v, _ := paramLayouts.LoadOrStore(t, l)
	return v.(*paramLayout), nil
}

// walk adds the values of a t at off to the layout.
func (l *paramLayout) walk(t reflect.Type, off uintptr, path string) error {
	switch t.Kind() {
	case reflect.Array:
		e := t.Elem()
		if e.Size() == 0 || t.Len() == 0 {
			return nil
		}
		if k := e.Kind(); k != reflect.Bool && k != reflect.Array && k != reflect.Struct {
			// Numbers, back to back: one run.
			l.addRun(off, off+t.Size())
			return nil
		}
		for i := range t.Len() {
			if err := l.walk(e, off+uintptr(i)*e.Size(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	case reflect.Struct:
		n := t.NumField()
		if n == 0 {
			return nil
		}
		if last := t.Field(n - 1); last.Type.Size() == 0 && roundUp(last.Offset, uintptr(t.Align())) != t.Size() {
			what := "the struct"
			if path != "" {
				what = partName(path) + ", a struct,"
			}
			return fmt.Errorf("kernel parameters of type %v: %s ends with the zero-size field %s, past which Go pads it to %d bytes where C has %d: put zero-size fields (structs.HostLayout) first",
				l.typ, what, last.Name, t.Size(), roundUp(last.Offset, uintptr(t.Align())))
		}
		for i := range n {
			f := t.Field(i)
			if err := l.walk(f.Type, off+f.Offset, path+"."+f.Name); err != nil {
				return err
			}
		}
		return nil
	case reflect.Bool:
		l.bools = append(l.bools, off)
	}
	// A number (pointerPart refused the rest).
	l.addRun(off, off+t.Size())
	return nil
}

// addRun adds the value bytes [start, end), after every run so far.
func (l *paramLayout) addRun(start, end uintptr) {
	if k := len(l.runs); k > 0 && l.runs[k-1].end == start {
		l.runs[k-1].end = end
	} else {
		l.runs = append(l.runs, span{start, end})
	}
}

func roundUp(n, align uintptr) uintptr { return (n + align - 1) / align * align }

// encode returns the bytes of the value at p, padding zeroed.
func (l *paramLayout) encode(p unsafe.Pointer) []byte {
	if l.size == 0 {
		return nil
	}
	src := unsafe.Slice((*byte)(p), l.size)
	b := make([]byte, l.size)
	for _, r := range l.runs {
		copy(b[r.start:r.end], src[r.start:r.end])
	}
	return b
}

// decode fills the value at p, which is zero, from b, which has l.size
// bytes.
func (l *paramLayout) decode(p unsafe.Pointer, b []byte) {
	if l.size == 0 {
		return
	}
	dst := unsafe.Slice((*byte)(p), l.size)
	for _, r := range l.runs {
		copy(dst[r.start:r.end], b[r.start:r.end])
	}
	for _, off := range l.bools {
		if dst[off] > 1 {
			dst[off] = 1
		}
	}
}

// EncodeKernelParams returns the bytes a launch of a typed kernel with
// parameters p carries: the memory of the C struct with P's fields (see
// TypedKernel for the layout). LaunchTyped uses it; a program uses it to
// launch a byte Kernel that reads a C struct, or to see the layout. The
// error wraps ErrInvalidValue and names P: P holds a pointer, is larger
// than MaxKernelParams, or ends with a zero-size field.
func EncodeKernelParams[P any](p P) ([]byte, error) {
	l, err := layoutOf(reflect.TypeFor[P]())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidValue, err)
	}
	return l.encode(unsafe.Pointer(&p)), nil
}

// DecodeKernelParams is the inverse of EncodeKernelParams: the value of
// type P that the bytes b of a launch stand for. b must have exactly
// sizeof(P) bytes; padding in it is ignored, and a bool's byte other
// than 0 is true.
func DecodeKernelParams[P any](b []byte) (P, error) {
	var p P
	t := reflect.TypeFor[P]()
	l, err := layoutOf(t)
	if err != nil {
		return p, fmt.Errorf("%w: %v", ErrInvalidValue, err)
	}
	if len(b) != l.size {
		return p, fmt.Errorf("%w: kernel parameters of type %v are %d bytes, not %d", ErrInvalidValue, t, l.size, len(b))
	}
	l.decode(unsafe.Pointer(&p), b)
	return p, nil
}

// typedKernels maps the names of typed kernels to their parameter types,
// for LaunchTyped to check.
var typedKernels sync.Map // string → reflect.Type

// RegisterTypedKernel makes a kernel with parameters of type P launchable
// by name, as RegisterKernel does a byte kernel: call it from an init
// function. LaunchTyped launches it with a value of type P, Launch with
// P's bytes (see EncodeKernelParams and TypedKernel).
// Each thread decodes the launch's bytes into its own P, a copy of
// sizeof(P) bytes: keep parameters small, and pass arrays by address. A
// launch whose bytes are not sizeof(P) long fails in the kernel, and the
// next synchronize reports it as ErrLaunchFailure.
//
// The error wraps ErrInvalidValue: P is not plain (it holds a pointer, a
// string, a slice...), is larger than MaxKernelParams, or ends with a
// zero-size field; or the name is invalid or taken.
func RegisterTypedKernel[P any](name string, k TypedKernel[P]) error {
	decode, err := typedDecoder[P]("kernel", name)
	if err != nil {
		return err
	}
	var bk Kernel
	if k != nil {
		bk = func(tid, nthreads int, params []byte) { k(tid, nthreads, decode(params)) }
	}
	if err := RegisterKernel(name, bk); err != nil {
		return err
	}
	typedKernels.Store(name, reflect.TypeFor[P]())
	return nil
}

// typedDecoder checks that P can be a kernel's parameters and returns
// what turns a launch's bytes into a P; it panics, failing the kernel,
// where they are not sizeof(P) long. what and name say whose parameters.
func typedDecoder[P any](what, name string) (func(params []byte) P, error) {
	t := reflect.TypeFor[P]()
	l, err := layoutOf(t)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q: %v", ErrInvalidValue, what, name, err)
	}
	return func(params []byte) P {
		if len(params) != l.size {
			panic(fmt.Sprintf("%s %q takes %d bytes of parameters (a %v), the launch passed %d", what, name, l.size, t, len(params)))
		}
		var p P
		l.decode(unsafe.Pointer(&p), params)
		return p
	}, nil
}

// typedParams encodes p for a launch of the kernel registered as name in
// registry (typedKernels or typedGridKernels), which must take a P if it
// was registered typed. what says which kind of kernel.
func typedParams[P any](registry *sync.Map, what, name string, p P) ([]byte, error) {
	t := reflect.TypeFor[P]()
	if v, ok := registry.Load(name); ok && v.(reflect.Type) != t {
		return nil, fmt.Errorf("%w: launch of %s %q with parameters of type %v: it takes %v", ErrInvalidValue, what, name, t, v)
	}
	l, err := layoutOf(t)
	if err != nil {
		return nil, fmt.Errorf("%w: launch of %s %q: %v", ErrInvalidValue, what, name, err)
	}
	return l.encode(unsafe.Pointer(&p)), nil
}

// MustRegisterTypedKernel is RegisterTypedKernel for init functions: it
// panics on error, which there is a programming error.
func MustRegisterTypedKernel[P any](name string, k TypedKernel[P]) {
	if err := RegisterTypedKernel(name, k); err != nil {
		panic(err)
	}
}

// LaunchTyped is Session.Launch with parameters given as a Go value: it
// runs kernel name on device d with nthreads threads, after the work
// queued before it on stream st (nil: d's default stream), and p's bytes
// (EncodeKernelParams) as parameters. A kernel registered with
// RegisterTypedKernel must take parameters of type P; a byte kernel
// (RegisterKernel) gets P's bytes. The errors are Launch's, and those of
// EncodeKernelParams; kernels' own errors come back from the next
// synchronize.
func LaunchTyped[P any](s *Session, d Device, st *Stream, name string, nthreads int, p P) error {
	params, err := typedParams(&typedKernels, "kernel", name, p)
	if err != nil {
		return err
	}
	return s.Launch(d, st, name, nthreads, params)
}
