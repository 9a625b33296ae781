package soak

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
)

// The kills of `uvm bench soak`: what is killed, in which order, and how
// each recovery is seen.

// soakTarget is a kind of kill: what (server, device, guard) and whose
// (the daemon's, or a uvm run's).
type soakTarget struct{ kind, where string }

func (t soakTarget) String() string { return t.kind + " (" + t.where + ")" }

// killer kills, until stop, one process at a time: in rounds that kill
// each kind of target once, in random order, each kill after a random
// pause in --kill-every, and each after the last one's recovery.
func (s *soak) killer(stop <-chan struct{}) {
	if s.o.KillMax == 0 {
		return
	}
	var targets []soakTarget
	for _, kind := range []string{"server", "device", "guard"} {
		if !s.o.KillKinds[kind] {
			continue
		}
		if kind == "device" {
			if s.o.Clients["go"]+s.o.Clients["c"] > 0 {
				targets = append(targets, soakTarget{kind, "daemon"})
			}
			continue
		}
		if s.o.Clients["go"]+s.o.Clients["c"] > 0 {
			targets = append(targets, soakTarget{kind, "daemon"})
		}
		if len(s.runners) > 0 {
			targets = append(targets, soakTarget{kind, "run"})
		}
	}
	if len(targets) == 0 {
		return
	}
	rng := rand.New(rand.NewPCG(s.o.Seed, 0x4b111))
	for {
		rng.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
		for _, t := range targets {
			pause := s.o.KillMin + time.Duration(rng.Int64N(int64(s.o.KillMax-s.o.KillMin)+1))
			select {
			case <-stop:
				return
			case <-s.ended:
				return
			case <-time.After(pause):
			}
			if !s.killOne(t, rng, stop) {
				return
			}
		}
	}
}

// soakVictim is a process about to be killed, and how its recovery is
// seen.
type soakVictim struct {
	pid    int
	where  string
	client string
	// recovered is polled after the kill: what was seen, or "" while
	// nothing is.
	recovered func() string
	// gone, if not nil, is closed when what the process served ended
	// (a uvm run that finished): no recovery is then due.
	gone <-chan struct{}
}

// killOne kills one process of target's kind and waits for its
// recovery; false if the soak must end.
func (s *soak) killOne(t soakTarget, rng *rand.Rand, stop <-chan struct{}) bool {
	var v *soakVictim
	// Something to kill is there almost always; a uvm run may be between
	// programs, a client between device processes.
	for give := time.Now().Add(10 * time.Second); ; {
		var err error
		if v, err = s.victim(t, rng); err != nil {
			s.fail(soakFailure{Kind: "kill", Message: fmt.Sprintf("finding a %s to kill: %v", t, err)})
			return false
		}
		if v != nil {
			break
		}
		if time.Now().After(give) || s.isEnded() {
			s.mu.Lock()
			s.rep.KillsSkipped[t.String()]++
			s.mu.Unlock()
			return !s.isEnded()
		}
		select {
		case <-stop:
			return true
		case <-time.After(100 * time.Millisecond):
		}
	}
	if t.kind == "device" {
		s.mu.Lock()
		s.killedDP[v.pid] = true
		s.mu.Unlock()
	}
	killedAt := time.Now()
	if err := syscall.Kill(v.pid, syscall.SIGKILL); errors.Is(err, syscall.ESRCH) {
		// It ended between being found and the kill: another time.
		s.mu.Lock()
		s.rep.KillsSkipped[t.String()]++
		s.mu.Unlock()
		return true
	} else if err != nil {
		s.fail(soakFailure{Kind: "kill", Message: fmt.Sprintf("kill %s pid %d: %v", t, v.pid, err)})
		return false
	}
	k := soakKill{AtSeconds: killedAt.Sub(s.start).Seconds(), Kind: t.kind, Where: v.where, PID: v.pid, Client: v.client, Recovery: "pending"}
	// In the log at once: a wrong byte found meanwhile lists it.
	s.mu.Lock()
	at := len(s.rep.KillLog)
	s.rep.KillLog = append(s.rep.KillLog, k)
	s.mu.Unlock()
	poll := 20 * time.Millisecond
	if t.kind == "device" {
		poll = 100 * time.Millisecond
	}
	deadline := killedAt.Add(s.o.HangAfter)
	for {
		if what := v.recovered(); what != "" {
			k.Recovery, k.Survived = what, true
			break
		}
		if v.gone != nil {
			select {
			case <-v.gone:
				k.Recovery, k.Survived = "what it served ended first", true
			default:
			}
			if k.Survived {
				break
			}
		}
		if s.isEnded() {
			k.Recovery = "the soak ended first"
			break
		}
		if time.Now().After(deadline) {
			k.Recovery = "none"
			s.fail(soakFailure{Kind: "kill", Client: v.client, Message: fmt.Sprintf("no recovery within %v of killing the %s (pid %d); the daemon's log ends:\n%s",
				s.o.HangAfter, t, v.pid, lastBytesOf(readFile(s.daemonLg), 4096))})
			break
		}
		time.Sleep(poll)
	}
	k.RecoveredMS = float64(time.Since(killedAt).Microseconds()) / 1e3
	s.mu.Lock()
	c := s.rep.Kills[t.kind]
	if c == nil {
		c = &soakKills{}
		s.rep.Kills[t.kind] = c
	}
	c.Kills++
	if t.where == "daemon" {
		c.Daemon++
	} else {
		c.Run++
	}
	if k.Survived {
		c.Survived++
		c.recoveries = append(c.recoveries, k.RecoveredMS)
	}
	s.rep.KillLog[at] = k
	s.mu.Unlock()
	return k.Survived || k.Recovery == "the soak ended first"
}

