package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
)

// rpc is a connection to a server that carries one request at a time.
type Client struct {
	Conn    *net.UnixConn
	PeerPID atomic.Int64
	// restarts counts the notices of new servers taking over that this
	// connection has read.
	restarts atomic.Uint32

	reqMu sync.Mutex // one request in flight; guards buf
	seq   atomic.Uint32
	Buf   []byte

	gone   atomic.Bool
	Closed atomic.Bool
}

// Monitor is a read-only connection to a server, for `uvm stat` and `uvm
// info`: it hands over no memory.
type Monitor struct{ Client }

// ConnectMonitor connects to the server listening at path (a daemon's
// socket, or PrivateServerSocketPath of a private server).
func ConnectMonitor(path string) (*Monitor, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("%w: no fault server at %s: %v", core.ErrInitialization, path, err)
	}
	m := &Monitor{Client{Conn: c, Buf: make([]byte, MaxMessageSize)}}
	r, err := m.Request(EncodeHello(m.NextSeq(), HelloRequest{Role: RoleMonitor, Pid: uint32(os.Getpid())}), MsgHello)
	if err == nil {
		var hr HelloReply
		if hr, err = DecodeHelloReply(r); err == nil {
			m.PeerPID.Store(int64(hr.ServerPID))
		}
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return m, nil
}

func (c *Client) NextSeq() uint32 { return c.seq.Add(1) }

// request sends one request and returns the reply's payload.
func (c *Client) Request(b []byte, typ MsgType) (*WireReader, error) {
	return c.RequestFDs(b, typ, nil)
}

func (c *Client) RequestFDs(b []byte, typ MsgType, fds []int) (*WireReader, error) {
	r, rfds, err := c.exchange(b, typ, fds)
	CloseFDs(rfds)
	return r, err
}

// requestWithFDs sends a request and returns the descriptors its reply
// carries, which the caller owns.
func (c *Client) RequestWithFDs(b []byte, typ MsgType) (*WireReader, []int, error) {
	return c.exchange(b, typ, nil)
}

// ExchangeFDs sends a request with descriptors and returns the
// descriptors its reply carries, which the caller owns.
func (c *Client) ExchangeFDs(b []byte, typ MsgType, fds []int) (*WireReader, []int, error) {
	return c.exchange(b, typ, fds)
}

func (c *Client) exchange(b []byte, typ MsgType, fds []int) (*WireReader, []int, error) {
	if c.Closed.Load() {
		return nil, nil, fmt.Errorf("%w: %s: session closed", core.ErrInvalidValue, typ)
	}
	if c.gone.Load() {
		return nil, nil, c.goneError(typ)
	}
	c.reqMu.Lock()
	defer c.reqMu.Unlock()
	h, _, _ := ParseHeader(b)
	if err := WriteMessage(c.Conn, b, fds); err != nil {
		c.gone.Store(true)
		return nil, nil, c.goneError(typ)
	}
	var reply []byte
	var rfds []int
	for {
		var err error
		reply, rfds, err = ReadMessage(c.Conn, c.Buf)
		if err != nil {
			c.gone.Store(true)
			return nil, nil, c.goneError(typ)
		}
		rh, payload, perr := ParseHeader(reply)
		if perr != nil || (rh.Typ != msgRestarted && rh.Seq == h.Seq) {
			break
		}
		CloseFDs(rfds)
		if rh.Typ != msgRestarted {
			continue // a reply to a request sent twice across a restart, answered already
		}
		// A new server took over from a dead one, which may have read
		// this request and never answered: send it again, marked so
		// that a server that has it already drops the copy.
		if pid, _, err := decodeRestarted(&WireReader{B: payload}); err == nil {
			c.PeerPID.Store(int64(pid))
		}
		c.restarts.Add(1)
		again := append([]byte(nil), b...)
		binary.LittleEndian.PutUint32(again[12:], uint32(RequestRetried))
		if err := WriteMessage(c.Conn, again, fds); err != nil {
			c.gone.Store(true)
			return nil, nil, c.goneError(typ)
		}
	}
	// The reply aliases buf, which the next request reuses.
	r, err := ParseReply(append([]byte(nil), reply...), h)
	if err != nil {
		CloseFDs(rfds)
		return nil, nil, err
	}
	return r, rfds, nil
}

func (c *Client) goneError(typ MsgType) error {
	return fmt.Errorf("%w: %s: the fault server (pid %d) exited; managed memory that was not on the host is lost", core.ErrServerGone, typ, c.PeerPID.Load())
}

// jsonRequest sends a request whose reply is a JSON document and decodes
// the document into out.
func (c *Client) jsonRequest(b []byte, typ MsgType, out any) error {
	r, err := c.Request(b, typ)
	if err != nil {
		return err
	}
	text, err := decodeStringReply(r)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(text), out); err != nil {
		return fmt.Errorf("%w: %s reply: %v", core.ErrInternal, typ, err)
	}
	return nil
}

func (c *Client) Stats(scope uint8, addr uintptr) (core.Stats, error) {
	var st core.Stats
	err := c.jsonRequest(encodeStats(c.NextSeq(), StatsRequest{Scope: scope, Addr: uint64(addr)}), MsgStats, &st)
	return st, err
}

// Info returns the server's configuration and state.
func (c *Client) Info() (config.Info, error) {
	var in config.Info
	err := c.jsonRequest(EncodeInfo(c.NextSeq()), MsgInfo, &in)
	return in, err
}

// ServerStats returns the server's counters over every process it served.
func (c *Client) ServerStats() (core.Stats, error) { return c.Stats(ScopeServer, 0) }

// ServerPID is the fault server's process id.
func (c *Client) ServerPID() int { return int(c.PeerPID.Load()) }

// ServerRestarts is how many times a new server has taken over from a
// dead one, as this connection learnt at its requests.
func (c *Client) ServerRestarts() int { return int(c.restarts.Load()) }

// Close disconnects.
func (m *Monitor) Close() error {
	m.Closed.Store(true)
	return m.Conn.Close()
}
