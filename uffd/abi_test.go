//go:build linux

package uffd

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// abiValue is one number the Go side hard-codes and the C header defines.
type abiValue struct {
	c   string // a C expression
	go_ uint64
	// since names a macro that headers older than the value lack (the
	// value came after Linux 6.1); empty for values every supported
	// header has, whose absence fails the build of the C program.
	since string
}

func sizeofGo[T any]() uint64 { var v T; return uint64(unsafe.Sizeof(v)) }

// abiValues lists every constant, struct size and field offset of the ABI.
func abiValues() []abiValue {
	const (
		move   = "UFFDIO_MOVE"   // Linux 6.8
		poison = "UFFDIO_POISON" // Linux 6.6
	)
	v := []abiValue{
		{c: "UFFD_API", go_: uffdAPI},
		{c: "UFFDIO", go_: uffdioType},
		{c: "USERFAULTFD_IOC_NEW", go_: reqNew},
		{c: "UFFD_USER_MODE_ONLY", go_: userModeOnly},

		{c: "_UFFDIO_REGISTER", go_: nrRegister},
		{c: "_UFFDIO_UNREGISTER", go_: nrUnregister},
		{c: "_UFFDIO_WAKE", go_: nrWake},
		{c: "_UFFDIO_COPY", go_: nrCopy},
		{c: "_UFFDIO_ZEROPAGE", go_: nrZeropage},
		{c: "_UFFDIO_MOVE", go_: nrMove, since: "_UFFDIO_MOVE"},
		{c: "_UFFDIO_WRITEPROTECT", go_: nrWriteProtect},
		{c: "_UFFDIO_CONTINUE", go_: nrContinue},
		{c: "_UFFDIO_POISON", go_: nrPoison, since: "_UFFDIO_POISON"},
		{c: "_UFFDIO_API", go_: nrAPI},

		{c: "UFFDIO_API", go_: reqAPI},
		{c: "UFFDIO_REGISTER", go_: reqRegister},
		{c: "UFFDIO_UNREGISTER", go_: reqUnregister},
		{c: "UFFDIO_WAKE", go_: reqWake},
		{c: "UFFDIO_COPY", go_: reqCopy},
		{c: "UFFDIO_ZEROPAGE", go_: reqZeropage},
		{c: "UFFDIO_MOVE", go_: reqMove, since: move},
		{c: "UFFDIO_WRITEPROTECT", go_: reqWriteProtect},
		{c: "UFFDIO_CONTINUE", go_: reqContinue},
		{c: "UFFDIO_POISON", go_: reqPoison, since: poison},

		{c: "(1ULL << _UFFDIO_REGISTER)", go_: uint64(IoctlRegister)},
		{c: "(1ULL << _UFFDIO_UNREGISTER)", go_: uint64(IoctlUnregister)},
		{c: "(1ULL << _UFFDIO_WAKE)", go_: uint64(IoctlWake)},
		{c: "(1ULL << _UFFDIO_COPY)", go_: uint64(IoctlCopy)},
		{c: "(1ULL << _UFFDIO_ZEROPAGE)", go_: uint64(IoctlZeropage)},
		{c: "(1ULL << _UFFDIO_MOVE)", go_: uint64(IoctlMove), since: "_UFFDIO_MOVE"},
		{c: "(1ULL << _UFFDIO_WRITEPROTECT)", go_: uint64(IoctlWriteProtect)},
		{c: "(1ULL << _UFFDIO_CONTINUE)", go_: uint64(IoctlContinue)},
		{c: "(1ULL << _UFFDIO_POISON)", go_: uint64(IoctlPoison), since: "_UFFDIO_POISON"},
		{c: "(1ULL << _UFFDIO_API)", go_: uint64(IoctlAPI)},
		{c: "UFFD_API_IOCTLS", go_: uint64(IoctlRegister | IoctlUnregister | IoctlAPI)},

		{c: "UFFD_EVENT_PAGEFAULT", go_: uint64(EventPagefault)},
		{c: "UFFD_EVENT_FORK", go_: uint64(EventFork)},
		{c: "UFFD_EVENT_REMAP", go_: uint64(EventRemap)},
		{c: "UFFD_EVENT_REMOVE", go_: uint64(EventRemove)},
		{c: "UFFD_EVENT_UNMAP", go_: uint64(EventUnmap)},
		{c: "UFFD_PAGEFAULT_FLAG_WRITE", go_: uint64(PagefaultWrite)},
		{c: "UFFD_PAGEFAULT_FLAG_WP", go_: uint64(PagefaultWP)},
		{c: "UFFD_PAGEFAULT_FLAG_MINOR", go_: uint64(PagefaultMinor)},

		{c: "UFFD_FEATURE_PAGEFAULT_FLAG_WP", go_: uint64(FeaturePagefaultFlagWP)},
		{c: "UFFD_FEATURE_EVENT_FORK", go_: uint64(FeatureEventFork)},
		{c: "UFFD_FEATURE_EVENT_REMAP", go_: uint64(FeatureEventRemap)},
		{c: "UFFD_FEATURE_EVENT_REMOVE", go_: uint64(FeatureEventRemove)},
		{c: "UFFD_FEATURE_MISSING_HUGETLBFS", go_: uint64(FeatureMissingHugetlbfs)},
		{c: "UFFD_FEATURE_MISSING_SHMEM", go_: uint64(FeatureMissingShmem)},
		{c: "UFFD_FEATURE_EVENT_UNMAP", go_: uint64(FeatureEventUnmap)},
		{c: "UFFD_FEATURE_SIGBUS", go_: uint64(FeatureSigbus)},
		{c: "UFFD_FEATURE_THREAD_ID", go_: uint64(FeatureThreadID)},
		{c: "UFFD_FEATURE_MINOR_HUGETLBFS", go_: uint64(FeatureMinorHugetlbfs)},
		{c: "UFFD_FEATURE_MINOR_SHMEM", go_: uint64(FeatureMinorShmem)},
		{c: "UFFD_FEATURE_EXACT_ADDRESS", go_: uint64(FeatureExactAddress)},
		{c: "UFFD_FEATURE_WP_HUGETLBFS_SHMEM", go_: uint64(FeatureWPHugetlbfsShmem)},
		{c: "UFFD_FEATURE_WP_UNPOPULATED", go_: uint64(FeatureWPUnpopulated), since: "UFFD_FEATURE_WP_UNPOPULATED"},
		{c: "UFFD_FEATURE_POISON", go_: uint64(FeaturePoison), since: "UFFD_FEATURE_POISON"},
		{c: "UFFD_FEATURE_WP_ASYNC", go_: uint64(FeatureWPAsync), since: "UFFD_FEATURE_WP_ASYNC"},
		{c: "UFFD_FEATURE_MOVE", go_: uint64(FeatureMove), since: "UFFD_FEATURE_MOVE"},

		{c: "UFFDIO_REGISTER_MODE_MISSING", go_: uint64(RegisterMissing)},
		{c: "UFFDIO_REGISTER_MODE_WP", go_: uint64(RegisterWP)},
		{c: "UFFDIO_REGISTER_MODE_MINOR", go_: uint64(RegisterMinor)},
		{c: "UFFDIO_COPY_MODE_DONTWAKE", go_: uint64(CopyDontWake)},
		{c: "UFFDIO_COPY_MODE_WP", go_: uint64(CopyWP)},
		{c: "UFFDIO_ZEROPAGE_MODE_DONTWAKE", go_: zeropageModeDontWake},
		{c: "UFFDIO_WRITEPROTECT_MODE_WP", go_: wpModeWP},
		{c: "UFFDIO_WRITEPROTECT_MODE_DONTWAKE", go_: wpModeDontWake},
		{c: "UFFDIO_CONTINUE_MODE_DONTWAKE", go_: uint64(ContinueDontWake)},
		{c: "UFFDIO_CONTINUE_MODE_WP", go_: uint64(ContinueWP), since: "UFFDIO_CONTINUE_MODE_WP"},
		{c: "UFFDIO_MOVE_MODE_DONTWAKE", go_: uint64(MoveDontWake), since: "UFFDIO_MOVE_MODE_DONTWAKE"},
		{c: "UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES", go_: uint64(MoveAllowSrcHoles), since: "UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES"},
		{c: "UFFDIO_POISON_MODE_DONTWAKE", go_: poisonModeDontWake, since: "UFFDIO_POISON_MODE_DONTWAKE"},

		{c: "sizeof(struct uffd_msg)", go_: MsgSize},
		{c: "offsetof(struct uffd_msg, event)", go_: msgOffEvent},
		{c: "offsetof(struct uffd_msg, arg)", go_: msgOffArg},
		{c: "offsetof(struct uffd_msg, arg.pagefault.flags)", go_: msgOffPFFlags},
		{c: "offsetof(struct uffd_msg, arg.pagefault.address)", go_: msgOffPFAddress},
		{c: "offsetof(struct uffd_msg, arg.pagefault.feat.ptid)", go_: msgOffPFPtid},
		{c: "offsetof(struct uffd_msg, arg.fork.ufd)", go_: msgOffForkUfd},
		{c: "offsetof(struct uffd_msg, arg.remap.from)", go_: msgOffRemapFrom},
		{c: "offsetof(struct uffd_msg, arg.remap.to)", go_: msgOffRemapTo},
		{c: "offsetof(struct uffd_msg, arg.remap.len)", go_: msgOffRemapLen},
		{c: "offsetof(struct uffd_msg, arg.remove.start)", go_: msgOffRemoveFrom},
		{c: "offsetof(struct uffd_msg, arg.remove.end)", go_: msgOffRemoveEnd},
	}
	// Sizes and field offsets of the argument structs, from the Go types.
	type field struct {
		name string
		off  uintptr
	}
	structs := []struct {
		name   string
		size   uint64
		fields []field
		since  string
	}{
		{"uffdio_api", sizeofGo[uffdioAPI](), []field{{"api", unsafe.Offsetof(uffdioAPI{}.api)}, {"features", unsafe.Offsetof(uffdioAPI{}.features)}, {"ioctls", unsafe.Offsetof(uffdioAPI{}.ioctls)}}, ""},
		{"uffdio_range", sizeofGo[uffdioRange](), []field{{"start", unsafe.Offsetof(uffdioRange{}.start)}, {"len", unsafe.Offsetof(uffdioRange{}.len)}}, ""},
		{"uffdio_register", sizeofGo[uffdioRegister](), []field{{"range", unsafe.Offsetof(uffdioRegister{}.rng)}, {"mode", unsafe.Offsetof(uffdioRegister{}.mode)}, {"ioctls", unsafe.Offsetof(uffdioRegister{}.ioctls)}}, ""},
		{"uffdio_copy", sizeofGo[uffdioCopy](), []field{{"dst", unsafe.Offsetof(uffdioCopy{}.dst)}, {"src", unsafe.Offsetof(uffdioCopy{}.src)}, {"len", unsafe.Offsetof(uffdioCopy{}.len)}, {"mode", unsafe.Offsetof(uffdioCopy{}.mode)}, {"copy", unsafe.Offsetof(uffdioCopy{}.copy)}}, ""},
		{"uffdio_zeropage", sizeofGo[uffdioZeropage](), []field{{"range", unsafe.Offsetof(uffdioZeropage{}.rng)}, {"mode", unsafe.Offsetof(uffdioZeropage{}.mode)}, {"zeropage", unsafe.Offsetof(uffdioZeropage{}.zeropage)}}, ""},
		{"uffdio_writeprotect", sizeofGo[uffdioWriteprotect](), []field{{"range", unsafe.Offsetof(uffdioWriteprotect{}.rng)}, {"mode", unsafe.Offsetof(uffdioWriteprotect{}.mode)}}, ""},
		{"uffdio_continue", sizeofGo[uffdioContinue](), []field{{"range", unsafe.Offsetof(uffdioContinue{}.rng)}, {"mode", unsafe.Offsetof(uffdioContinue{}.mode)}, {"mapped", unsafe.Offsetof(uffdioContinue{}.mapped)}}, ""},
		{"uffdio_move", sizeofGo[uffdioMove](), []field{{"dst", unsafe.Offsetof(uffdioMove{}.dst)}, {"src", unsafe.Offsetof(uffdioMove{}.src)}, {"len", unsafe.Offsetof(uffdioMove{}.len)}, {"mode", unsafe.Offsetof(uffdioMove{}.mode)}, {"move", unsafe.Offsetof(uffdioMove{}.move)}}, move},
		{"uffdio_poison", sizeofGo[uffdioPoison](), []field{{"range", unsafe.Offsetof(uffdioPoison{}.rng)}, {"mode", unsafe.Offsetof(uffdioPoison{}.mode)}, {"updated", unsafe.Offsetof(uffdioPoison{}.updated)}}, poison},
	}
	for _, s := range structs {
		v = append(v, abiValue{c: "sizeof(struct " + s.name + ")", go_: s.size, since: s.since})
		for _, f := range s.fields {
			v = append(v, abiValue{c: "offsetof(struct " + s.name + ", " + f.name + ")", go_: uint64(f.off), since: s.since})
		}
	}
	// The sizes the request numbers encode.
	v = append(v,
		abiValue{c: "sizeof(struct uffdio_api)", go_: sizeofUffdioAPI},
		abiValue{c: "sizeof(struct uffdio_range)", go_: sizeofUffdioRange},
		abiValue{c: "sizeof(struct uffdio_register)", go_: sizeofUffdioRegister},
		abiValue{c: "sizeof(struct uffdio_copy)", go_: sizeofUffdioCopy},
		abiValue{c: "sizeof(struct uffdio_zeropage)", go_: sizeofUffdioZeropage},
		abiValue{c: "sizeof(struct uffdio_writeprotect)", go_: sizeofUffdioWriteprot},
		abiValue{c: "sizeof(struct uffdio_continue)", go_: sizeofUffdioContinue},
		abiValue{c: "sizeof(struct uffdio_move)", go_: sizeofUffdioMove, since: move},
		abiValue{c: "sizeof(struct uffdio_poison)", go_: sizeofUffdioPoison, since: poison},
	)
	return v
}