func (k soakKill) String() string {
	s := fmt.Sprintf("%.3fs: %s %s pid %d", k.AtSeconds, k.Where, k.Kind, k.PID)
	if k.Client != "" {
		s += " of " + k.Client
	}
	return s + fmt.Sprintf(": %s after %.0f ms", k.Recovery, k.RecoveredMS)
}

var (
	tookOverLine = regexp.MustCompile(`took over from a server that ended`)
	newGuardLine = regexp.MustCompile(`the guard \(pid \d+\) died; a new one \(pid \d+\) holds every session again`)
)

// victim picks a process of target's kind, nil if there is none now.
func (s *soak) victim(t soakTarget, rng *rand.Rand) (*soakVictim, error) {
	if t.where == "run" {
		return s.runVictim(t, rng)
	}
	in, err := s.daemonInfo(s.o.HangAfter)
	if err != nil {
		return nil, fmt.Errorf("the daemon: %w", err)
	}
	switch t.kind {
	case "server":
		if !alive(in.PID) || (argv0(in.PID) != "softuvm-server" && in.PID != s.daemon.Process.Pid) {
			return nil, nil
		}
		s.checkServerCounters("the daemon", in)
		before := len(tookOverLine.FindAllStringIndex(readFile(s.daemonLg), -1))
		return &soakVictim{pid: in.PID, where: "daemon", recovered: func() string {
			if len(tookOverLine.FindAllStringIndex(readFile(s.daemonLg), -1)) <= before {
				return ""
			}
			return "a new server took over (logged)"
		}}, nil
	case "guard":
		if in.Restart.GuardPID == 0 || !alive(in.Restart.GuardPID) || argv0(in.Restart.GuardPID) != "softuvm-guard" {
			return nil, nil
		}
		before := len(newGuardLine.FindAllStringIndex(readFile(s.daemonLg), -1))
		return &soakVictim{pid: in.Restart.GuardPID, where: "daemon", recovered: func() string {
			if len(newGuardLine.FindAllStringIndex(readFile(s.daemonLg), -1)) <= before {
				return ""
			}
			return "a new guard holds every session (logged)"
		}}, nil
	}
	// A device process of one of the soak's clients: a child of the
	// client, known to the daemon.
	s.mu.Lock()
	clients := map[int]*soakProc{}
	for _, p := range s.procs {
		if !p.stopAsked {
			clients[p.cmd.Process.Pid] = p
		}
	}
	s.mu.Unlock()
	type dev struct {
		p   *soakProc
		d   int
		pid int
	}
	var devs []dev
	for _, si := range in.Sessions {
		p := clients[si.PID]
		if p == nil {
			continue
		}
		for _, pf := range si.Devices {
			if pf.Processor >= 0 && pf.PID > 0 {
				if _, pp, ok := procStateParent(pf.PID); ok && pp == si.PID && alive(pf.PID) {
					devs = append(devs, dev{p, int(pf.Processor), pf.PID})
				}
			}
		}
	}
	if len(devs) == 0 {
		return nil, nil
	}
	d := devs[rng.IntN(len(devs))]
	clientPID := d.p.cmd.Process.Pid
	return &soakVictim{pid: d.pid, where: "daemon", client: d.p.name, gone: d.p.exited, recovered: func() string {
		// A new process for the device, started at the client's next
		// launch there.
		in, err := s.daemonInfo(5 * time.Second)
		if err != nil {
			return ""
		}
		for _, si := range in.Sessions {
			if si.PID != clientPID {
				continue
			}
			for _, pf := range si.Devices {
				if int(pf.Processor) == d.d && pf.PID > 0 && pf.PID != d.pid {
					return fmt.Sprintf("device %d has a new process (pid %d)", d.d, pf.PID)
				}
			}
		}
		return ""
	}}, nil
}

// runVictim picks the server or the guard of a uvm run in progress.
func (s *soak) runVictim(t soakTarget, rng *rand.Rand) (*soakVictim, error) {
	var runs []*soakActiveRun
	var names []string
	for _, r := range s.runners {
		r.mu.Lock()
		if r.active != nil {
			runs, names = append(runs, r.active), append(names, r.name)
		}
		r.mu.Unlock()
	}
	if len(runs) == 0 {
		return nil, nil
	}
	i := rng.IntN(len(runs))
	run := runs[i]
	in, err := s.monitorInfo(config.PrivateServerSocketPath(run.pid), 2*time.Second)
	if err != nil {
		return nil, nil // starting, or ending: another moment
	}
	pid, line, what := in.PID, tookOverLine, "a new server took over (logged)"
	if t.kind == "guard" {
		pid, line, what = in.Restart.GuardPID, newGuardLine, "a new guard holds every session (logged)"
		if pid == 0 || argv0(pid) != "softuvm-guard" {
			return nil, nil
		}
	} else if argv0(pid) != "softuvm-server" {
		return nil, nil
	}
	if !alive(pid) {
		return nil, nil
	}
	if t.kind == "server" {
		s.checkServerCounters(names[i]+"'s uvm run", in)
	}
	before := len(line.FindAllStringIndex(run.stderr.String(), -1))
	return &soakVictim{pid: pid, where: names[i] + ": " + run.program, gone: run.done, recovered: func() string {
		if len(line.FindAllStringIndex(run.stderr.String(), -1)) <= before {
			return ""
		}
		return what
	}}, nil
}
