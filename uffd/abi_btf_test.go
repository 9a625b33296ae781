//go:build linux

package uffd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The running kernel describes its own types in BTF (/sys/kernel/btf/vmlinux).
// TestABIKernelBTF reads the userfaultfd structs from there, which covers
// the structs an older installed header lacks, and the request numbers
// that encode their sizes. A minimal BTF reader follows; it understands
// just enough to find structs and unions by name and walk their members.

const (
	btfKindInt      = 1
	btfKindPtr      = 2
	btfKindArray    = 3
	btfKindStruct   = 4
	btfKindUnion    = 5
	btfKindEnum     = 6
	btfKindFwd      = 7
	btfKindTypedef  = 8
	btfKindVolatile = 9
	btfKindConst    = 10
	btfKindRestrict = 11
	btfKindFunc     = 12
	btfKindFuncProt = 13
	btfKindVar      = 14
	btfKindDatasec  = 15
	btfKindFloat    = 16
	btfKindDeclTag  = 17
	btfKindTypeTag  = 18
	btfKindEnum64   = 19
)

type btfMember struct {
	name   string
	typ    uint32
	bitOff uint32
}

type btfType struct {
	name    string
	kind    uint32
	size    uint32 // or the referenced type, for typedef and modifiers
	members []btfMember
}

type btfSpec struct {
	types  []btfType // index = type id; 0 is void
	byName map[string]uint32
}

func parseBTF(b []byte) (*btfSpec, error) {
	bo := binary.NativeEndian
	if len(b) < 24 || bo.Uint16(b) != 0xeb9f {
		return nil, errors.New("not BTF in native byte order")
	}
	hdrLen := bo.Uint32(b[4:])
	typeOff, typeLen := bo.Uint32(b[8:]), bo.Uint32(b[12:])
	strOff, strLen := bo.Uint32(b[16:]), bo.Uint32(b[20:])
	types := b[hdrLen+typeOff : hdrLen+typeOff+typeLen]
	strs := b[hdrLen+strOff : hdrLen+strOff+strLen]
	str := func(off uint32) string {
		s := strs[off:]
		if i := bytes.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		return string(s)
	}
	spec := &btfSpec{types: []btfType{{}}, byName: map[string]uint32{}}
	for p := 0; p < len(types); {
		nameOff, info, size := bo.Uint32(types[p:]), bo.Uint32(types[p+4:]), bo.Uint32(types[p+8:])
		p += 12
		vlen := int(info & 0xffff)
		kind := info >> 24 & 0x1f
		kflag := info>>31 == 1
		t := btfType{name: str(nameOff), kind: kind, size: size}
		switch kind {
		case btfKindInt, btfKindVar, btfKindDeclTag:
			p += 4
		case btfKindArray:
			p += 12
		case btfKindStruct, btfKindUnion:
			for range vlen {
				m := btfMember{name: str(bo.Uint32(types[p:])), typ: bo.Uint32(types[p+4:]), bitOff: bo.Uint32(types[p+8:])}
				if kflag {
					m.bitOff &= 0xffffff
				}
				t.members = append(t.members, m)
				p += 12
			}
		case btfKindEnum, btfKindFuncProt:
			p += 8 * vlen
		case btfKindDatasec, btfKindEnum64:
			p += 12 * vlen
		case btfKindPtr, btfKindFwd, btfKindTypedef, btfKindVolatile, btfKindConst,
			btfKindRestrict, btfKindFunc, btfKindFloat, btfKindTypeTag:
		default:
			return nil, errors.New("unknown BTF kind")
		}
		id := uint32(len(spec.types))
		spec.types = append(spec.types, t)
		if (kind == btfKindStruct || kind == btfKindUnion) && t.name != "" {
			if _, dup := spec.byName[t.name]; !dup {
				spec.byName[t.name] = id
			}
		}
	}
	return spec, nil
}

// resolve follows typedefs and qualifiers.
func (s *btfSpec) resolve(id uint32) btfType {
	for {
		t := s.types[id]
		switch t.kind {
		case btfKindTypedef, btfKindVolatile, btfKindConst, btfKindRestrict, btfKindTypeTag:
			id = t.size
		default:
			return t
		}
	}
}

// sizeof returns the byte size of a named struct.
func (s *btfSpec) sizeof(name string) (uint64, bool) {
	id, ok := s.byName[name]
	if !ok {
		return 0, false
	}
	return uint64(s.types[id].size), true
}

// offsetof returns the byte offset of a member path such as
// "arg.pagefault.address" in a named struct.
func (s *btfSpec) offsetof(name, path string) (uint64, bool) {
	id, ok := s.byName[name]
	if !ok {
		return 0, false
	}
	t := s.types[id]
	var off uint64
	for _, part := range strings.Split(path, ".") {
		found := false
		for _, m := range t.members {
			if m.name == part {
				off += uint64(m.bitOff / 8)
				t = s.resolve(m.typ)
				found = true
				break
			}
		}
		if !found {
			return 0, false
		}
	}
	return off, true
}

