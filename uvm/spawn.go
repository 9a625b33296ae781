package uvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/internal/wire"
	"github.com/softuvm/softuvm/policy"
)

// The fault server runs in its own process: a Go handler cannot serve
// faults taken by goroutines of its own runtime (a goroutine blocked in a
// fault inside memmove cannot be preempted, so the garbage collector's
// stop-the-world waits for it forever). A client without a daemon starts a
// private server by re-executing its own binary with SOFTUVM_ROLE=server;
// this package's init function notices the role and runs the server
// instead of the program. The guard process is started the same way.
//
// A server role runs from here only if every policy its configuration
// names is registered already, and the program that started it did not
// say it registers more (awaitMainEnv). Go initializes packages in
// import-path order among those whose imports are done, so a policy
// registered by package main, or by a package whose path sorts after
// this one, is not there yet: then the role waits for Main, as a device
// does, and runs once every init function has.
func init() {
	for _, r := range policy.Registered() {
		initPolicies[r] = true
	}
	switch role := os.Getenv(config.RoleEnv); role {
	case "":
		return
	case "server":
		os.Unsetenv(config.RoleEnv)
		var refs []policy.Ref
		if text := os.Getenv(config.ServerConfigEnv); text != "" {
			refs = configPolicyRefs(text)
		} else { // started by libuvm: the configuration is the UVM_* variables
			refs = config.EnvPolicyRefs(os.Getenv)
		}
		startServerRole("fault server", runPrivateServer, refs)
	case "guard":
		// The guard builds no policy: the servers it starts are roles of
		// their own (adopt).
		os.Unsetenv(config.RoleEnv)
		runRole(server.RunGuard)
	case "adopt":
		// The guard passes the dead server's configuration along only
		// for this decision; the server takes it from the handover.
		os.Unsetenv(config.RoleEnv)
		text := os.Getenv(config.ServerConfigEnv)
		os.Unsetenv(config.ServerConfigEnv)
		if cfg, err := config.UnmarshalServerConfig(text); err == nil && cfg.Metrics != "" {
			// A daemon's metrics are served by what the program that
			// serves them (uvm serve) sets up in its own init functions,
			// which run after this one: wait for Main, as uvm's does.
			awaitMain(server.RunAdoptedServer, fmt.Sprintf("softuvm: the replacement fault server (pid %d) of a daemon serving metrics waits for uvm.Main(), which this program's main does not call first, so it cannot start and exits\n", os.Getpid()))
			return
		}
		startServerRole("replacement fault server", server.RunAdoptedServer, configPolicyRefs(text))
	case "serve":
		os.Unsetenv(config.RoleEnv)
		startServerRole("fault server", server.RunServeRole, configPolicyRefs(os.Getenv(config.ServerConfigEnv)))
	case "device":
		// Not here: the program's kernels are registered by init
		// functions of packages that import this one, which have not run
		// yet. Main runs the device once initialization is over.
		os.Unsetenv(config.RoleEnv)
		awaitMain(device.RunDevice, fmt.Sprintf("softuvm: this program launches kernels but its main does not call uvm.Main() first; the device process (pid %d) cannot start and exits\n", os.Getpid()))
	default:
		fmt.Fprintf(os.Stderr, "softuvm: unknown %s=%q\n", config.RoleEnv, role)
		os.Exit(2)
	}
}

var (
	// initPolicies are the policies registered when this package's init
	// function ran: in every process of one binary the same ones, since
	// initialization runs in the same order in each.
	initPolicies = map[policy.Ref]bool{}
	// pendingRole is the role this process runs once Main is called, nil
	// if none.
	pendingRole func() int
	// pendingWhyNot says why the process exits if Main is not called.
	pendingWhyNot string
	mainCalled    atomic.Bool
)

// mainDeadline is how long a process whose role waits for Main gives the
// program to call it before it gives up.
const mainDeadline = time.Second

// awaitMainEnv is set by Main in a program that registers policies after
// this package initialized, and every process re-executed from it
// inherits it: its server roles then wait for Main whatever their
// configuration names, since an allocation may name such a policy too
// (WithPrefetch), and a server that takes over rebuilds those. Its value
// identifies the binary, so that another program started with this
// environment does not wait for a Main it may never call.
const awaitMainEnv = "SOFTUVM_AWAIT_MAIN"

