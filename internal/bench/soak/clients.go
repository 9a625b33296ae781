package soak

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The Go and C clients of `uvm bench soak` as the soak sees them: their
// processes, the lines they print (soak_client.go), their progress and
// hangs, and the state of a hung process's threads.

// soakProc is a Go or C client process.
type soakProc struct {
	name, kind string
	cmd        *exec.Cmd
	stdin      io.WriteCloser
	logPath    string
	rep        *soakClientReport
	exited     chan struct{} // closed once it exited and its output was read
	// Guarded by soak.mu.
	lastProgress time.Time
	stopAsked    bool
	reported     bool // a failure of its own was reported (a wrong byte, an error, a hang)
}

func (s *soak) startClient(kind, name, cClient string, seed uint64) error {
	var cmd *exec.Cmd
	if kind == "go" {
		cmd = exec.Command(s.o.UVM, ClientArg, "--name", name, "--socket", s.sock, "--seed", strconv.FormatUint(seed, 10),
			"--max-alloc", strconv.FormatInt(s.o.MaxAlloc, 10), "--slots", strconv.Itoa(s.o.Slots), "--epoch", strconv.FormatInt(s.start.UnixNano(), 10), "--ops", strings.Join(s.o.Ops, ","))
	} else {
		cmd = exec.Command(cClient, name, strconv.FormatUint(seed, 10), strconv.FormatInt(s.o.MaxAlloc, 10), strconv.Itoa(s.o.Slots), strconv.FormatInt(s.start.UnixNano(), 10), strings.Join(s.o.Ops, ","))
	}
	cmd.Env = s.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &soakProc{name: name, kind: kind, cmd: cmd, logPath: filepath.Join(s.dir, name+".log"), exited: make(chan struct{}),
		rep: &soakClientReport{Name: name, Kind: kind}, lastProgress: time.Now()}
	// A file, not a pipe: its device processes inherit it.
	logf, err := os.Create(p.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start client %s: %w", name, err)
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.rep.Clients = append(s.rep.Clients, p.rep)
	s.mu.Unlock()
	go s.readClient(p, stdout)
	return nil
}

var killedByUs = regexp.MustCompile(`\(pid (\d+)\) was killed by signal 9`)

// readClient reads a client's lines until it exits.
func (s *soak) readClient(p *soakProc, stdout io.Reader) {
	defer close(p.exited)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var done *soakClientDone
	for sc.Scan() {
		word, rest, _ := strings.Cut(sc.Text(), " ")
		switch word {
		case "progress":
			var ops, checked uint64
			if _, err := fmt.Sscan(rest, &ops, &checked); err == nil {
				s.mu.Lock()
				p.rep.Ops, p.rep.BytesChecked, p.lastProgress = ops, checked, time.Now()
				s.mu.Unlock()
			}
		case "lost":
			// A launch whose device process died: one the soak killed.
			if m := killedByUs.FindStringSubmatch(rest); m != nil {
				pid, _ := strconv.Atoi(m[1])
				s.mu.Lock()
				ours := s.killedDP[pid]
				s.mu.Unlock()
				if !ours {
					s.fail(soakFailure{Kind: "crash", Client: p.name, Message: fmt.Sprintf("a device process the soak did not kill was killed: %s", rest)})
				}
			}
		case "wrong":
			w := &soakWrong{}
			if err := json.Unmarshal([]byte(rest), w); err != nil {
				s.fail(soakFailure{Kind: "wrong-byte", Client: p.name, Message: "a wrong byte, reported unreadably: " + rest})
				break
			}
			w.Client = p.name
			s.mu.Lock()
			p.reported = true
			var kills []soakKill
			for _, k := range s.rep.KillLog {
				if k.AtSeconds >= w.SinceSeconds && k.AtSeconds <= w.AtSeconds {
					kills = append(kills, k)
				}
			}
			s.mu.Unlock()
			s.fail(soakFailure{Kind: "wrong-byte", Client: p.name, Message: w.Error(), Wrong: w, Kills: kills})
		case "error":
			s.mu.Lock()
			p.reported = true
			s.mu.Unlock()
			s.fail(soakFailure{Kind: "error", Client: p.name, Message: rest})
		case "done":
			done = &soakClientDone{}
			if err := json.Unmarshal([]byte(rest), done); err != nil {
				done = nil
			}
		}
	}
	err := p.cmd.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if done != nil {
		p.rep.OpsByKind, p.rep.BytesChecked, p.rep.LaunchesLost, p.rep.ServerRestarts = done.Ops, done.BytesChecked, done.LaunchesLost, done.ServerRestarts
		p.rep.Ops = 0
		for _, n := range done.Ops {
			p.rep.Ops += n
		}
	}
	if p.reported {
		return
	}
	if err != nil || done == nil || !p.stopAsked {
		how := "exited"
		if err != nil {
			how = err.Error()
		}
		msg := fmt.Sprintf("client %s (pid %d) %s", p.name, p.cmd.Process.Pid, how)
		if !p.stopAsked {
			msg += " before the soak ended"
		} else if done == nil {
			msg += " without its last line"
		}
		go s.fail(soakFailure{Kind: "crash", Client: p.name, Message: msg + "; its log ends: " + lastBytesOf(readFile(p.logPath), 4096)})
		return
	}
	p.rep.Finished = true
}

// checkHangs reports a client that made no progress for --hang-after.
func (s *soak) checkHangs() {
	s.mu.Lock()
	var hung []*soakProc
	for _, p := range s.procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		if !p.reported && time.Since(p.lastProgress) > s.o.HangAfter {
			p.reported = true
			hung = append(hung, p)
		}
	}
	s.mu.Unlock()
	for _, p := range hung {
		s.hang(p.name, p.cmd.Process.Pid, p.kind == "go", fmt.Sprintf("client %s made no progress for %v", p.name, s.o.HangAfter), p.logPath, s.sock, s.daemonLg)
	}
}

