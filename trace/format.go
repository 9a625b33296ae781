package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// The file format, version 5 (docs/traces.md describes it for readers in
// other languages):
//
//	file    = magic version header record* end
//	magic   = "SOFTUVMT" (8 bytes)
//	version = uvarint (5; version 4 lacks kind 16, protect, version 3
//	          also kind 15, discard, version 2
//	          also populate's cause and launch's duration, and version 1
//	          also kinds 13 and 14, arm and access; all are read)
//	header  = uvarint length, then that many bytes of JSON (Header)
//	record  = kind (1 byte), dt (varint: nanoseconds since the previous
//	          record's Time, zigzag, since threads race to the writer),
//	          then the kind's fields, in the order of its fields entry,
//	          each a uvarint (varint for the signed ones) or, for Name,
//	          a uvarint length and the bytes
//	end     = kind 0xff, dt, dropped (uvarint: events lost because the
//	          writer fell behind)
//
// A reader that meets a kind it does not know cannot skip it: a new kind
// or a new field makes a new version.
const (
	magic   = "SOFTUVMT"
	Version = 5
)

// field is one field of a record.
type field uint8

const (
	fPID field = iota
	fThread
	fProcessor
	fFrom
	fTo
	fRange
	fAddr
	fPages
	fBytes
	fFaultFlags // FaultKind | Write<<7
	fPrefetched
	fCause
	fDuration
	fStream
	fName
	fDropped
)

// fields lists each kind's fields, in the order they are written.
var fields = map[Kind][]field{
	KindFault:      {fPID, fThread, fProcessor, fRange, fAddr, fFaultFlags, fDuration, fPrefetched},
	KindMigration:  {fPID, fFrom, fTo, fCause, fRange, fAddr, fPages, fDuration},
	KindEviction:   {fPID, fFrom, fRange, fAddr, fPages},
	KindPopulate:   {fPID, fTo, fRange, fAddr, fPages, fCause},
	KindRemoteMap:  {fPID, fProcessor, fRange, fAddr, fPages},
	KindDuplicate:  {fPID, fTo, fRange, fAddr, fPages},
	KindLaunch:     {fPID, fProcessor, fStream, fName, fDuration},
	KindSync:       {fPID, fProcessor, fStream, fDuration},
	KindAlloc:      {fPID, fRange, fAddr, fBytes},
	KindFree:       {fPID, fRange, fAddr},
	KindSession:    {fPID, fName},
	KindSessionEnd: {fPID},
	KindArm:        {fPID, fProcessor, fRange, fAddr, fPages},
	KindAccess:     {fPID, fProcessor, fRange, fAddr, fPages, fDuration},
	KindDiscard:    {fPID, fRange, fAddr, fPages},
	KindProtect:    {fPID, fProcessor, fRange, fAddr, fPages},
	kindEnd:        {fDropped},
}

// fieldsBefore3 are the kinds whose fields version 3 changed, as
// versions 1 and 2 wrote them.
var fieldsBefore3 = map[Kind][]field{
	KindPopulate: {fPID, fTo, fRange, fAddr, fPages},
	KindLaunch:   {fPID, fProcessor, fStream, fName},
}

// maxName bounds a Name: a longer one is cut when written.
const maxName = 4096

