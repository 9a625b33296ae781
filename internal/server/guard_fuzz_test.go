package server

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
		GuardConfigMsg(ModeDaemon, 5, `{"devices":[]}`),
		GuardSessionMsg(1, 100, 0x1ff),
		GuardLocMsg(GuardFile, 1, 1),
		GuardViewMsg(1, 1, 101),
		GuardLocMsg(GuardViewGone, 1, 1),
		GuardRecordMsg(1, AllocRecord(wire.EncodeAlloc(0, wire.AllocRequest{Addr: 1 << 30, Length: 8192, Size: 8000}))),
		GuardRecordMsg(1, AdviseRecord(wire.EncodeAdvise(0, wire.AdviseRequest{Addr: 1 << 30, Length: 4096, Advice: uint8(core.AdviseSetReadMostly)}))),
		GuardRecordMsg(1, FreeRecord(1<<30)),
		GuardIDMsg(GuardEnd, 1),
		{GuardQuit}, {GuardStaging},
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := NewKeptState()
		// A session to address, as the server would have sent first.
		st.Sessions[1] = &KeptSession{Id: 1, Conn: -1, Uffd: -1, Host: -1, Files: map[core.Device]int{}, Views: map[core.Device]*KeptView{}, Journal: NewJournal()}
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
