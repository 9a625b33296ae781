package uvm

import (
	"encoding/binary"
	"fmt"
	"math"
	"structs"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// affineParams are a typed kernel's parameters, with fields of every size
// and padding between them, laid out as this C struct:
//
//	struct affine {          // offset
//	    uintptr_t out;       //  0
//	    int32_t   n;         //  8
//	    uint8_t   tag;       // 12
//	    bool      neg;       // 13, then 2 bytes of padding
//	    double    scale;     // 16
//	    int16_t   bias[3];   // 24, then 2 bytes of padding
//	    int64_t   offset;    // 32
//	    float _Complex phase;// 40
//	};                       // 48 bytes
type affineParams struct {
	_      structs.HostLayout
	Out    uintptr
	N      int32
	Tag    uint8
	Neg    bool
	Scale  float64
	Bias   [3]int16
	Offset int64
	Phase  complex64
}

// sample is what typedAffine writes, one per thread index: 16 bytes.
type sample struct {
	X float64
	I int32
	T uint8
	_ [3]byte
}

func init() {
	// typedAffine: out[i] for each i of its share of [0, n), a function
	// of i and every parameter.
	MustRegisterTypedKernel("typedAffine", func(tid, nthreads int, p affineParams) {
		out := SliceAt[sample](p.Out, int(p.N))
		lo, hi := tid*len(out)/nthreads, (tid+1)*len(out)/nthreads
		for i := lo; i < hi; i++ {
			x := p.Scale*float64(i) + float64(p.Offset) + float64(real(p.Phase))
			if p.Neg {
				x = -x
			}
			out[i] = sample{X: x, I: int32(i)*int32(p.Bias[i%3]) + int32(imag(p.Phase)), T: p.Tag + uint8(i)}
		}
	})
	// typedEcho writes the parameters it received to their own Out.
	MustRegisterTypedKernel("typedEcho", func(tid, nthreads int, p affineParams) {
		SliceAt[affineParams](p.Out, 1)[0] = p
	})
}

// testAffine are parameters of typedAffine, all fields set.
func testAffine(out uintptr, n int32) affineParams {
	return affineParams{Out: out, N: n, Tag: 200, Neg: true, Scale: 0.5, Bias: [3]int16{2, -3, 5}, Offset: -7, Phase: complex(1.25, 3)}
}

// affineCBytes are testAffine's parameters as C lays them out,
// written field by field at the offsets of the C struct above.
func affineCBytes(out uintptr, n int32) []byte {
	b := make([]byte, 48)
	le := binary.LittleEndian
	le.PutUint64(b[0:], uint64(out))
	le.PutUint32(b[8:], uint32(n))
	b[12] = 200
	b[13] = 1
	le.PutUint64(b[16:], math.Float64bits(0.5))
	le.PutUint16(b[24:], 2)
	le.PutUint16(b[26:], uint16(0xffff-3+1)) // -3
	le.PutUint16(b[28:], 5)
	le.PutUint64(b[32:], uint64(0xffffffffffffffff-7+1)) // -7
	le.PutUint32(b[40:], math.Float32bits(1.25))
	le.PutUint32(b[44:], math.Float32bits(3))
	return b
}

// wantAffine is what typedAffine must write for testAffine's parameters,
// computed here from the numbers themselves.
func wantAffine(n int) []sample {
	bias := []int32{2, -3, 5}
	want := make([]sample, n)
	for i := range want {
		want[i] = sample{X: -(float64(i)/2 - 7 + 1.25), I: int32(i)*bias[i%3] + 3, T: uint8((200 + i) % 256)}
	}
	return want
}

func TestTypedKernelParamsLayout(t *testing.T) {
	require.Equal(t, uintptr(48), unsafe.Sizeof(affineParams{}))
	p := testAffine(0x7f0012345000, 1000)
	b, err := EncodeKernelParams(p)
	require.NoError(t, err)
	require.Equal(t, affineCBytes(0x7f0012345000, 1000), b, "the bytes are the C struct's")

	back, err := DecodeKernelParams[affineParams](b)
	require.NoError(t, err)
	assert.Equal(t, p, back, "a round trip")

	// Padding from C may hold anything; a C bool may come as any
	// non-zero byte.
	dirty := affineCBytes(0x7f0012345000, 1000)
	dirty[14], dirty[15], dirty[30], dirty[31] = 0xaa, 0x55, 0xff, 0x01
	dirty[13] = 7
	back, err = DecodeKernelParams[affineParams](dirty)
	require.NoError(t, err)
	assert.Equal(t, p, back, "padding is ignored and a non-zero bool is true")
	assert.Equal(t, byte(1), *(*byte)(unsafe.Pointer(&back.Neg)))

	// Values that are not structs.
	b, err = EncodeKernelParams(uintptr(0x1234))
	require.NoError(t, err)
	assert.Equal(t, []byte{0x34, 0x12, 0, 0, 0, 0, 0, 0}, b)
	b, err = EncodeKernelParams(struct{}{})
	require.NoError(t, err)
	assert.Empty(t, b)
	arr, err := DecodeKernelParams[[2]float32]([]byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0})
	require.NoError(t, err)
	assert.Equal(t, [2]float32{1, -2}, arr)

	_, err = DecodeKernelParams[affineParams](b[:0])
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "kernel parameters of type uvm.affineParams are 48 bytes, not 0")
}

