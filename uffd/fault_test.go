//go:build linux

package uffd

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The faults in these tests are taken by the kernel while it copies to or
// from registered memory inside a system call (see faulter), served by the
// test goroutine with the package, the way the fault server will serve its
// clients.

// TestFaultMissingRead: a read of a missing anonymous page, resolved with
// Copy; the message names the page, no flag, and the faulting thread.
func TestFaultMissingRead(t *testing.T) {
	f := handshakeT(t, FeatureThreadID)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)

	fl, r := kernelRead(t, f, mem)
	m := waitMsg(t, f)
	assert.Equal(t, EventPagefault, m.Event)
	assert.Equal(t, uint64(addr(mem)), m.Address)
	assert.Equal(t, PagefaultFlag(0), m.Flags, "a read fault has no flag")
	assert.Equal(t, uint32(fl.tid), m.TID, "TID is the faulting thread")
	fl.requireBlocked(t, 20*time.Millisecond)

	data := fill(pageSize, 'C')
	n, err := f.Copy(uintptr(m.Address), data, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(pageSize), n)
	got, err := fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, pageSize, got)
	assert.Equal(t, data, readPipe(t, r, pageSize))
	assert.Equal(t, data, mem, "the mapping holds the copied page")
}

// TestFaultMissingWrite: the kernel writing into a missing page reports
// PagefaultWrite; without FeatureThreadID the TID is 0.
func TestFaultMissingWrite(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 2)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)

	page1 := mem[pageSize:]
	fl := kernelWrite(t, f, page1, fill(pageSize, 'w'))
	m := waitMsg(t, f)
	assert.Equal(t, EventPagefault, m.Event)
	assert.Equal(t, uint64(addr(page1)), m.Address)
	assert.Equal(t, PagefaultWrite, m.Flags)
	assert.Zero(t, m.TID, "TID without FeatureThreadID")

	_, err = f.Copy(addr(page1), fill(pageSize, 'C'), 0)
	require.NoError(t, err)
	n, err := fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, pageSize, n)
	assert.Equal(t, fill(pageSize, 'w'), page1, "the kernel's write landed after the copy")
}

// TestFaultInterruptedBySignal: a signal to a thread waiting in a fault
// makes it handle the signal and take the fault again, which queues a
// second message for the same page. A handler must expect duplicates: the
// second resolution fails with ErrExist.
func TestFaultInterruptedBySignal(t *testing.T) {
	f := handshakeT(t, FeatureThreadID)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	first := waitMsg(t, f)
	require.NoError(t, unix.Tgkill(unix.Getpid(), fl.tid, unix.SIGURG))
	second := waitMsg(t, f)
	assert.Equal(t, first, second, "the same fault, reported again")
	fl.requireBlocked(t, 20*time.Millisecond)

	_, err = f.Copy(uintptr(first.Address), fill(pageSize, 'z'), 0)
	require.NoError(t, err)
	_, err = f.Copy(uintptr(second.Address), fill(pageSize, 'y'), 0)
	require.ErrorIs(t, err, ErrExist)
	n, err := fl.wait(t)
	require.NoError(t, err, "the system call was restarted, not failed")
	assert.Equal(t, pageSize, n)
	assert.Equal(t, fill(pageSize, 'z'), readPipe(t, r, pageSize))
}

// TestFaultExactAddress: with FeatureExactAddress the address keeps the
// offset inside the page; without it, it is page aligned.
func TestFaultExactAddress(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprint("exact=", exact), func(t *testing.T) {
			var want Feature
			if exact {
				want = FeatureExactAddress
			}
			f := handshakeT(t, want)
			mem := mmapAnon(t, 1)
			_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
			require.NoError(t, err)
			fl := kernelWrite(t, f, mem[123:], []byte("hello"))
			m := waitMsg(t, f)
			if exact {
				assert.Equal(t, uint64(addr(mem)+123), m.Address)
			} else {
				assert.Equal(t, uint64(addr(mem)), m.Address)
			}
			_, err = f.ZeroPage(addr(mem), uintptr(pageSize), false)
			require.NoError(t, err)
			_, err = fl.wait(t)
			require.NoError(t, err)
			assert.Equal(t, "hello", string(mem[123:128]))
		})
	}
}