// appendEvent appends e's record to buf; prev is the previous record's
// Time.
func appendEvent(buf []byte, e *Event, prev time.Duration, dropped uint64) []byte {
	buf = append(buf, byte(e.Kind))
	buf = binary.AppendVarint(buf, int64(e.Time-prev))
	for _, f := range fields[e.Kind] {
		switch f {
		case fPID:
			buf = binary.AppendVarint(buf, int64(e.PID))
		case fThread:
			buf = binary.AppendVarint(buf, int64(e.Thread))
		case fProcessor:
			buf = binary.AppendVarint(buf, int64(e.Processor))
		case fFrom:
			buf = binary.AppendVarint(buf, int64(e.From))
		case fTo:
			buf = binary.AppendVarint(buf, int64(e.To))
		case fRange:
			buf = binary.AppendUvarint(buf, e.Range)
		case fAddr:
			buf = binary.AppendUvarint(buf, e.Addr)
		case fPages:
			buf = binary.AppendUvarint(buf, uint64(e.Pages))
		case fBytes:
			buf = binary.AppendUvarint(buf, e.Bytes)
		case fFaultFlags:
			flags := uint64(e.FaultKind & 0x7f)
			if e.Write {
				flags |= 0x80
			}
			buf = binary.AppendUvarint(buf, flags)
		case fPrefetched:
			buf = binary.AppendUvarint(buf, uint64(e.Prefetched))
		case fCause:
			buf = binary.AppendUvarint(buf, uint64(e.Cause))
		case fDuration:
			buf = binary.AppendUvarint(buf, uint64(max(e.Duration, 0)))
		case fStream:
			buf = binary.AppendUvarint(buf, e.Stream)
		case fName:
			name := e.Name
			if len(name) > maxName {
				name = name[:maxName]
			}
			buf = binary.AppendUvarint(buf, uint64(len(name)))
			buf = append(buf, name...)
		case fDropped:
			buf = binary.AppendUvarint(buf, dropped)
		}
	}
	return buf
}

// decoder reads records from a buffered stream.
type decoder struct {
	version uint64
	r       *bufio.Reader
	off     int64 // bytes read so far, for errors
	tmp     []byte
}

func (d *decoder) ReadByte() (byte, error) {
	c, err := d.r.ReadByte()
	if err == nil {
		d.off++
	}
	return c, err
}

func (d *decoder) uvarint() (uint64, error) {
	at := d.off
	v, err := binary.ReadUvarint(d)
	return v, d.fieldErr(at, err)
}

func (d *decoder) varint() (int64, error) {
	at := d.off
	v, err := binary.ReadVarint(d)
	return v, d.fieldErr(at, err)
}

func (d *decoder) fieldErr(at int64, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%w: the trace ends inside a record at byte %d (a writer that was killed?)", io.ErrUnexpectedEOF, at)
	default:
		return fmt.Errorf("byte %d: %w", at, err)
	}
}

// event decodes one record into e, after its kind byte; prev is the
// previous record's Time. It returns the dropped count of an end record.
func (d *decoder) event(k Kind, e *Event, prev time.Duration) (dropped uint64, err error) {
	list, ok := fields[k]
	if old, changed := fieldsBefore3[k]; changed && d.version < 3 {
		list = old
	}
	if !ok {
		return 0, fmt.Errorf("unknown record kind %d (a trace of a newer version?)", uint8(k))
	}
	*e = Event{Kind: k}
	dt, err := d.varint()
	if err != nil {
		return 0, err
	}
	e.Time = prev + time.Duration(dt)
	for _, f := range list {
		var s int64
		var u uint64
		switch f {
		case fPID, fThread, fProcessor, fFrom, fTo:
			s, err = d.varint()
		case fName:
			u, err = d.uvarint()
			if err == nil {
				if u > maxName {
					return 0, fmt.Errorf("a name of %d bytes (at most %d are written)", u, maxName)
				}
				if cap(d.tmp) < int(u) {
					d.tmp = make([]byte, u)
				}
				d.tmp = d.tmp[:u]
				if _, err = io.ReadFull(d.r, d.tmp); err != nil {
					return 0, d.fieldErr(d.off, err)
				}
				d.off += int64(u)
				e.Name = string(d.tmp)
			}
		default:
			u, err = d.uvarint()
		}
		if err != nil {
			return 0, err
		}
		switch f {
		case fPID:
			e.PID = int32(s)
		case fThread:
			e.Thread = int32(s)
		case fProcessor:
			e.Processor = int32(s)
		case fFrom:
			e.From = int32(s)
		case fTo:
			e.To = int32(s)
		case fRange:
			e.Range = u
		case fAddr:
			e.Addr = u
		case fPages:
			e.Pages = uint32(u)
		case fBytes:
			e.Bytes = u
		case fFaultFlags:
			e.FaultKind = FaultKind(u & 0x7f)
			e.Write = u&0x80 != 0
		case fPrefetched:
			e.Prefetched = uint32(u)
		case fCause:
			e.Cause = Cause(u)
		case fDuration:
			e.Duration = time.Duration(u)
		case fStream:
			e.Stream = u
		case fDropped:
			dropped = u
		}
	}
	return dropped, nil
}
