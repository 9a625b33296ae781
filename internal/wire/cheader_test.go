package wire

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/softuvm/softuvm/internal/core"
)

const cHeaderPath = "../../libuvm/src/wire_gen.h"

// TestCHeaderFresh: the committed libuvm/src/wire_gen.h is what the Go
// definitions give, so that `make test` catches a constant changed on
// one side only (`make lint` checks the same).
func TestCHeaderFresh(t *testing.T) {
	got, err := os.ReadFile(cHeaderPath)
	require.NoError(t, err)
	want := CHeader()
	if bytes.Equal(got, want) {
		return
	}
	gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < max(len(gl), len(wl)); i++ {
		g, w := "(end of file)", "(end of file)"
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("libuvm/src/wire_gen.h is stale: run go generate ./internal/wire\nline %d is   %q\nthe Go gives %q", i+1, g, w)
		}
	}
}

// TestCConstantsComplete: every value of each enumeration the C library
// shares is in the header, in order, and no C name is used twice.
func TestCConstantsComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range cConstants() {
		for _, k := range g.consts {
			assert.False(t, seen[k.name], "C name %s is used twice", k.name)
			seen[k.name] = true
		}
	}
	// values returns the values of the constants whose C names start
	// with prefix (or of the enum of that name).
	values := func(prefix string) []int64 {
		var vs []int64
		for _, g := range cConstants() {
			for _, k := range g.consts {
				if g.enum == prefix || strings.HasPrefix(k.name, prefix) {
					vs = append(vs, k.value)
				}
			}
		}
		return vs
	}
	span := func(lo, hi int64) []int64 {
		var vs []int64
		for v := lo; v <= hi; v++ {
			vs = append(vs, v)
		}
		return vs
	}
	for _, c := range []struct {
		prefix string
		want   []int64
	}{
		{"uvm_msg_type", span(int64(MsgHello), int64(msgTypeEnd)-1)},
		{"uvm_wire_status", span(int64(CodeOK), int64(len(codeErrors))-1)},
		{"uvm_kind", span(int64(core.KindManaged), int64(core.KindDevice))},
		{"UVM_ROLE_", []int64{RoleClient, RoleMonitor}},
		{"UVM_SCOPE_", span(ScopeServer, ScopeRange)},
		{"UVM_ADVISE_", span(int64(core.AdviseSetReadMostly), int64(core.AdviseUnsetAccessedBy))},
		{"UVM_ATTACH_", []int64{int64(core.AttachGlobal), int64(core.AttachHost), int64(core.AttachSingle)}},
		{"UVM_COHERENCE_", span(int64(core.CoherenceDefault), int64(core.CoherenceLaunch))},
		{"UVM_REPORT_", []int64{int64(ReportLaunch), int64(ReportSync)}},
	} {
		assert.Equal(t, c.want, values(c.prefix), "values of the C constants %s", c.prefix)
	}
	// Each enumeration above ends where the Go code ends it: the next
	// value has no name.
	assert.Equal(t, fmt.Sprintf("message-type-%d", int(msgTypeEnd)), msgTypeEnd.String())
	assert.Equal(t, "memory kind 3", (core.KindDevice + 1).String())
	assert.Equal(t, "advice(7)", (core.AdviseUnsetAccessedBy + 1).String())
}

func TestNamed(t *testing.T) {
	for _, c := range []struct{ prefix, goName, trim, want string }{
		{"UVM_WIRE_", "codeInvalidValue", "code", "UVM_WIRE_INVALID_VALUE"},
		{"UVM_WIRE_", "CodeOK", "Code", "UVM_WIRE_OK"},
		{"UVM_", "core.KindPinnedHost", "", "UVM_KIND_PINNED_HOST"},
		{"UVM_", "core.CPU", "", "UVM_CPU"},
		{"UVM_", "MaxLaunchThreads", "", "UVM_MAX_LAUNCH_THREADS"},
		{"UVM_", "HTTPServer", "", "UVM_HTTP_SERVER"},
	} {
		assert.Equal(t, c.want, named(c.prefix, c.goName, c.trim), "named(%q, %q, %q)", c.prefix, c.goName, c.trim)
	}
}