func TestZeroPage(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 2)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	m := waitMsg(t, f)
	assert.Equal(t, uint64(addr(mem)), m.Address)
	n, err := f.ZeroPage(addr(mem), uintptr(len(mem)), false)
	require.NoError(t, err)
	assert.Equal(t, int64(len(mem)), n)
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, len(mem)), readPipe(t, r, len(mem)))
	requireNoMsg(t, f, 0)
}

// TestShmemMissingCopy: MISSING faults on shmem, resolved with Copy, which
// also fills the memfd.
func TestShmemMissingCopy(t *testing.T) {
	f := handshakeT(t, FeatureMissingShmem)
	memfd, mem := memfdT(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	m := waitMsg(t, f)
	assert.Equal(t, uint64(addr(mem)), m.Address)
	_, err = f.Copy(addr(mem), fill(pageSize, 's'), 0)
	require.NoError(t, err)
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, fill(pageSize, 's'), readPipe(t, r, pageSize))
	buf := make([]byte, pageSize)
	_, err = unix.Pread(memfd, buf, 0)
	require.NoError(t, err)
	assert.Equal(t, fill(pageSize, 's'), buf, "the page is in the memfd")
}

// TestContinue: a MINOR fault on a page present in the memfd but not
// mapped, resolved with Continue, which maps the page cache's page.
func TestContinue(t *testing.T) {
	f := handshakeT(t, FeatureMinorShmem)
	memfd, mem := memfdT(t, 2)
	data := fill(pageSize, 'm')
	_, err := unix.Pwrite(memfd, data, int64(pageSize))
	require.NoError(t, err)
	ioctls, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMinor)
	require.NoError(t, err)
	require.True(t, ioctls.Has(IoctlContinue))

	page1 := mem[pageSize:]
	fl, r := kernelRead(t, f, page1)
	m := waitMsg(t, f)
	assert.Equal(t, EventPagefault, m.Event)
	assert.Equal(t, uint64(addr(page1)), m.Address)
	assert.Equal(t, PagefaultMinor, m.Flags)
	n, err := f.Continue(addr(page1), uintptr(pageSize), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(pageSize), n)
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, data, readPipe(t, r, pageSize))

	// Continue on a page that is mapped now: EEXIST.
	n, err = f.Continue(addr(page1), uintptr(pageSize), 0)
	assert.ErrorIs(t, err, ErrExist)
	assert.Zero(t, n)
}

// TestWriteProtect: a page mapped write-protected by Copy(CopyWP) or
// protected later with WriteProtect faults on write with PagefaultWP;
// removing the protection wakes the writer.
func TestWriteProtect(t *testing.T) {
	f := handshakeT(t, FeaturePagefaultFlagWP)
	mem := mmapAnon(t, 1)
	ioctls, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing|RegisterWP)
	require.NoError(t, err)
	require.True(t, ioctls.Has(IoctlWriteProtect))
	_, err = f.Copy(addr(mem), fill(pageSize, '0'), CopyWP)
	require.NoError(t, err)

	// Reading a write-protected page does not fault.
	fl, r := kernelRead(t, f, mem)
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, fill(pageSize, '0'), readPipe(t, r, pageSize))

	for round, b := range []byte{'1', '2'} {
		fl := kernelWrite(t, f, mem, fill(pageSize, b))
		m := waitMsg(t, f)
		assert.Equal(t, uint64(addr(mem)), m.Address, "round %d", round)
		assert.Equal(t, PagefaultWrite|PagefaultWP, m.Flags, "round %d", round)
		fl.requireBlocked(t, 20*time.Millisecond)
		require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), false, false))
		_, err := fl.wait(t)
		require.NoError(t, err)
		assert.Equal(t, fill(pageSize, b), mem)
		// Protect again (dontWake is meaningless then and ignored).
		require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), true, true))
	}
}