func TestTypedKernelParamsRefused(t *testing.T) {
	type named struct {
		A    int32
		Name string
	}
	type nested struct {
		A     int64
		Inner [2]struct{ P *int }
	}
	type trailing struct {
		A int32
		_ struct{}
	}
	type leading struct {
		_ structs.HostLayout
		A int32
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"pointer", RegisterTypedKernel("bad", func(int, int, *int) {}), "kernel parameters of type *int: *int is a pointer"},
		{"string field", RegisterTypedKernel("bad", func(int, int, named) {}), "field Name of uvm.named is a string"},
		{"nested pointer", RegisterTypedKernel("bad", func(int, int, nested) {}), "field Inner[i].P of uvm.nested is a pointer (*int)"},
		{"slice", RegisterTypedKernel("bad", func(int, int, []byte) {}), "[]uint8 is a slice"},
		{"interface", RegisterTypedKernel("bad", func(int, int, any) {}), "interface {} is an interface"},
		{"over the limit", RegisterTypedKernel("bad", func(int, int, [MaxKernelParams + 1]byte) {}), "kernel parameters of type [4097]uint8 are 4097 bytes: at most MaxKernelParams, 4096 bytes"},
		{"trailing zero-size field", RegisterTypedKernel("bad", func(int, int, trailing) {}), "the struct ends with the zero-size field _, past which Go pads it to 8 bytes where C has 4"},
		{"encode over the limit", second(EncodeKernelParams([5000]byte{})), "are 5000 bytes: at most MaxKernelParams, 4096 bytes"},
		{"encode a map", second(EncodeKernelParams(map[int]int{})), "map[int]int is a map"},
		{"taken name", RegisterTypedKernel("typedEcho", func(int, int, affineParams) {}), `kernel "typedEcho" registered twice`},
	} {
		require.Error(t, c.err, c.name)
		assert.ErrorIs(t, c.err, ErrInvalidValue, c.name)
		assert.Contains(t, c.err.Error(), c.want, c.name)
	}
	assert.NotContains(t, KernelNames(), "bad", "no refused kernel was registered")

	b, err := EncodeKernelParams([MaxKernelParams]byte{1: 1})
	require.NoError(t, err, "MaxKernelParams bytes are allowed")
	assert.Len(t, b, MaxKernelParams)
	b, err = EncodeKernelParams(leading{A: -1})
	require.NoError(t, err, "a leading HostLayout field adds nothing")
	assert.Equal(t, []byte{0xff, 0xff, 0xff, 0xff}, b)
}

func TestSliceRefusesTypes(t *testing.T) {
	type named struct {
		A    int32
		Name string
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"pointer", second(Slice[*int](nil)), "Slice[*int]: *int is a pointer"},
		{"string field", second(Slice[named](nil)), "Slice[uvm.named]: field Name of uvm.named is a string"},
		{"array of funcs", second(Slice[[4]func()](nil)), "element [i] of [4]func() is a func (func())"},
		{"unsafe.Pointer", second(Slice[unsafe.Pointer](nil)), "unsafe.Pointer is an unsafe.Pointer"},
		{"zero size", second(Slice[struct{}](nil)), "the type has size 0"},
		{"nil allocation", second(Slice[sample](nil)), "Slice[uvm.sample] of a nil allocation"},
	} {
		require.Error(t, c.err, c.name)
		assert.ErrorIs(t, c.err, ErrInvalidValue, c.name)
		assert.Contains(t, c.err.Error(), c.want, c.name)
	}
	assert.Panics(t, func() { MustSlice[*int](nil) })
}

// sliceAtBuf is memory that does not move: a goroutine's stack does, and
// a uintptr does not follow it.
var sliceAtBuf [4]uint64

func TestSliceAt(t *testing.T) {
	buf := sliceAtBuf[:]
	addr := uintptr(unsafe.Pointer(&buf[0]))
	s := SliceAt[uint32](addr, 8)
	s[2] = 0xdeadbeef
	assert.Equal(t, uint64(0xdeadbeef), buf[1], "the same memory")
	assert.Empty(t, SliceAt[uint32](0, 0))
	assert.Len(t, SliceAt[struct{}](addr, 5), 5)
	assert.PanicsWithValue(t, fmt.Sprintf("uvm.SliceAt[uint32](%#x, 1): the address", addr+2)+" is not aligned for uint32, which wants a multiple of 4",
		func() { SliceAt[uint32](addr+2, 1) })
	assert.Panics(t, func() { SliceAt[string](addr, 1) })
	assert.Panics(t, func() { SliceAt[byte](addr, -1) })
	assert.Panics(t, func() { SliceAt[byte](0, 1) })
	assert.Panics(t, func() { SliceAt[uint64](^uintptr(0)-7, 2) })
}