func TestABIKernelBTF(t *testing.T) {
	raw, err := os.ReadFile("/sys/kernel/btf/vmlinux")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("the kernel has no BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)")
	}
	require.NoError(t, err)
	spec, err := parseBTF(raw)
	require.NoError(t, err)

	sizes := map[string]uint64{
		"uffd_msg":            MsgSize,
		"uffdio_api":          sizeofUffdioAPI,
		"uffdio_range":        sizeofUffdioRange,
		"uffdio_register":     sizeofUffdioRegister,
		"uffdio_copy":         sizeofUffdioCopy,
		"uffdio_zeropage":     sizeofUffdioZeropage,
		"uffdio_writeprotect": sizeofUffdioWriteprot,
		"uffdio_continue":     sizeofUffdioContinue,
		"uffdio_move":         sizeofUffdioMove,
		"uffdio_poison":       sizeofUffdioPoison,
	}
	for name, want := range sizes {
		got, ok := spec.sizeof(name)
		if !ok {
			t.Errorf("struct %s is not in the kernel's BTF", name)
			continue
		}
		assert.Equal(t, want, got, "sizeof(struct %s)", name)
	}

	offsets := []struct {
		strct, path string
		want        uintptr
	}{
		{"uffd_msg", "event", msgOffEvent},
		{"uffd_msg", "arg", msgOffArg},
		{"uffd_msg", "arg.pagefault.flags", msgOffPFFlags},
		{"uffd_msg", "arg.pagefault.address", msgOffPFAddress},
		{"uffd_msg", "arg.pagefault.feat.ptid", msgOffPFPtid},
		{"uffd_msg", "arg.fork.ufd", msgOffForkUfd},
		{"uffd_msg", "arg.remap.from", msgOffRemapFrom},
		{"uffd_msg", "arg.remap.to", msgOffRemapTo},
		{"uffd_msg", "arg.remap.len", msgOffRemapLen},
		{"uffd_msg", "arg.remove.start", msgOffRemoveFrom},
		{"uffd_msg", "arg.remove.end", msgOffRemoveEnd},
		{"uffdio_api", "features", unsafe.Offsetof(uffdioAPI{}.features)},
		{"uffdio_api", "ioctls", unsafe.Offsetof(uffdioAPI{}.ioctls)},
		{"uffdio_register", "range.len", unsafe.Offsetof(uffdioRegister{}.rng) + unsafe.Offsetof(uffdioRange{}.len)},
		{"uffdio_register", "mode", unsafe.Offsetof(uffdioRegister{}.mode)},
		{"uffdio_register", "ioctls", unsafe.Offsetof(uffdioRegister{}.ioctls)},
		{"uffdio_copy", "src", unsafe.Offsetof(uffdioCopy{}.src)},
		{"uffdio_copy", "len", unsafe.Offsetof(uffdioCopy{}.len)},
		{"uffdio_copy", "mode", unsafe.Offsetof(uffdioCopy{}.mode)},
		{"uffdio_copy", "copy", unsafe.Offsetof(uffdioCopy{}.copy)},
		{"uffdio_zeropage", "mode", unsafe.Offsetof(uffdioZeropage{}.mode)},
		{"uffdio_zeropage", "zeropage", unsafe.Offsetof(uffdioZeropage{}.zeropage)},
		{"uffdio_writeprotect", "mode", unsafe.Offsetof(uffdioWriteprotect{}.mode)},
		{"uffdio_continue", "mode", unsafe.Offsetof(uffdioContinue{}.mode)},
		{"uffdio_continue", "mapped", unsafe.Offsetof(uffdioContinue{}.mapped)},
		{"uffdio_move", "dst", unsafe.Offsetof(uffdioMove{}.dst)},
		{"uffdio_move", "src", unsafe.Offsetof(uffdioMove{}.src)},
		{"uffdio_move", "len", unsafe.Offsetof(uffdioMove{}.len)},
		{"uffdio_move", "mode", unsafe.Offsetof(uffdioMove{}.mode)},
		{"uffdio_move", "move", unsafe.Offsetof(uffdioMove{}.move)},
		{"uffdio_poison", "range.start", unsafe.Offsetof(uffdioPoison{}.rng)},
		{"uffdio_poison", "mode", unsafe.Offsetof(uffdioPoison{}.mode)},
		{"uffdio_poison", "updated", unsafe.Offsetof(uffdioPoison{}.updated)},
	}
	for _, o := range offsets {
		got, ok := spec.offsetof(o.strct, o.path)
		if !ok {
			t.Errorf("%s.%s is not in the kernel's BTF", o.strct, o.path)
			continue
		}
		assert.Equal(t, uint64(o.want), got, "offsetof(struct %s, %s)", o.strct, o.path)
	}

	// The request numbers encode the argument size: rebuild them from the
	// kernel's sizes.
	iowr := func(nr uint64, strct string) uint64 {
		size, _ := spec.sizeof(strct)
		return (iocRead|iocWrite)<<30 | size<<16 | uffdioType<<8 | nr
	}
	ior := func(nr uint64, strct string) uint64 {
		size, _ := spec.sizeof(strct)
		return iocRead<<30 | size<<16 | uffdioType<<8 | nr
	}
	assert.Equal(t, iowr(nrAPI, "uffdio_api"), uint64(reqAPI))
	assert.Equal(t, iowr(nrRegister, "uffdio_register"), uint64(reqRegister))
	assert.Equal(t, ior(nrUnregister, "uffdio_range"), uint64(reqUnregister))
	assert.Equal(t, ior(nrWake, "uffdio_range"), uint64(reqWake))
	assert.Equal(t, iowr(nrCopy, "uffdio_copy"), uint64(reqCopy))
	assert.Equal(t, iowr(nrZeropage, "uffdio_zeropage"), uint64(reqZeropage))
	assert.Equal(t, iowr(nrMove, "uffdio_move"), uint64(reqMove))
	assert.Equal(t, iowr(nrWriteProtect, "uffdio_writeprotect"), uint64(reqWriteProtect))
	assert.Equal(t, iowr(nrContinue, "uffdio_continue"), uint64(reqContinue))
	assert.Equal(t, iowr(nrPoison, "uffdio_poison"), uint64(reqPoison))
}