// TestContinueWP: Continue(ContinueWP) maps the page write-protected.
func TestContinueWP(t *testing.T) {
	f := handshakeT(t, FeatureMinorShmem|FeatureWPHugetlbfsShmem|FeaturePagefaultFlagWP)
	memfd, mem := memfdT(t, 1)
	_, err := unix.Pwrite(memfd, fill(pageSize, 'm'), 0)
	require.NoError(t, err)
	_, err = f.Register(addr(mem), uintptr(pageSize), RegisterMinor|RegisterWP)
	require.NoError(t, err)

	fl := kernelWrite(t, f, mem, []byte("W"))
	m := waitMsg(t, f)
	assert.Equal(t, PagefaultMinor|PagefaultWrite, m.Flags)
	_, err = f.Continue(addr(mem), uintptr(pageSize), ContinueWP)
	require.NoError(t, err)
	m = waitMsg(t, f)
	assert.Equal(t, PagefaultWP|PagefaultWrite, m.Flags, "the retried write hits the protection")
	require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), false, false))
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, byte('W'), mem[0])
}

// TestDontWakeThenWake: every resolving ioctl with its DontWake mode
// leaves the faulting thread asleep until Wake.
func TestDontWakeThenWake(t *testing.T) {
	type setup struct {
		f    *FD
		mem  []byte // one page, registered
		src  []byte // for move: a populated anonymous page
		data []byte // what the kernel's read returns once resolved
	}
	cases := []struct {
		name     string
		features Feature
		minor    bool // shmem with a page in the memfd, RegisterMinor
		wp       bool // Copy(CopyWP) first; the fault is a write
		resolve  func(s setup) error
		wantErr  error // of the faulting call
	}{
		{name: "copy", resolve: func(s setup) error {
			_, err := s.f.Copy(addr(s.mem), s.data, CopyDontWake)
			return err
		}},
		{name: "zeropage", resolve: func(s setup) error {
			_, err := s.f.ZeroPage(addr(s.mem), uintptr(pageSize), true)
			return err
		}},
		{name: "continue", features: FeatureMinorShmem, minor: true, resolve: func(s setup) error {
			_, err := s.f.Continue(addr(s.mem), uintptr(pageSize), ContinueDontWake)
			return err
		}},
		{name: "move", features: FeatureMove, resolve: func(s setup) error {
			_, err := s.f.Move(addr(s.mem), addr(s.src), uintptr(pageSize), MoveDontWake)
			return err
		}},
		{name: "poison", features: FeaturePoison, wantErr: unix.EFAULT, resolve: func(s setup) error {
			_, err := s.f.Poison(addr(s.mem), uintptr(pageSize), true)
			return err
		}},
		{name: "unprotect", features: FeaturePagefaultFlagWP, wp: true, resolve: func(s setup) error {
			return s.f.WriteProtect(addr(s.mem), uintptr(pageSize), false, true)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := setup{f: handshakeT(t, c.features), data: fill(pageSize, 'd')}
			mode := RegisterMissing
			if c.minor {
				var memfd int
				memfd, s.mem = memfdT(t, 1)
				_, err := unix.Pwrite(memfd, s.data, 0)
				require.NoError(t, err)
				mode = RegisterMinor
			} else {
				s.mem = mmapAnon(t, 1)
			}
			if c.wp {
				mode |= RegisterWP
			}
			_, err := s.f.Register(addr(s.mem), uintptr(pageSize), mode)
			require.NoError(t, err)
			s.src = mmapAnon(t, 1)
			copy(s.src, s.data)

			var fl *faulter
			var r int
			if c.wp {
				_, err := s.f.Copy(addr(s.mem), fill(pageSize, 'o'), CopyWP)
				require.NoError(t, err)
				fl = kernelWrite(t, s.f, s.mem, s.data)
			} else {
				fl, r = kernelRead(t, s.f, s.mem)
			}
			waitMsg(t, s.f)
			require.NoError(t, c.resolve(s))
			fl.requireBlocked(t, 100*time.Millisecond)
			require.NoError(t, s.f.Wake(addr(s.mem), uintptr(pageSize)))
			n, err := fl.wait(t)
			if c.wantErr != nil {
				require.ErrorIs(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, pageSize, n)
			if c.name == "zeropage" {
				s.data = make([]byte, pageSize)
			}
			if !c.wp {
				assert.Equal(t, s.data, readPipe(t, r, pageSize))
			}
			assert.Equal(t, s.data, s.mem)
			requireNoMsg(t, s.f, 0)
		})
	}
}

// TestPoison: a poisoned page fails kernel accesses with EFAULT, now and
// later, and produces no more messages.
func TestPoison(t *testing.T) {
	f := handshakeT(t, FeaturePoison)
	mem := mmapAnon(t, 2)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
	fl, _ := kernelRead(t, f, mem[:pageSize])
	waitMsg(t, f)
	n, err := f.Poison(addr(mem), uintptr(pageSize), false)
	require.NoError(t, err)
	assert.Equal(t, int64(pageSize), n)
	_, err = fl.wait(t)
	require.ErrorIs(t, err, unix.EFAULT)

	// A later access fails at once, without a message.
	fl, _ = kernelRead(t, f, mem[:pageSize])
	_, err = fl.wait(t)
	require.ErrorIs(t, err, unix.EFAULT)
	requireNoMsg(t, f, 20*time.Millisecond)

	// Poisoning a populated page is EEXIST, like the other fills.
	_, err = f.ZeroPage(addr(mem)+uintptr(pageSize), uintptr(pageSize), false)
	require.NoError(t, err)
	_, err = f.Poison(addr(mem)+uintptr(pageSize), uintptr(pageSize), false)
	require.ErrorIs(t, err, ErrExist)
}

// TestMove moves a page from an anonymous mapping into a registered one in
// the same process; the source becomes a hole.
func TestMove(t *testing.T) {
	f := handshakeT(t, FeatureMove)
	dst := mmapAnon(t, 2)
	src := mmapAnon(t, 2)
	copy(src, fill(pageSize, 'v'))
	_, err := f.Register(addr(dst), uintptr(len(dst)), RegisterMissing)
	require.NoError(t, err)

	fl, r := kernelRead(t, f, dst[:pageSize])
	m := waitMsg(t, f)
	n, err := f.Move(uintptr(m.Address), addr(src), uintptr(pageSize), 0)
	require.NoError(t, err)
	assert.Equal(t, int64(pageSize), n)
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, fill(pageSize, 'v'), readPipe(t, r, pageSize))
	assert.Equal(t, make([]byte, pageSize), src[:pageSize], "the source is a hole now")

	// The second source page was never populated: a hole.
	dst1, src1 := addr(dst)+uintptr(pageSize), addr(src)+uintptr(pageSize)
	n, err = f.Move(dst1, src1, uintptr(pageSize), 0)
	require.ErrorIs(t, err, ErrNoEntry)
	assert.Zero(t, n)
	assert.Contains(t, err.Error(), fmt.Sprintf("uffd move 0x%x+%d from 0x%x: no such file or directory", dst1, pageSize, src1))
	// With MoveAllowSrcHoles the hole counts as moved, and the
	// destination stays missing.
	n, err = f.Move(dst1, src1, uintptr(pageSize), MoveAllowSrcHoles)
	require.NoError(t, err)
	assert.Equal(t, int64(pageSize), n)
	_, err = f.ZeroPage(dst1, uintptr(pageSize), false)
	require.NoError(t, err, "the destination is still missing")

	// Moving onto a populated page: EEXIST.
	src[0] = 1
	_, err = f.Move(addr(dst), addr(src), uintptr(pageSize), 0)
	require.ErrorIs(t, err, ErrExist)
}

