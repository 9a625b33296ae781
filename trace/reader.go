package trace

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Reader reads a trace's events in the order they were written.
type Reader struct {
	h       Header
	d       decoder
	prev    time.Duration
	dropped uint64
	ended   bool
	file    io.Closer
}

// Open opens the trace file path and reads its header.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.file = f
	return r, nil
}

// NewReader reads a trace's header from src. A trace compressed with
// gzip (the lab's shipped traces, `gzip t.uvmtrace`) is read through it.
func NewReader(src io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(src, 1<<20)
	if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("a gzip file that does not open: %w", err)
		}
		br = bufio.NewReaderSize(zr, 1<<20)
	}
	r := &Reader{d: decoder{r: br}}
	var m [len(magic)]byte
	if _, err := io.ReadFull(r.d.r, m[:]); err != nil || string(m[:]) != magic {
		return nil, fmt.Errorf("not a softuvm trace: it does not start with %q", magic)
	}
	r.d.off = int64(len(magic))
	v, err := r.d.uvarint()
	if err != nil {
		return nil, err
	}
	if v < 1 || v > Version {
		return nil, fmt.Errorf("a trace of format version %d; this reader reads versions 1 to %d", v, Version)
	}
	r.d.version = v
	n, err := r.d.uvarint()
	if err != nil {
		return nil, err
	}
	if n > 1<<20 {
		return nil, fmt.Errorf("a header of %d bytes (a damaged file?)", n)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r.d.r, js); err != nil {
		return nil, fmt.Errorf("%w: the trace ends inside its header", io.ErrUnexpectedEOF)
	}
	r.d.off += int64(n)
	if err := json.Unmarshal(js, &r.h); err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	return r, nil
}

// Header is the trace's header.
func (r *Reader) Header() Header { return r.h }

// Next reads the next event into e. At the trace's end it returns
// io.EOF; a trace cut short (its writer killed) ends with an error
// wrapping io.ErrUnexpectedEOF, after every whole event.
func (r *Reader) Next(e *Event) error {
	if r.ended {
		return io.EOF
	}
	at := r.d.off
	k, err := r.d.ReadByte()
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: the trace has no end record after byte %d (its writer did not close it)", io.ErrUnexpectedEOF, at)
	}
	if err != nil {
		return err
	}
	dropped, err := r.d.event(Kind(k), e, r.prev)
	if err != nil {
		return fmt.Errorf("record at byte %d: %w", at, err)
	}
	if Kind(k) == kindEnd {
		r.ended, r.dropped = true, dropped
		return io.EOF
	}
	r.prev = e.Time
	return nil
}

// Dropped is how many events the writer dropped because it fell behind,
// known once Next has returned io.EOF.
func (r *Reader) Dropped() uint64 { return r.dropped }

// Close closes the file Open opened.
func (r *Reader) Close() error {
	if r.file != nil {
		return r.file.Close()
	}
	return nil
}

// ReadFile reads a whole trace into memory.
func ReadFile(path string) (Header, []Event, error) {
	r, err := Open(path)
	if err != nil {
		return Header{}, nil, err
	}
	defer r.Close()
	var out []Event
	for {
		var e Event
		err := r.Next(&e)
		if errors.Is(err, io.EOF) {
			return r.h, out, nil
		}
		if err != nil {
			return r.h, out, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, e)
	}
}
