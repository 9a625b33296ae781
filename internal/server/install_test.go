package server

import (
	"bytes"
	"io"
	"log"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/block"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/engine"
	"github.com/softuvm/softuvm/policy"
	"github.com/softuvm/softuvm/uffd"
)

// installHarness is one host block: a location file mapped shared,
// registered for MISSING faults, and a mover over it, as a fault on the
// host view would have.
type installHarness struct {
	sess *session
	o    *block.Mover
	v    *view
	file *devmem.File
	mem  []byte // the view
}

func newInstallHarness(t *testing.T) *installHarness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: userfaultfd on shared memory")
	}
	f, err := devmem.CreateFile("install-test", core.BlockSize)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	m, err := f.Map(0, core.BlockSize)
	require.NoError(t, err)
	t.Cleanup(func() { m.Unmap() })
	u, err := uffd.Open(0)
	if err != nil {
		t.Skipf("no userfaultfd here: %v", err)
	}
	t.Cleanup(func() { u.Close() })
	_, err = u.Handshake(0)
	require.NoError(t, err)
	_, err = u.Register(m.Addr(), core.BlockSize, uffd.RegisterMissing)
	require.NoError(t, err)

	srv := &Server{logger: log.New(io.Discard, "", 0)}
	srv.eng = testEngine(t, policy.Specs{})
	sess := &session{srv: srv, host: f}
	r := &managedRange{Range: srv.eng.NewRange(sess, m.Addr(), core.BlockSize), sess: sess}
	r.Ext, r.FileOff = r, 0 // the file is the block alone
	v := &view{sess: sess, loc: core.CPU, uffd: u}
	o := r.NewMover(0, r.Block(0))
	o.FV = v
	return &installHarness{sess: sess, o: &o, v: v, file: f, mem: m.Bytes()}
}

func pagesOf(fill byte, n int) []byte {
	return bytes.Repeat([]byte{fill}, n*core.PageSize)
}

// A copy that finds one of its pages already in the destination file (the
// zeroed remainder of a large folio a partial punch kept, say) must leave
// the bytes it carries there, not the stray page: the source is gone.
func TestInstallCopyWritesOverAStrayPage(t *testing.T) {
	h := newInstallHarness(t)
	stray := pagesOf(0, 1) // what a kept folio reads as
	_, err := h.file.WriteAt(stray, 5*core.PageSize)
	require.NoError(t, err)

	data := make([]byte, 4*core.PageSize)
	for i := range data {
		data[i] = byte(i*7 + i/core.PageSize + 1)
	}
	done, found, err := h.sess.install(h.o, h.v, installCopy, 3, 7, data, false)
	require.NoError(t, err)
	for p := 3; p < 7; p++ {
		// A page left out would hang the reads below.
		require.True(t, done.Test(p), "page %d installed", p)
	}
	assert.True(t, found.Empty(), "no page was left as found: %v", found)
	assert.Equal(t, uint64(1), h.sess.srv.strayPresent.Load(), "the stray page was counted")
	got := make([]byte, len(data))
	_, err = h.file.ReadAt(got, 3*core.PageSize)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(got, data), "the file holds the carried bytes at pages 3-6")
	assert.True(t, bytes.Equal(h.mem[3*core.PageSize:7*core.PageSize], data), "the view reads the carried bytes")
}

// A zero page that finds its page present leaves it: another handler
// resolved the fault first, and what it put there is the data.
func TestInstallZeroKeepsAPresentPage(t *testing.T) {
	h := newInstallHarness(t)
	there := pagesOf(0xa5, 1)
	_, err := h.file.WriteAt(there, 9*core.PageSize)
	require.NoError(t, err)
	done, found, err := h.sess.install(h.o, h.v, installZero, 8, 11, nil, false)
	require.NoError(t, err)
	for p := 8; p < 11; p++ {
		require.True(t, done.Test(p), "page %d present", p)
	}
	var want core.PageMask
	want.Set(9)
	assert.Equal(t, want, found)
	assert.Zero(t, h.sess.srv.strayPresent.Load())
	assert.True(t, bytes.Equal(h.mem[9*core.PageSize:10*core.PageSize], there), "page 9 kept its bytes")
	assert.True(t, bytes.Equal(h.mem[8*core.PageSize:9*core.PageSize], pagesOf(0, 1)), "page 8 is a zero page")
}

// The staging area's slots are the copy engine's buffers: a chunk each.
func TestStagingSlotIsACopyChunk(t *testing.T) {
	assert.Equal(t, engine.ChunkBytes, block.StagingSlotBytes)
}
