package guard

import (
	"testing"

	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/internal/wire"
)

// FuzzGuardMessage feeds the guard's state whatever bytes (without
// descriptors, which it refuses where they are wanted): it keeps what is
// well formed, refuses the rest, and never panics.
func FuzzGuardMessage(f *testing.F) {
	for _, b := range [][]byte{
		ConfigMsg(ModeDaemon, 5, `{"devices":[]}`),
		SessionMsg(1, 100, 0x1ff),
		LocMsg(OpFile, 1, 1),
		ViewMsg(1, 1, 101),
		LocMsg(OpViewGone, 1, 1),
		RecordMsg(1, AllocRecord(wire.EncodeAlloc(0, wire.AllocRequest{Addr: 1 << 30, Length: 8192, Size: 8000}))),
		RecordMsg(1, AdviseRecord(wire.EncodeAdvise(0, wire.AdviseRequest{Addr: 1 << 30, Length: 4096, Advice: uint8(core.AdviseSetReadMostly)}))),
		RecordMsg(1, FreeRecord(1<<30)),
		IDMsg(OpEnd, 1),
		{OpQuit}, {OpStaging},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := NewState()
		// A session to address, as the server would have sent first.
		st.Sessions[1] = &Session{ID: 1, Conn: -1, Uffd: -1, Host: -1, Files: map[core.Device]int{}, Views: map[core.Device]*View{}, Journal: NewJournal()}
		st.Apply(b, nil)
		for _, ks := range st.Sessions {
			for _, rec := range ks.Journal.Records() {
				if _, _, err := wire.ParseRequest(rec[1:]); err != nil {
					t.Fatalf("the journal kept a record that does not parse: % x", rec)
				}
			}
		}
	})
}