// TestABIHeader compiles a C program against the installed
// <linux/userfaultfd.h> that prints every value of abiValues, and compares
// them with the Go constants. Values newer than the header are reported as
// absent and logged; TestABIKernelBTF and the tests that use them cover
// them instead.
func TestABIHeader(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc is not installed: the test compiles a C program against <linux/userfaultfd.h>")
	}
	values := abiValues()
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <sys/ioctl.h>\n#include <linux/userfaultfd.h>\n\nint main(void) {\n")
	for i, v := range values {
		if v.since != "" {
			fmt.Fprintf(&src, "#ifdef %s\n", v.since)
		}
		fmt.Fprintf(&src, "\tprintf(\"%d %%llu\\n\", (unsigned long long)(%s));\n", i, v.c)
		if v.since != "" {
			fmt.Fprintf(&src, "#else\n\tprintf(\"%d absent\\n\");\n#endif\n", i)
		}
	}
	src.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "abi.c"), filepath.Join(dir, "abi")
	require.NoError(t, os.WriteFile(cfile, []byte(src.String()), 0o644))
	out, err := exec.Command(gcc, "-Wall", "-Werror", "-o", bin, cfile).CombinedOutput()
	require.NoError(t, err, "compiling:\n%s\n%s", out, src.String())
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)

	var absent []string
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		idx, val, ok := strings.Cut(sc.Text(), " ")
		require.True(t, ok, "line %q", sc.Text())
		i, err := strconv.Atoi(idx)
		require.NoError(t, err)
		v := values[i]
		seen++
		if val == "absent" {
			absent = append(absent, v.c)
			continue
		}
		n, err := strconv.ParseUint(val, 10, 64)
		require.NoError(t, err)
		assert.Equal(t, n, v.go_, "%s: header %#x, Go %#x", v.c, n, v.go_)
	}
	require.Equal(t, len(values), seen)
	t.Logf("checked %d values against <linux/userfaultfd.h>", len(values)-len(absent))
	if len(absent) > 0 {
		t.Logf("the installed header is older than the kernel and lacks %d values, checked by TestABIKernelBTF and the tests that use them: %s",
			len(absent), strings.Join(absent, ", "))
	}
}
