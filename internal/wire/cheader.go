package wire

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/softuvm/softuvm/devmem"
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
)

// The C library speaks this protocol too. Its copy of every constant the
// two share is generated from the Go definitions below, so that the two
// cannot drift apart: `go generate ./internal/wire` writes
// libuvm/src/wire_gen.h, `make lint` and TestCHeaderFresh fail while the
// committed file is stale.
//
//go:generate go run ./internal/gencheader -o ../../libuvm/src/wire_gen.h

// cType is how C spells a constant: its suffix decides the type, and with
// it the printf formats the C code may use (%d, %u, %lu).
type cType int

const (
	cInt          cType = iota // int
	cUnsigned                  // unsigned int: u
	cUnsignedLong              // unsigned long, 64 bits on Linux: ul
)

// cConst is one constant shared with C: its C name, the Go name its
// value comes from (for the reader of the header), and the value.
type cConst struct {
	name, from string
	value      int64
	typ        cType
}

// cGroup is a block of the header: a C enum when enum names one (the C
// code declares variables of it), #defines otherwise.
type cGroup struct {
	doc    string
	enum   string
	consts []cConst
}

// named derives a C name from a Go one: goName without its package and
// trim, in upper snake case, after prefix ("codeInvalidValue", "code" ->
// prefix+"INVALID_VALUE"; "core.KindDevice", "" -> prefix+"KIND_DEVICE").
func named(prefix, goName, trim string) string {
	s := strings.TrimPrefix(goName[strings.LastIndex(goName, ".")+1:], trim)
	var b strings.Builder
	for i, r := range s {
		lower := func(j int) bool { return j < len(s) && s[j] >= 'a' && s[j] <= 'z' }
		if i > 0 && r >= 'A' && r <= 'Z' && (lower(i-1) || s[i-1] >= '0' && s[i-1] <= '9' || lower(i+1)) {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return prefix + strings.ToUpper(b.String())
}

// cConstants lists every constant libuvm shares with Go. Message types
// are enumerated from msgTypeNames, so a new one reaches C by itself;
// every other group is checked complete by TestCConstantsComplete.
func cConstants() []cGroup {
	c := func(prefix, goName, trim string, v int64, t cType) cConst {
		from := goName
		if !strings.Contains(from, ".") {
			from = "wire." + from
		}
		return cConst{name: named(prefix, goName, trim), from: from, value: v, typ: t}
	}
	msgs := cGroup{doc: "Message types (wire.MsgType), named as the protocol names them (MsgType.String).", enum: "uvm_msg_type"}
	for t := MsgHello; t < msgTypeEnd; t++ {
		name := "UVM_MSG_" + strings.ToUpper(strings.ReplaceAll(t.String(), "-", "_"))
		msgs.consts = append(msgs.consts, cConst{name: name, from: fmt.Sprintf("%q", t), value: int64(t), typ: cInt})
	}
	return []cGroup{
		{doc: "The message header: magic, version, type, sequence, status (wire.ParseHeader).", consts: []cConst{
			{"UVM_WIRE_MAGIC", `wire.wireMagic, "SUVM"`, wireMagic, cUnsigned},
			{"UVM_WIRE_VERSION", "wire.wireVersion", wireVersion, cUnsigned},
			{"UVM_WIRE_HEADER", "wire.wireHeaderSize", wireHeaderSize, cInt},
			{"UVM_MAX_MESSAGE", "wire.MaxMessageSize", MaxMessageSize, cUnsigned},
			// The status of a request sent again after a restart notice:
			// the new server drops it when it had read the first copy.
			{"UVM_WIRE_RETRIED", "wire.RequestRetried", int64(RequestRetried), cUnsigned},
		}},
		msgs,
		{doc: "Reply status codes (wire.errorCode).", enum: "uvm_wire_status", consts: []cConst{
			c("UVM_WIRE_", "CodeOK", "Code", int64(CodeOK), cInt),
			c("UVM_WIRE_", "codeInvalidValue", "code", int64(codeInvalidValue), cInt),
			c("UVM_WIRE_", "codeMemoryAllocation", "code", int64(codeMemoryAllocation), cInt),
			c("UVM_WIRE_", "codeInvalidDevice", "code", int64(codeInvalidDevice), cInt),
			c("UVM_WIRE_", "codeInitialization", "code", int64(codeInitialization), cInt),
			c("UVM_WIRE_", "codeNotSupported", "code", int64(codeNotSupported), cInt),
			c("UVM_WIRE_", "codeInternal", "code", int64(codeInternal), cInt),
			c("UVM_WIRE_", "codeLaunchFailure", "code", int64(codeLaunchFailure), cInt),
		}},
		{doc: "Session roles, in hello.", consts: []cConst{
			c("UVM_", "RoleClient", "", RoleClient, cInt),
			c("UVM_", "RoleMonitor", "", RoleMonitor, cInt),
		}},
		{doc: "Stats scopes, in stats requests.", consts: []cConst{
			c("UVM_", "ScopeServer", "", ScopeServer, cInt),
			c("UVM_", "ScopeSession", "", ScopeSession, cInt),
			c("UVM_", "ScopeRange", "", ScopeRange, cInt),
		}},
		{doc: "Memory kinds, in alloc requests (core.RangeKind).", enum: "uvm_kind", consts: []cConst{
			c("UVM_", "core.KindManaged", "", int64(core.KindManaged), cInt),
			c("UVM_", "core.KindPinnedHost", "", int64(core.KindPinnedHost), cInt),
			c("UVM_", "core.KindDevice", "", int64(core.KindDevice), cInt),
		}},
		{doc: "Advice, in advise requests (core.Advice); uvm.h's uvmMemoryAdvise must equal them.", consts: []cConst{
			c("UVM_", "core.AdviseSetReadMostly", "", int64(core.AdviseSetReadMostly), cInt),
			c("UVM_", "core.AdviseUnsetReadMostly", "", int64(core.AdviseUnsetReadMostly), cInt),
			c("UVM_", "core.AdviseSetPreferredLocation", "", int64(core.AdviseSetPreferredLocation), cInt),
			c("UVM_", "core.AdviseUnsetPreferredLocation", "", int64(core.AdviseUnsetPreferredLocation), cInt),
			c("UVM_", "core.AdviseSetAccessedBy", "", int64(core.AdviseSetAccessedBy), cInt),
			c("UVM_", "core.AdviseUnsetAccessedBy", "", int64(core.AdviseUnsetAccessedBy), cInt),
		}},
		{doc: "Attachment flags of a managed allocation, in alloc and stream-attach requests; uvm.h's uvmMemAttach* must equal them.", consts: []cConst{
			c("UVM_", "core.AttachGlobal", "", int64(core.AttachGlobal), cUnsigned),
			c("UVM_", "core.AttachHost", "", int64(core.AttachHost), cUnsigned),
			c("UVM_", "core.AttachSingle", "", int64(core.AttachSingle), cUnsigned),
		}},
		{doc: "Coherence models, in hello requests (0: the server's) and replies.", consts: []cConst{
			c("UVM_", "core.CoherenceDefault", "", int64(core.CoherenceDefault), cInt),
			c("UVM_", "core.CoherenceFault", "", int64(core.CoherenceFault), cInt),
			c("UVM_", "core.CoherenceLaunch", "", int64(core.CoherenceLaunch), cInt),
		}},
		{doc: "Processors: an int32 on the wire, -1 for the CPU, 0 to UVM_MAX_DEVICES-1 for a device (core.Device).", consts: []cConst{
			c("UVM_", "core.CPU", "", int64(core.CPU), cInt),
			c("UVM_", "core.InvalidDevice", "", int64(core.InvalidDevice), cInt),
			c("UVM_", "core.MaxDevices", "", core.MaxDevices, cInt),
		}},
		{doc: "Device copy operations, in device-copy requests.", consts: []cConst{
			c("UVM_", "DeviceWritten", "", DeviceWritten, cInt),
		}},
		{doc: "Launches and streams.", consts: []cConst{
			c("UVM_", "MaxLaunchThreads", "", MaxLaunchThreads, cUnsigned),
			c("UVM_", "AllStreams", "", int64(AllStreams), cUnsigned),
			c("UVM_", "core.MaxKernelParams", "", core.MaxKernelParams, cInt),
		}},
		{doc: "Grid launches (core/grid.go): the limits of a grid and of a block, residency, thread stacks, the feature level a device reports, launch-grid flags.", consts: []cConst{
			c("UVM_", "core.MaxThreadsPerBlock", "", core.MaxThreadsPerBlock, cUnsigned),
			c("UVM_", "core.MaxBlockDimX", "", core.MaxBlockDimX, cUnsigned),
			c("UVM_", "core.MaxBlockDimY", "", core.MaxBlockDimY, cUnsigned),
			c("UVM_", "core.MaxBlockDimZ", "", core.MaxBlockDimZ, cUnsigned),
			c("UVM_", "core.MaxGridDimX", "", core.MaxGridDimX, cUnsigned),
			c("UVM_", "core.MaxGridDimY", "", core.MaxGridDimY, cUnsigned),
			c("UVM_", "core.MaxGridDimZ", "", core.MaxGridDimZ, cUnsigned),
			c("UVM_", "core.MaxSharedMemoryPerBlock", "", core.MaxSharedMemoryPerBlock, cUnsigned),
			c("UVM_", "core.MaxBlocksPerMultiprocessor", "", core.MaxBlocksPerMultiprocessor, cUnsigned),
			c("UVM_", "core.MaxThreadsPerMultiprocessor", "", core.MaxThreadsPerMultiprocessor, cUnsigned),
			c("UVM_", "core.SharedMemoryPerMultiprocessor", "", core.SharedMemoryPerMultiprocessor, cUnsigned),
			c("UVM_", "core.WarpSize", "", core.WarpSize, cInt),
			c("UVM_", "core.ComputeCapabilityMajor", "", core.ComputeCapabilityMajor, cInt),
			c("UVM_", "core.ComputeCapabilityMinor", "", core.ComputeCapabilityMinor, cInt),
			c("UVM_", "core.DefaultStackSize", "", core.DefaultStackSize, cUnsigned),
			c("UVM_", "core.MinStackSize", "", core.MinStackSize, cUnsigned),
			c("UVM_", "core.MaxStackSize", "", core.MaxStackSize, cUnsigned),
			c("UVM_", "core.GridCooperative", "", core.GridCooperative, cUnsigned),
		}},
		{doc: "Trace control operations, in trace-control requests (the profiler API).", consts: []cConst{
			c("UVM_", "TraceStart", "", TraceStart, cInt),
			c("UVM_", "TraceStop", "", TraceStop, cInt),
		}},
		{doc: "Device trace reports: the device-trace notice's flags, the kinds of a device report's records, a report's bounds.", consts: []cConst{
			c("UVM_", "TraceLaunches", "", TraceLaunches, cUnsigned),
			c("UVM_", "ReportLaunch", "", int64(ReportLaunch), cInt),
			c("UVM_", "ReportSync", "", int64(ReportSync), cInt),
			c("UVM_", "MaxReportRecords", "", MaxReportRecords, cInt),
			c("UVM_", "MaxReportName", "", MaxReportName, cInt),
		}},
		{doc: "The layout of memory: pages, blocks, the managed window, the processors' files.", consts: []cConst{
			{"UVM_PAGE_SIZE", "core.PageSize", core.PageSize, cUnsignedLong},
			{"UVM_BLOCK_SIZE", "core.BlockSize", core.BlockSize, cUnsignedLong},
			// A device-map request's write-protect mask: a page set of one block.
			{"UVM_PAGE_MASK_WORDS", "len(core.PageMask{})", int64(len(core.PageMask{})), cInt},
			{"UVM_WINDOW_START", "config.ManagedWindowStart", config.ManagedWindowStart, cUnsignedLong},
			{"UVM_WINDOW_SIZE", "config.ManagedWindowSize", config.ManagedWindowSize, cUnsignedLong},
			{"UVM_FILE_SIZE", "devmem.FileSize", devmem.FileSize, cUnsignedLong},
			{"UVM_MAX_ALLOCATION", "core.MaxAllocation", core.MaxAllocation, cUnsignedLong},
		}},
	}
}

// CHeader returns libuvm/src/wire_gen.h as the Go definitions give it.
func CHeader() []byte {
	var b bytes.Buffer
	b.WriteString(`// Code generated by internal/wire/internal/gencheader; DO NOT EDIT.

/*
 * wire_gen.h: the constants libuvm shares with the Go side, each from its
 * Go definition (internal/wire/cheader.go lists them). Regenerate with
 * ` + "`go generate ./internal/wire`" + `; internal.h includes it.
 */
#ifndef UVM_WIRE_GEN_H
#define UVM_WIRE_GEN_H
`)
	for _, g := range cConstants() {
		fmt.Fprintf(&b, "\n/* %s */\n", g.doc)
		width, vwidth := 0, 0
		for _, k := range g.consts {
			width, vwidth = max(width, len(k.name)), max(vwidth, len(cValue(k, g.enum != "")))
		}
		if g.enum != "" {
			fmt.Fprintf(&b, "enum %s {\n", g.enum)
			for _, k := range g.consts {
				fmt.Fprintf(&b, "\t%-*s = %-*s /* %s */\n", width, k.name, vwidth+1, cValue(k, true)+",", k.from)
			}
			b.WriteString("};\n")
			continue
		}
		for _, k := range g.consts {
			fmt.Fprintf(&b, "#define %-*s %-*s /* %s */\n", width, k.name, vwidth, cValue(k, false), k.from)
		}
	}
	b.WriteString("\n#endif /* UVM_WIRE_GEN_H */\n")
	return b.Bytes()
}

// cValue spells k's value as C: large values in hex, as the Go source
// mostly writes them, with the suffix of its type unless it is an enum
// member (always an int), negative ones in parentheses, so that a macro
// expands safely anywhere.
func cValue(k cConst, enum bool) string {
	v := k.value
	s := fmt.Sprint(v)
	if v >= 1<<16 {
		s = fmt.Sprintf("%#x", v)
	}
	if !enum {
		s += [...]string{cInt: "", cUnsigned: "u", cUnsignedLong: "ul"}[k.typ]
	}
	if v < 0 {
		s = "(" + s + ")"
	}
	return s
}