// hang reports a hung process with the state of each thread of it and
// of its descendants, and of the server serving it, whose socket is sock
// (the daemon's, or a uvm run's monitor socket) and whose log is
// serverLog; then kills it (a Go program first dumps its goroutines into
// its log, on SIGQUIT).
func (s *soak) hang(client string, pid int, goDump bool, what, logPath, sock, serverLog string) {
	state := processStates(pid)
	below := descendants(pid)
	server := s.serverState(sock, serverLog) // before the kill, which may end it
	if goDump {
		syscall.Kill(pid, syscall.SIGQUIT)
		time.Sleep(2 * time.Second)
	}
	for _, p := range append([]int{pid}, below...) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	msg := what + "; its threads and its children's:\n" + state
	if logPath != "" {
		msg += "\nits log ends:\n" + lastBytesOf(readFile(logPath), 8192)
	}
	s.fail(soakFailure{Kind: "hang", Client: client, Message: msg + server + "\nthe server's log ends:\n" + lastBytesOf(readFile(serverLog), 4096)})
}

// serverState describes the server listening at sock: its sessions, its
// threads, and what waits on its userfaultfds (faults not read yet, and
// faults read and not answered: one of those is a fault the server
// lost). Then it sends it SIGQUIT, so that it writes its goroutines to
// serverLog as it dies (its guard starts another).
func (s *soak) serverState(sock, serverLog string) string {
	in, err := s.monitorInfo(sock, 5*time.Second)
	if err != nil || !alive(in.PID) {
		return fmt.Sprintf("\nno server answered at %s (%v)", sock, err)
	}
	var sessions []string
	for _, si := range in.Sessions {
		d := ""
		for _, pf := range si.Devices {
			d += fmt.Sprintf(" %v:%d", pf.Processor, pf.PID)
		}
		sessions = append(sessions, fmt.Sprintf("%s %d (devices%s)", si.Role, si.PID, d))
	}
	msg := fmt.Sprintf("\nits server (pid %d) has the sessions: %s; its threads: %s; its userfaultfds: %s; the kernel stacks of its threads not waiting for work:\n%s",
		in.PID, strings.Join(sessions, ", "), processStates(in.PID), userfaultfds(in.PID), busyStacks(in.PID))
	if sock == s.sock {
		s.quit.Store(true)
	}
	syscall.Kill(in.PID, syscall.SIGQUIT)
	return msg + fmt.Sprintf("(it was sent SIGQUIT: its goroutines are in %s)", serverLog)
}