// TestTypedKernelWritesSlice: a typed kernel computes from its typed
// parameters into managed memory (and into mapped pinned host memory),
// and the host reads it through Slice, element by element.
func TestTypedKernelWritesSlice(t *testing.T) {
	s := newSession(t, testServerConfig())
	const n = 10000 // 160000 bytes: 39 pages and a part
	want := wantAffine(n)

	a, err := s.MallocManaged(n * int64(unsafe.Sizeof(sample{})))
	require.NoError(t, err)
	defer a.Free()
	require.NoError(t, LaunchTyped(s, 0, nil, "typedAffine", 7, testAffine(a.Addr(), n)))
	require.NoError(t, s.DeviceSynchronize(0))
	got, err := Slice[sample](a)
	require.NoError(t, err)
	require.Len(t, got, n)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("managed element %d: got %+v, want %+v", i, got[i], want[i])
		}
	}

	h, err := s.HostAlloc(n*16, HostAllocMapped)
	require.NoError(t, err)
	defer s.FreeHost(h.Addr())
	st, err := s.StreamCreate(0)
	require.NoError(t, err)
	require.NoError(t, LaunchTyped(s, 0, st, "typedAffine", 3, testAffine(h.Addr(), n)))
	require.NoError(t, s.StreamSynchronize(st))
	got = MustSlice[sample](h)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("pinned element %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestTypedKernelParamsRoundTrip: parameters reach the kernel intact,
// from LaunchTyped and from a launch of the C struct's bytes written by
// hand the way C lays out the struct.
func TestTypedKernelParamsRoundTrip(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(48)
	require.NoError(t, err)
	defer a.Free()
	echo := MustSlice[affineParams](a)
	require.Len(t, echo, 1)

	p := testAffine(a.Addr(), 1000)
	require.NoError(t, LaunchTyped(s, 0, nil, "typedEcho", 1, p))
	require.NoError(t, s.DefaultStreamSynchronize(0))
	assert.Equal(t, p, echo[0], "from LaunchTyped")

	echo[0] = affineParams{}
	require.NoError(t, s.Launch(0, nil, "typedEcho", 1, affineCBytes(a.Addr(), 1000)))
	require.NoError(t, s.DefaultStreamSynchronize(0))
	assert.Equal(t, p, echo[0], "from the C struct's bytes")
}

// TestTypedKernelErrors: what a typed launch and Slice refuse with a
// session, and what a kernel launched with the wrong bytes reports.
func TestTypedKernelErrors(t *testing.T) {
	s := newSession(t, testServerConfig())
	a, err := s.MallocManaged(4096)
	require.NoError(t, err)
	_, err = Slice[[3]byte](a)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "Slice[[3]uint8] of managed memory at 0x")
	assert.Contains(t, err.Error(), "its size, 4096 bytes, is not a multiple of the size of [3]uint8, 3 bytes (1 left over)")
	assert.Len(t, MustSlice[[4]byte](a), 1024)
	require.NoError(t, a.Free())
	_, err = Slice[uint32](a)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "it was freed")

	d, err := s.Malloc(0, 4096)
	require.NoError(t, err)
	defer d.Free()
	_, err = Slice[uint32](d)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "Slice[uint32] of device memory of device 0 at 0x")
	assert.Contains(t, err.Error(), "the host cannot touch device memory")

	err = LaunchTyped(s, 0, nil, "typedAffine", 1, sample{})
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), `launch of kernel "typedAffine" with parameters of type uvm.sample: it takes uvm.affineParams`)
	err = LaunchTyped(s, 0, nil, "fill", 1, [MaxKernelParams + 8]byte{})
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), `launch of kernel "fill": kernel parameters of type [4104]uint8 are 4104 bytes: at most MaxKernelParams, 4096 bytes`)
	err = LaunchTyped(s, 0, nil, "unregistered", 1, sample{})
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.Contains(t, err.Error(), "no kernel of that name is registered")

	// A byte launch of the wrong size fails in the kernel.
	require.NoError(t, s.Launch(0, nil, "typedEcho", 2, make([]byte, 40)))
	err = s.DeviceSynchronize(0)
	require.ErrorIs(t, err, ErrLaunchFailure)
	assert.Contains(t, err.Error(), `kernel "typedEcho" takes 48 bytes of parameters (a uvm.affineParams), the launch passed 40`)
	require.NoError(t, s.DeviceReset(0)) // a failed launch fails the device until then
}