// TestCopyExist: copying onto a populated page fails with an *OpError
// matching ErrExist and reports no progress.
func TestCopyExist(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	_, err = f.Copy(addr(mem), fill(pageSize, 1), 0)
	require.NoError(t, err)
	n, err := f.Copy(addr(mem), fill(pageSize, 2), 0)
	assert.Zero(t, n)
	require.ErrorIs(t, err, ErrExist)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, "copy", oe.Op)
	assert.Equal(t, fmt.Sprintf("uffd copy 0x%x+%d: file exists", addr(mem), pageSize), err.Error())
	assert.Equal(t, fill(pageSize, 1), mem)
}

// TestCopyPartial: when a later page of the range is populated, Copy
// returns the bytes copied before it and ErrAgain.
func TestCopyPartial(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 3)
	_, err := f.Register(addr(mem), uintptr(len(mem)), RegisterMissing)
	require.NoError(t, err)
	_, err = f.ZeroPage(addr(mem)+2*uintptr(pageSize), uintptr(pageSize), false)
	require.NoError(t, err)
	n, err := f.Copy(addr(mem), fill(len(mem), 'p'), 0)
	require.ErrorIs(t, err, ErrAgain)
	assert.Equal(t, int64(2*pageSize), n)
	assert.Equal(t, fill(2*pageSize, 'p'), mem[:2*pageSize])
}

