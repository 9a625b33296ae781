package uvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/uffd"
)

// The guard is a small process the server starts beside itself. It holds
// a duplicate of every client's userfaultfd and waits. If the server dies,
// the kernel must not see those userfaultfds close: it would unregister
// the ranges, and the host file's holes would fill with zeros where data
// lived on a device. Instead the guard takes over: it tells each client,
// on the client's standard error, that its managed memory is lost, wakes
// the threads the dead server left blocked, and answers every fault with
// UFFDIO_POISON, so that the access raises SIGBUS at once. Pages still on
// the host stay readable.
//
// Server to guard, one SOCK_SEQPACKET datagram each:
//
//	'A' session(uint64) pid(uint32) + the userfaultfd  add a client
//	'D' session(uint64)                                forget a client
//	'Q'                                                 exit: the server is closing cleanly

type guardLink struct {
	mu   sync.Mutex
	conn *net.UnixConn
	cmd  *exec.Cmd
	done chan struct{}
}

func startGuard() (*guardLink, error) {
	local, remote, err := socketPair("softuvm-guard")
	if err != nil {
		return nil, err
	}
	cmd, err := reexec("guard", "softuvm-guard", []*os.File{remote})
	remote.Close()
	if err != nil {
		local.Close()
		return nil, err
	}
	g := &guardLink{conn: local, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(g.done) }()
	return g, nil
}

func (g *guardLink) send(b []byte, fds []int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn != nil {
		writeMessage(g.conn, b, fds)
	}
}

func (g *guardLink) add(id uint64, pid int, u *uffd.FD) {
	b := []byte{'A'}
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint32(b, uint32(pid))
	g.send(b, []int{u.Fd()})
}

func (g *guardLink) remove(id uint64) {
	g.send(binary.LittleEndian.AppendUint64([]byte{'D'}, id), nil)
}

// close tells the guard that the server is going away on purpose.
func (g *guardLink) close() {
	g.send([]byte{'Q'}, nil)
	g.mu.Lock()
	g.conn.Close()
	g.conn = nil
	g.mu.Unlock()
	select {
	case <-g.done:
	case <-time.After(2 * time.Second):
		g.cmd.Process.Kill()
	}
}

type guarded struct {
	pid int
	u   *uffd.FD
}

// runGuard is the guard process's main function.
func runGuard() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGTERM)
	f := os.NewFile(3, "softuvm-guard")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm guard: %v\n", err)
		return 2
	}
	conn := c.(*net.UnixConn)
	clients := map[uint64]*guarded{}
	buf := make([]byte, 64)
	for {
		b, fds, err := readMessage(conn, buf)
		if err != nil {
			if errors.Is(err, errPeerGone) {
				break // the server died
			}
			fmt.Fprintf(os.Stderr, "softuvm guard: %v\n", err)
			break
		}
		switch {
		case len(b) == 13 && b[0] == 'A' && len(fds) == 1:
			clients[binary.LittleEndian.Uint64(b[1:])] = &guarded{pid: int(binary.LittleEndian.Uint32(b[9:])), u: uffd.NewFD(fds[0])}
		case len(b) == 9 && b[0] == 'D':
			id := binary.LittleEndian.Uint64(b[1:])
			if g := clients[id]; g != nil {
				g.u.Close()
				delete(clients, id)
			}
			closeFDs(fds)
		case len(b) == 1 && b[0] == 'Q':
			for _, g := range clients {
				g.u.Close()
			}
			return 0
		default:
			closeFDs(fds)
		}
	}
	if len(clients) == 0 {
		return 0
	}
	return takeOver(clients)
}

// takeOver serves the clients of a dead server with poison until they
// exit.
func takeOver(clients map[uint64]*guarded) int {
	p, err := uffd.NewPoller()
	if err != nil {
		fmt.Fprintf(os.Stderr, "softuvm guard: %v\n", err)
		return 1
	}
	defer p.Close()
	// The whole user address space: threads blocked on faults the
	// server read but never answered are woken to fault again, here.
	const wakeStart, wakeLen = PageSize, 1<<47 - 2*PageSize
	for id, g := range clients {
		// The server read in blocking mode; epoll needs nonblocking.
		g.u.SetNonblock(true)
		notifyClient(g.pid, fmt.Sprintf("softuvm: the fault server of this process (pid %d) exited; managed memory that was not on the host is lost, and touching it now raises SIGBUS (bus error)\n", os.Getppid()))
		p.Add(g.u, id)
		g.u.Wake(wakeStart, wakeLen)
	}
	msgs := make([]uffd.Msg, 16)
	keys := make([]uint64, 0, 16)
	for len(clients) > 0 {
		ready, _, err := p.Wait(keys[:0], 200*time.Millisecond)
		if err != nil {
			return 1
		}
		for _, id := range ready {
			g := clients[id]
			if g == nil {
				continue
			}
			n, _ := g.u.ReadMessages(msgs)
			for _, m := range msgs[:n] {
				if m.Event != uffd.EventPagefault {
					if m.Event == uffd.EventFork {
						closeFDs([]int{m.ChildFD})
					}
					continue
				}
				addr := uintptr(m.Address) &^ pageMask
				if _, err := g.u.Poison(addr, PageSize, false); err != nil {
					g.u.Wake(addr, PageSize)
				}
			}
		}
		for id, g := range clients {
			if syscall.Kill(g.pid, 0) == syscall.ESRCH {
				p.Remove(g.u)
				g.u.Close()
				delete(clients, id)
			}
		}
	}
	return 0
}

// notifyClient writes msg on the standard error of process pid.
func notifyClient(pid int, msg string) {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", pid), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	f.WriteString(msg)
	f.Close()
}
