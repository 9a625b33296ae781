// Command latepolicy is a program whose policies register from package
// main's init function, after package uvm has initialized: the case
// integration/policy_test.go checks. It calls uvm.Main first in main
// (unless LATEPOLICY_WITHOUT_MAIN is set, to see the error a program
// that forgets gets), and then either runs a client of its own or is the
// uvm command with these policies linked in.
//
//	latepolicy client EVICTION   a private server with EVICTION; prints a JSON report
//	latepolicy COMMAND ...       uvm COMMAND ..., as package cli runs it
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"syscall"

	"github.com/softuvm/softuvm/cli"
	"github.com/softuvm/softuvm/policy"
	_ "github.com/softuvm/softuvm/policy/coursework" // "mru", which late-mru renames
	"github.com/softuvm/softuvm/uvm"
)

// renamed is an eviction policy under another name: the server's info
// shows the name, so a server that built something else is seen.
type renamed struct {
	policy.Eviction
	name string
}

func (r renamed) Name() string { return r.name }

// init runs after every package this one imports, uvm included: in a
// re-executed server, after uvm's init function has seen the role.
func init() {
	err := policy.RegisterEviction("late-mru", func(arg string) (policy.Eviction, error) {
		e, err := policy.NewEviction("mru")
		return renamed{e, "late-mru"}, err
	})
	if err != nil {
		panic(err)
	}
	// Chosen per allocation (uvm.WithPrefetch), never by the server's
	// configuration: the server cannot tell from its configuration that
	// it will be asked for it.
	err = policy.RegisterPrefetchPolicy("late-evens", func(arg string) (policy.PrefetchPolicy, error) {
		return policy.NewPrefetchPolicy(policy.PrefetchSpec{Policy: "evens"})
	})
	if err != nil {
		panic(err)
	}
}

// report is what client prints.
type report struct {
	Eviction string   `json:"eviction"`
	Evicted  []uint64 `json:"evicted"` // pages of each allocation evicted from device 0
	// Pages prefetched into an allocation of two blocks whose prefetch
	// policy is late-evens, by a write to page 5 of its first block, and
	// after the takeover, to page 5 of its second.
	Prefetched        uint64 `json:"prefetched"`
	AdoptedPrefetched uint64 `json:"adopted_prefetched"`
	// After the private server was killed, the one that took over.
	AdoptedEviction string `json:"adopted_eviction"`
	Restarts        uint64 `json:"restarts"`
}

// client fills a device of three blocks with allocations 0, 1 and 2, in
// that order, then prefetches a fourth: MRU evicts allocation 2, LRU 0.
// It writes a page of an allocation whose prefetch policy is late-evens.
// It then kills its server, asks the one that takes over for its
// eviction policy, and writes a page of the late-evens allocation again.
func client(eviction string) int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "latepolicy: "+format+"\n", a...)
		return 1
	}
	cfg := uvm.DefaultServerConfig()
	cfg.Devices[0].Capacity = 3 * uvm.BlockSize
	cfg.Eviction = eviction
	s, err := uvm.Connect(uvm.Config{Server: "private", Private: cfg})
	if err != nil {
		return fail("connect: %v", err)
	}
	defer s.Close()
	in, err := s.Info()
	if err != nil {
		return fail("info: %v", err)
	}
	rep := report{Eviction: in.Eviction}
	var allocs []*uvm.Allocation
	for i := 0; i < 4; i++ {
		a, err := s.MallocManaged(uvm.BlockSize)
		if err != nil {
			return fail("allocation %d: %v", i, err)
		}
		b := a.Bytes()
		for p := 0; p < len(b); p += uvm.PageSize {
			b[p] = byte(i + 1)
		}
		allocs = append(allocs, a)
	}
	for i, a := range allocs {
		if err := a.Prefetch(0); err != nil {
			return fail("prefetch %d: %v", i, err)
		}
	}
	for i, a := range allocs {
		st, err := a.Stats()
		if err != nil {
			return fail("stats %d: %v", i, err)
		}
		rep.Evicted = append(rep.Evicted, st.EvictedPages(0))
	}
	spec, err := uvm.ParsePrefetchSpec("late-evens")
	if err != nil {
		return fail("%v", err)
	}
	evens, err := s.MallocManaged(2*uvm.BlockSize, uvm.WithPrefetch(spec))
	if err != nil {
		return fail("allocation with late-evens: %v", err)
	}
	prefetched := func(block int) (uint64, error) {
		evens.Bytes()[block*uvm.BlockSize+5*uvm.PageSize] = 1
		st, err := evens.Stats()
		return st.PrefetchedPages, err
	}
	if rep.Prefetched, err = prefetched(0); err != nil {
		return fail("late-evens: %v", err)
	}
	if err := syscall.Kill(s.ServerPID(), syscall.SIGKILL); err != nil {
		return fail("kill the server: %v", err)
	}
	for i, a := range allocs {
		b := a.Bytes()
		for p := 0; p < len(b); p += uvm.PageSize {
			if b[p] != byte(i+1) {
				return fail("allocation %d page %d reads %d after the takeover, want %d", i, p/uvm.PageSize, b[p], i+1)
			}
		}
	}
	if in, err = s.Info(); err != nil {
		return fail("info after the takeover: %v", err)
	}
	rep.AdoptedEviction, rep.Restarts = in.Eviction, in.Restart.Restarts
	if rep.AdoptedPrefetched, err = prefetched(1); err != nil {
		return fail("late-evens after the takeover: %v", err)
	}
	json.NewEncoder(os.Stdout).Encode(rep)
	return 0
}

func main() {
	if os.Getenv("LATEPOLICY_WITHOUT_MAIN") == "" {
		uvm.Main()
	}
	if len(os.Args) == 3 && os.Args[1] == "client" {
		os.Exit(client(os.Args[2]))
	}
	cli.Main()
}