func TestCopyEmptySource(t *testing.T) {
	f := handshakeT(t, 0)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	n, err := f.Copy(addr(mem), nil, 0)
	require.ErrorIs(t, err, ErrInvalid)
	assert.Zero(t, n)
}

// TestSigbus: with FeatureSigbus the kernel fails the access itself (EFAULT
// for a kernel-mode access) and sends no message.
func TestSigbus(t *testing.T) {
	f := handshakeT(t, FeatureSigbus)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, _ := kernelRead(t, f, mem)
	_, err = fl.wait(t)
	require.ErrorIs(t, err, unix.EFAULT)
	requireNoMsg(t, f, 20*time.Millisecond)
}

// TestWPUnpopulated: with FeatureWPUnpopulated, WriteProtect protects pages
// that were never populated, so the first write is a WP fault rather than
// a silent allocation.
func TestWPUnpopulated(t *testing.T) {
	f := handshakeT(t, FeaturePagefaultFlagWP|FeatureWPUnpopulated)
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterWP)
	require.NoError(t, err)
	require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), true, false))
	fl := kernelWrite(t, f, mem, []byte("u"))
	m := waitMsg(t, f)
	assert.Equal(t, PagefaultWrite|PagefaultWP, m.Flags)
	require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), false, false))
	_, err = fl.wait(t)
	require.NoError(t, err)
	assert.Equal(t, byte('u'), mem[0])
}

// pagemapUffdWP reads bit 57 of the page's /proc/self/pagemap entry: "the
// PTE is uffd-wp write-protected".
func pagemapUffdWP(t *testing.T, a uintptr) bool {
	t.Helper()
	pm, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer pm.Close()
	var e [8]byte
	_, err = pm.ReadAt(e[:], int64(a/uintptr(pageSize))*8)
	require.NoError(t, err)
	return binary.NativeEndian.Uint64(e[:])&(1<<57) != 0
}