// startServerRole runs a server role now, or from Main if its
// configuration names policies (refs) that are not registered yet, or if
// the program registers some later and said so (awaitMainEnv).
func startServerRole(what string, main func() int, refs []policy.Ref) {
	late := unregisteredAtInit(refs)
	id := binaryID()
	told := id != "" && os.Getenv(awaitMainEnv) == id
	switch {
	case len(late) > 0:
		awaitMain(main, fmt.Sprintf("softuvm: the %s (pid %d) needs %s, which %s not registered when package uvm initialized, and this program's main does not call uvm.Main() first, so it cannot start and exits: call uvm.Main() first in main (package policy: \"Where a policy must be registered\")\n",
			what, os.Getpid(), joinRefs(late), map[bool]string{true: "is", false: "are"}[len(late) == 1]))
	case told:
		awaitMain(main, fmt.Sprintf("softuvm: the %s (pid %d) of a program that registers policies after package uvm initializes waits for uvm.Main(), which this program's main does not call first, so it cannot start and exits: call uvm.Main() first in main\n",
			what, os.Getpid()))
	default:
		runRole(main)
	}
}

// binaryID names this process's executable file by device and inode, ""
// if it cannot be read.
func binaryID() string {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/exe", &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// awaitMain makes main this process's role once Main is called; a program
// that does not call Main within mainDeadline is told why, on its
// standard error, and the process exits.
func awaitMain(main func() int, whyNot string) {
	pendingRole, pendingWhyNot = main, whyNot
	go func() {
		time.Sleep(mainDeadline)
		if !mainCalled.Load() {
			os.Stderr.WriteString(whyNot)
			os.Exit(3)
		}
	}()
}

// configPolicyRefs lists the policies a server configuration in JSON
// names. It decodes without validating: validation would fail on the
// very policies it asks about. A configuration that does not decode names
// none, and the role reports it.
func configPolicyRefs(text string) []policy.Ref {
	var cfg ServerConfig
	if text == "" || json.Unmarshal([]byte(text), &cfg) != nil {
		return nil
	}
	return cfg.PolicyRefs()
}

// unregisteredAtInit returns those of refs that were not registered when
// this package initialized.
func unregisteredAtInit(refs []policy.Ref) []policy.Ref {
	var late []policy.Ref
	for _, r := range refs {
		if !initPolicies[r] && !slices.Contains(late, r) {
			late = append(late, r)
		}
	}
	return late
}

func joinRefs(refs []policy.Ref) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = r.String()
	}
	return strings.Join(s, " and ")
}