// busyStacks gives the kernel stack (/proc/PID/task/TID/stack, root
// only) of each thread of pid that is not waiting for work (in a futex,
// epoll, a read of a userfaultfd, a sleep).
func busyStacks(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	var b strings.Builder
	for _, task := range tasks {
		switch strings.TrimSpace(readFile(task + "/wchan")) {
		case "futex_do_wait", "do_epoll_wait", "userfaultfd_read_iter", "hrtimer_nanosleep", "do_wait":
			continue
		}
		fmt.Fprintf(&b, "thread %s:\n%s", filepath.Base(task), readFile(task+"/stack"))
	}
	return b.String()
}

// userfaultfds says, for each userfaultfd process pid holds, how many
// faults wait unread and how many were read and not answered (the
// kernel's fdinfo: pending, and total less pending).
func userfaultfds(pid int) string {
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	var out []string
	for _, fd := range fds {
		if l, _ := os.Readlink(fd); l != "anon_inode:[userfaultfd]" {
			continue
		}
		var pending, total int
		for _, line := range strings.Split(readFile(strings.Replace(fd, "/fd/", "/fdinfo/", 1)), "\n") {
			fmt.Sscanf(line, "pending: %d", &pending)
			fmt.Sscanf(line, "total: %d", &total)
		}
		out = append(out, fmt.Sprintf("fd %s: %d unread, %d read and not answered", filepath.Base(fd), pending, total-pending))
	}
	return strings.Join(out, "; ")
}

// processStates describes each thread of pid and its descendants: its
// state and where in the kernel it waits (wchan).
func processStates(pid int) string {
	var b strings.Builder
	for _, p := range append([]int{pid}, descendants(pid)...) {
		argv0, _, _ := strings.Cut(readFile(fmt.Sprintf("/proc/%d/cmdline", p)), "\x00")
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", p))
		fmt.Fprintf(&b, "pid %d (%s):", p, argv0)
		for _, t := range tasks {
			st := readFile(t + "/stat")
			state := "?"
			if i := strings.LastIndexByte(st, ')'); i >= 0 && len(st) > i+2 {
				state = st[i+2 : i+3]
			}
			fmt.Fprintf(&b, " %s:%s:%s", filepath.Base(t), state, strings.TrimSpace(readFile(t+"/wchan")))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// descendants lists the processes below pid.
func descendants(pid int) []int {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, pp, ok := procStateParent(p); ok {
			parent[p] = pp
		}
	}
	var out []int
	frontier := []int{pid}
	for len(frontier) > 0 {
		var next []int
		for p, pp := range parent {
			if slices.Contains(frontier, pp) {
				next = append(next, p)
			}
		}
		sort.Ints(next)
		out = append(out, next...)
		frontier = next
	}
	return out
}

// procStateParent reads a process's state and parent.
func procStateParent(pid int) (string, int, bool) {
	st := readFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(st, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(st[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return f[0], pp, err == nil
}

// alive says whether pid runs (and is not a zombie).
func alive(pid int) bool {
	st, _, ok := procStateParent(pid)
	return ok && st != "Z"
}

// argv0 is a process's argv[0].
func argv0(pid int) string {
	a, _, _ := strings.Cut(readFile(fmt.Sprintf("/proc/%d/cmdline", pid)), "\x00")
	return a
}

// stopClients closes every Go and C client's standard input and waits
// for each to check everything and exit, for --hang-after at most.
func (s *soak) stopClients() {
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	for _, p := range procs {
		p.stopAsked = true
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.stdin.Close()
	}
	deadline := time.After(s.o.HangAfter)
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline:
			s.mu.Lock()
			reported := p.reported
			p.reported = true
			s.mu.Unlock()
			if !reported {
				s.hang(p.name, p.cmd.Process.Pid, p.kind == "go", fmt.Sprintf("client %s did not finish within %v of being told to stop", p.name, s.o.HangAfter), p.logPath, s.sock, s.daemonLg)
			}
			<-p.exited
		}
	}
}