// TestWPAsync: with FeatureWPAsync the kernel resolves write faults on
// protected pages itself, without a message, and clears the protection,
// which pagemap shows: userfaultfd as a dirty tracker.
func TestWPAsync(t *testing.T) {
	f := handshakeT(t, FeaturePagefaultFlagWP|FeatureWPAsync)
	require.True(t, f.Features().Has(FeatureWPUnpopulated), "WP_ASYNC implies WP_UNPOPULATED")
	mem := mmapAnon(t, 1)
	_, err := f.Register(addr(mem), uintptr(pageSize), RegisterWP)
	require.NoError(t, err)
	require.NoError(t, f.WriteProtect(addr(mem), uintptr(pageSize), true, false))
	require.True(t, pagemapUffdWP(t, addr(mem)), "protected before the write")
	fl := kernelWrite(t, f, mem, []byte("a"))
	_, err = fl.wait(t)
	require.NoError(t, err)
	requireNoMsg(t, f, 0)
	assert.False(t, pagemapUffdWP(t, addr(mem)), "the write cleared the protection")
	assert.Equal(t, byte('a'), mem[0])
}

// TestReadMessagesNoWait: on a blocking fd, ReadMessagesNoWait returns at
// once with nothing pending, and returns a pending fault without waiting.
func TestReadMessagesNoWait(t *testing.T) {
	f := handshakeT(t, FeatureThreadID)
	var msgs [4]Msg
	n, err := f.ReadMessagesNoWait(msgs[:])
	require.NoError(t, err)
	assert.Zero(t, n, "nothing pending")

	mem := mmapAnon(t, 1)
	_, err = f.Register(addr(mem), uintptr(pageSize), RegisterMissing)
	require.NoError(t, err)
	fl, r := kernelRead(t, f, mem)
	deadline := time.Now().Add(testTimeout)
	for n == 0 && time.Now().Before(deadline) {
		n, err = f.ReadMessagesNoWait(msgs[:])
		require.NoError(t, err)
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	require.Equal(t, 1, n, "the fault arrives")
	assert.Equal(t, EventPagefault, msgs[0].Event)
	assert.Equal(t, uint64(addr(mem)), msgs[0].Address)
	_, err = f.ZeroPage(addr(mem), uintptr(pageSize), false)
	require.NoError(t, err)
	_, err = fl.wait(t)
	require.NoError(t, err)
	readPipe(t, r, pageSize)
}

// TestScanWritten: PAGEMAP_SCAN over a WP_ASYNC range names exactly the
// pages written since they were protected, in runs, and none of those
// only read or never touched.
func TestScanWritten(t *testing.T) {
	f := handshakeT(t, FeaturePagefaultFlagWP|FeatureWPAsync)
	const pages = 16
	mem := mmapAnon(t, pages)
	base := addr(mem)
	_, err := f.Register(base, uintptr(pages*pageSize), RegisterWP)
	require.NoError(t, err)
	for p := 0; p < pages; p++ {
		mem[p*pageSize] = 1 // populate every page
	}
	require.NoError(t, f.WriteProtect(base, uintptr(pages*pageSize), true, false))
	pm, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer pm.Close()
	runs, err := ScanWritten(pm, base, base+uintptr(pages*pageSize), nil)
	require.NoError(t, err)
	assert.Empty(t, runs, "nothing written since the protection")
	var sum byte
	for p := 0; p < pages; p++ {
		sum += mem[p*pageSize] // reads do not count
	}
	require.Equal(t, byte(pages), sum)
	for _, p := range []int{2, 3, 4, 9, 15} {
		mem[p*pageSize+7] = 2
	}
	runs, err = ScanWritten(pm, base, base+uintptr(pages*pageSize), nil)
	require.NoError(t, err)
	pg := func(p int) uintptr { return base + uintptr(p*pageSize) }
	assert.Equal(t, []PageRun{{pg(2), pg(5)}, {pg(9), pg(10)}, {pg(15), pg(16)}}, runs)
}

// TestScanWrittenNeedsWPAsync: a range without WP_ASYNC is refused, not
// reported clean.
func TestScanWrittenNeedsWPAsync(t *testing.T) {
	mem := mmapAnon(t, 1)
	mem[0] = 1
	pm, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer pm.Close()
	_, err = ScanWritten(pm, addr(mem), addr(mem)+uintptr(pageSize), nil)
	assert.ErrorIs(t, err, ErrNotSupported)
}
