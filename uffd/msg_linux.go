package uffd

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MsgSize is sizeof(struct uffd_msg): read(2) on a userfaultfd returns whole
// messages of this size.
const MsgSize = 32

// maxReadMsgs bounds one ReadMessages call, so that its buffer fits on the
// stack and the fault path does not allocate.
const maxReadMsgs = 64

// smallReadMsgs is the largest read that uses a small buffer.
const smallReadMsgs = 8

// Msg is a decoded struct uffd_msg; which fields are meaningful depends on
// Event, the others are zero.
type Msg struct {
	Event Event

	// EventPagefault
	Flags   PagefaultFlag
	Address uint64 // page aligned unless FeatureExactAddress
	TID     uint32 // the faulting thread, with FeatureThreadID

	// EventFork: a new userfaultfd, installed in this process by the read,
	// that serves the child's copy of the registered ranges. The receiver
	// owns it (NewFD, then SetHandshaken with the parent's features).
	ChildFD int

	// EventRemap: the registration moved from [From, From+Len) to
	// [To, To+Len).
	From, To, Len uint64

	// EventRemove, EventUnmap: [Start, End) was zapped or unmapped.
	Start, End uint64
}

var native = binary.NativeEndian

// DecodeMsg decodes one message of exactly MsgSize bytes. A message of an
// unknown event is an error that names the value; Event is still set.
func DecodeMsg(b []byte) (Msg, error) {
	var m Msg
	if len(b) != MsgSize {
		return m, errors.New("uffd: message is " + strconv.Itoa(len(b)) + " bytes, want " + strconv.Itoa(MsgSize))
	}
	err := decodeMsg(&m, (*[MsgSize]byte)(b))
	return m, err
}

// decodeMsg fills m, which must be zero, from one message.
func decodeMsg(m *Msg, b *[MsgSize]byte) error {
	m.Event = Event(b[msgOffEvent])
	switch m.Event {
	case EventPagefault:
		m.Flags = PagefaultFlag(native.Uint64(b[msgOffPFFlags:]))
		m.Address = native.Uint64(b[msgOffPFAddress:])
		m.TID = native.Uint32(b[msgOffPFPtid:])
	case EventFork:
		m.ChildFD = int(native.Uint32(b[msgOffForkUfd:]))
	case EventRemap:
		m.From = native.Uint64(b[msgOffRemapFrom:])
		m.To = native.Uint64(b[msgOffRemapTo:])
		m.Len = native.Uint64(b[msgOffRemapLen:])
	case EventRemove, EventUnmap:
		m.Start = native.Uint64(b[msgOffRemoveFrom:])
		m.End = native.Uint64(b[msgOffRemoveEnd:])
	default:
		return errors.New("uffd: message with unknown event 0x" + strconv.FormatUint(uint64(m.Event), 16))
	}
	return nil
}

// String describes the message, for example
// "PAGEFAULT 0x7f0000001000 flags=WRITE tid=4242".
func (m Msg) String() string {
	var b strings.Builder
	b.WriteString(m.Event.String())
	hex := func(k string, v uint64) {
		b.WriteString(k)
		b.WriteString("0x")
		b.WriteString(strconv.FormatUint(v, 16))
	}
	switch m.Event {
	case EventPagefault:
		hex(" ", m.Address)
		b.WriteString(" flags=")
		b.WriteString(m.Flags.String())
		if m.TID != 0 {
			b.WriteString(" tid=")
			b.WriteString(strconv.FormatUint(uint64(m.TID), 10))
		}
	case EventFork:
		b.WriteString(" childfd=")
		b.WriteString(strconv.Itoa(m.ChildFD))
	case EventRemap:
		hex(" from=", m.From)
		hex(" to=", m.To)
		b.WriteString(" len=")
		b.WriteString(strconv.FormatUint(m.Len, 10))
	case EventRemove, EventUnmap:
		hex(" ", m.Start)
		hex("-", m.End)
	}
	return b.String()
}

// ReadMessages reads up to len(msgs) pending messages (at most 64) with one
// read(2) and decodes them. On a NonBlock fd with nothing pending it returns
// 0, nil; on a blocking fd it waits for the first message. Several
// goroutines may call it at once on one FD: each message goes to exactly
// one of them. It does not allocate.
//
// A message of an unknown event is counted, has only Event set, and makes
// err non-nil; the others are decoded normally, so no EventFork fd is lost.
func (f *FD) ReadMessages(msgs []Msg) (int, error) {
	// Go zeroes stack buffers, so a small read gets a small one.
	switch n := len(msgs); {
	case n == 0:
		return 0, nil
	case n <= smallReadMsgs:
		var buf [smallReadMsgs * MsgSize]byte
		return f.readMessages(msgs, buf[:n*MsgSize])
	default:
		var buf [maxReadMsgs * MsgSize]byte
		return f.readMessages(msgs, buf[:min(n, maxReadMsgs)*MsgSize])
	}
}

// ReadMessagesNoWait is ReadMessages that never waits, even on a blocking
// fd: with nothing pending it returns 0, nil at once (preadv2 with
// RWF_NOWAIT, which the kernel's userfaultfd honours). A thread that must
// see an event before it can go on (an ioctl refused with ErrAgain while
// an mremap's event is unread) reads it this way without changing the
// fd's blocking mode under the other readers.
func (f *FD) ReadMessagesNoWait(msgs []Msg) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	var buf [smallReadMsgs * MsgSize]byte
	return f.readMessagesWith(msgs, buf[:min(len(msgs), smallReadMsgs)*MsgSize], true)
}

func (f *FD) readMessages(msgs []Msg, buf []byte) (int, error) {
	return f.readMessagesWith(msgs, buf, false)
}

func (f *FD) readMessagesWith(msgs []Msg, buf []byte, noWait bool) (int, error) {
	var n int
	for {
		var err error
		if noWait {
			n, err = readNoWait(f.fd, buf)
		} else {
			n, err = unix.Read(f.fd, buf)
		}
		if err == nil {
			break
		}
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, &OpError{Op: "read", noRange: true, Err: err}
	}
	count := n / MsgSize
	var firstErr error
	for i := range count {
		msgs[i] = Msg{}
		if err := decodeMsg(&msgs[i], (*[MsgSize]byte)(buf[i*MsgSize:])); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return count, firstErr
}