// initPolicyNames lists the policies of a kind registered when this
// package initialized, sorted.
func initPolicyNames(kind string) string {
	var names []string
	for r := range initPolicies {
		if r.Kind == kind {
			names = append(names, r.Name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// Main must be the first thing in the main function of a program that
// launches kernels, or that chooses a policy of its own by name:
//
//	func main() {
//		uvm.Main()
//		...
//	}
//
// A device, a private fault server and the servers that take over from
// it are processes of their own, re-executions of the program's binary.
// A device needs the program's kernels (RegisterKernel), a server the
// policies its configuration and its allocations (WithPrefetch) name
// (policy.RegisterEviction and the rest), and the program's init
// functions register both. In such a process Main runs the role once
// every init function has run, and never returns; in the program itself
// it returns at once, having noted in the environment whether the
// program registers policies after this package initialized, so that
// the servers started from it wait for Main. A server of a program whose
// policies all register before this package initializes (the built-in
// ones, those of packages whose import paths sort before
// github.com/softuvm/softuvm/uvm) starts without waiting for Main, so
// that a program which never calls it keeps working. Test binaries call
// Main first in TestMain.
func Main() {
	mainCalled.Store(true)
	if id := binaryID(); len(unregisteredAtInit(policy.Registered())) > 0 && id != "" {
		os.Setenv(awaitMainEnv, id)
	}
	if pendingRole != nil {
		runRole(pendingRole)
	}
}

// lateForPrivateServer is the error for the first of refs that a private
// server, a re-execution of this program, would not know because the
// program registers it after this package initialized and main has not
// called Main; nil if it would know them all.
func lateForPrivateServer(kind error, refs []policy.Ref) error {
	if mainCalled.Load() {
		return nil
	}
	late := unregisteredAtInit(refs)
	if len(late) == 0 {
		return nil
	}
	r := late[0]
	return fmt.Errorf("%w: %s is registered after package uvm initialized, and main has not called uvm.Main(): the private server, a re-execution of this program, would not know it (there it knows %s policies %s); call uvm.Main() first in main",
		kind, r, r.Kind, initPolicyNames(r.Kind))
}

// policyHint adds to an error about a policy name that is not registered
// how a Go program makes one known.
func policyHint(err error) error {
	var u *policy.UnknownError
	if errors.As(err, &u) {
		return fmt.Errorf("%w (a policy of your own is known once an init function registers it; call uvm.Main() first in main, so that the private server, a re-execution of this program, registers it too)", err)
	}
	return err
}

// runRole runs a role's main function on a goroutine of its own and exits
// with its status. Package initialization runs on the main goroutine,
// locked to the main thread; a locked goroutine waiting on a socket leaves
// no thread polling the network when the others sit in system calls (the
// handler threads in read(2)), and every request then waited for the
// runtime's 10 ms background poll.
func runRole(main func() int) {
	// A server or guard outlives the terminal or pipe its standard error
	// was: a log line written there must not kill it.
	signal.Ignore(syscall.SIGPIPE)
	status := make(chan int)
	go func() { status <- main() }()
	os.Exit(<-status)
}

// privateServer is a server process started for one client.
type privateServer struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrivateServer(cfg ServerConfig, log *os.File) (*net.UnixConn, *privateServer, error) {
	if pendingRole != nil {
		// The program's main runs in a process started for a role of its
		// own, so it did not call Main first. Starting a server from here
		// would start another such process, and so on until the
		// deadline: say now what the deadline would say.
		os.Stderr.WriteString(pendingWhyNot)
		os.Exit(3)
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, policyHint(err)
	}
	// Run from this package's init function, the server would start
	// before a late policy exists there.
	if err := lateForPrivateServer(ErrInitialization, cfg.PolicyRefs()); err != nil {
		return nil, nil, err
	}
	local, remote, err := wire.SocketPair("softuvm-control")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	cmd, err := wire.Reexec("server", "softuvm-server", log, []*os.File{remote}, config.ServerConfigEnv+"="+cfg.Marshal())
	remote.Close()
	if err != nil {
		local.Close()
		return nil, nil, err
	}
	p := &privateServer{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return local, p, nil
}

// runPrivateServer is the main function of a private server: it serves the
// client on fd 3 until that client goes away, and answers monitors (`uvm
// stat`) on its own socket meanwhile.
//
// Go clients pass their configuration in SOFTUVM_SERVER_CONFIG. The C
// library (libuvm) starts the `uvm` binary in this role without it: the
// server then reads the same UVM_* variables `uvm serve` does.
func runPrivateServer() int {
	var cfg ServerConfig
	var err error
	text := os.Getenv(config.ServerConfigEnv)
	fromEnv := text == ""
	if fromEnv {
		cfg, err = config.ServerConfigFromEnv()
	} else {
		cfg, err = config.UnmarshalServerConfig(text)
	}
	os.Unsetenv(config.ServerConfigEnv)
	f := os.NewFile(3, "softuvm-control")
	c, cerr := net.FileConn(f)
	f.Close()
	if cerr != nil {
		fmt.Fprintf(os.Stderr, "softuvm server: control socket: %v\n", cerr)
		return 2
	}
	conn, ok := c.(*net.UnixConn)
	if !ok {
		fmt.Fprintf(os.Stderr, "softuvm server: fd 3 is not a unix socket\n")
		return 2
	}
	var srv *server.Server
	if err == nil {
		srv, err = server.NewServer(cfg)
	}
	var unknown *policy.UnknownError
	if errors.As(err, &unknown) && fromEnv {
		exe, _ := os.Executable()
		err = fmt.Errorf("%w (this server is %s, which the C library found through UVM_BIN, its install prefix or PATH: for a policy of your own, build a uvm binary whose main imports the policy's package and calls cli.Main, and set UVM_BIN to it)", err, exe)
	}
	if err != nil {
		// The client learns why from the error reply to its hello.
		buf := make([]byte, wire.MaxMessageSize)
		if b, fds, rerr := wire.ReadMessage(conn, buf); rerr == nil {
			wire.CloseFDs(fds)
			h, _, _ := wire.ParseHeader(b)
			wire.WriteMessage(conn, wire.EncodeError(h, err), nil)
		}
		return 1
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	path := config.PrivateServerSocketPath(os.Getpid())
	if l, err := server.ListenUnix(path); err == nil {
		srv.KeepListener(l, path)
		go srv.Serve(l)
		defer os.Remove(path)
	}
	srv.ServeConn(conn)
	srv.Close()
	return 0
}

func (p *privateServer) wait(timeout time.Duration) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
	}
}
