package procinfo

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// maxStatFiles is how many threads' stat files a ThreadCPUs keeps open.
const maxStatFiles = 64

// ThreadCPUs reads the CPU threads last ran on (field 39 of
// /proc/PID/task/TID/stat), keeping each thread's stat file open and
// reading it again at offset 0: opening it costs five system calls to the
// one read. Safe for concurrent use.
type ThreadCPUs struct {
	// mu guards files; a leaf lock, held for map operations only. An
	// os.File may be closed while another goroutine reads it (the read
	// then fails, and the thread's file is opened again).
	mu    sync.Mutex
	files map[uint32]*os.File
}

// NewThreadCPUs returns a reader with no file open.
func NewThreadCPUs() *ThreadCPUs { return &ThreadCPUs{files: map[uint32]*os.File{}} }

// Read returns the CPU thread tid of process pid last ran on. A thread
// that is gone is an error, and its file is let go.
func (c *ThreadCPUs) Read(pid int, tid uint32) (int, error) {
	c.mu.Lock()
	f := c.files[tid]
	c.mu.Unlock()
	if f == nil {
		var err error
		if f, err = os.Open("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.FormatUint(uint64(tid), 10) + "/stat"); err != nil {
			return 0, err
		}
		c.mu.Lock()
		if len(c.files) >= maxStatFiles {
			c.closeLocked()
		}
		if old := c.files[tid]; old != nil {
			old.Close() // another goroutine opened it meanwhile
		}
		c.files[tid] = f
		c.mu.Unlock()
	}
	var buf [1024]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 {
		// The thread is gone (ESRCH), or another goroutine closed the
		// file: open it anew next time.
		c.mu.Lock()
		if c.files[tid] == f {
			delete(c.files, tid)
			f.Close()
		}
		c.mu.Unlock()
		if err == nil {
			err = fmt.Errorf("empty stat of thread %d", tid)
		}
		return 0, err
	}
	return parseStatCPU(buf[:n])
}

// Close closes the threads' stat files.
func (c *ThreadCPUs) Close() {
	c.mu.Lock()
	c.closeLocked()
	c.mu.Unlock()
}

func (c *ThreadCPUs) closeLocked() {
	for _, f := range c.files {
		f.Close()
	}
	clear(c.files)
}

// parseStatCPU returns field 39 (processor) of a /proc stat line. The
// command name (field 2) is in parentheses and may hold spaces and
// parentheses itself, so fields are counted after the last ')'.
func parseStatCPU(b []byte) (int, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat line without a command name: %q", b)
	}
	fields := bytes.Fields(b[i+1:])
	const processor = 39 - 3 // fields after ')' start at field 3
	if len(fields) <= processor {
		return 0, fmt.Errorf("stat line with %d fields after the command, want at least %d", len(fields), processor+1)
	}
	return strconv.Atoi(string(fields[processor]))
}
