package uvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"
)

// The fault server runs in its own process: a Go handler cannot serve
// faults taken by goroutines of its own runtime (a goroutine blocked in a
// fault inside memmove cannot be preempted, so the garbage collector's
// stop-the-world waits for it forever). A client without a daemon starts a
// private server by re-executing its own binary with SOFTUVM_ROLE=server;
// this package's init function notices the role and runs the server
// instead of the program. The guard process is started the same way.
func init() {
	switch role := os.Getenv(roleEnv); role {
	case "":
		return
	case "server":
		os.Unsetenv(roleEnv)
		runRole(runPrivateServer)
	case "guard":
		os.Unsetenv(roleEnv)
		runRole(runGuard)
	case "adopt":
		os.Unsetenv(roleEnv)
		runRole(runAdoptedServer)
	case "serve":
		os.Unsetenv(roleEnv)
		runRole(runServeRole)
	case "device":
		// Not here: the program's kernels are registered by init
		// functions of packages that import this one, which have not run
		// yet. Main runs the device once initialization is over.
		os.Unsetenv(roleEnv)
		deviceRole = true
		go func() {
			time.Sleep(deviceMainDeadline)
			if !deviceMainCalled.Load() {
				fmt.Fprintf(os.Stderr, "softuvm: this program launches kernels but its main does not call uvm.Main() first; the device process (pid %d) cannot start and exits\n", os.Getpid())
				os.Exit(3)
			}
		}()
	default:
		fmt.Fprintf(os.Stderr, "softuvm: unknown %s=%q\n", roleEnv, role)
		os.Exit(2)
	}
}

var (
	deviceRole       bool
	deviceMainCalled atomic.Bool
)

// deviceMainDeadline is how long a device process waits for the program to
// call Main before it gives up.
const deviceMainDeadline = time.Second

// Main must be the first thing in the main function of a program that
// launches kernels:
//
//	func main() {
//		uvm.Main()
//		...
//	}
//
// A device is a process of its own, a re-execution of the program's binary,
// and it needs the program's kernels, which the program's init functions
// register (RegisterKernel). In that process Main runs the device and never
// returns; in the program itself it returns at once. Test binaries call it
// first in TestMain.
func Main() {
	deviceMainCalled.Store(true)
	if deviceRole {
		runRole(runDevice)
	}
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

func (p *privateServer) wait(timeout time.Duration) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// socketPair returns two connected SOCK_SEQPACKET sockets.
func socketPair(name string) (local *net.UnixConn, remote *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	lf := os.NewFile(uintptr(fds[0]), name)
	defer lf.Close()
	c, err := net.FileConn(lf)
	if err != nil {
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), name), nil
}

// reexec starts this program's binary in a role, with extra as fds 3, 4...,
// writing to log (nil: this process's standard error).
func reexec(role, argv0 string, log *os.File, extra []*os.File, env ...string) (*exec.Cmd, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{argv0}
	cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	cmd.ExtraFiles = extra
	if log == nil {
		log = os.Stderr
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C meant for the program must not
	// kill the server under it (the server exits when its client does).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s process (%s): %v", ErrInitialization, role, argv0, err)
	}
	return cmd, nil
}

func startPrivateServer(cfg ServerConfig, log *os.File) (*net.UnixConn, *privateServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	local, remote, err := socketPair("softuvm-control")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInitialization, err)
	}
	cmd, err := reexec("server", "softuvm-server", log, []*os.File{remote}, serverConfigEnv+"="+cfg.marshal())
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
	if text := os.Getenv(serverConfigEnv); text != "" {
		cfg, err = unmarshalServerConfig(text)
	} else {
		cfg, err = ServerConfigFromEnv()
	}
	os.Unsetenv(serverConfigEnv)
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
	var srv *Server
	if err == nil {
		srv, err = NewServer(cfg)
	}
	if err != nil {
		// The client learns why from the error reply to its hello.
		buf := make([]byte, maxMessageSize)
		if b, fds, rerr := readMessage(conn, buf); rerr == nil {
			closeFDs(fds)
			h, _, _ := parseHeader(b)
			writeMessage(conn, encodeError(h, err), nil)
		}
		return 1
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
	path := PrivateServerSocketPath(os.Getpid())
	if l, err := listenUnix(path); err == nil {
		srv.keepListener(l, path)
		go srv.Serve(l)
		defer os.Remove(path)
	}
	srv.ServeConn(conn)
	srv.Close()
	return 0
}

// ListenAndServe runs a daemon on the socket at path until a SIGINT or
// SIGTERM: `uvm serve`.
func ListenAndServe(cfg ServerConfig, path string, ready func(*Server)) error {
	srv, err := NewServer(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	srv.setMode(modeDaemon)
	srv.keepListener(l, path)
	srv.handleReplaceSignal([]string{path})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			srv.Close()
		case <-srv.Done():
		}
	}()
	if ready != nil {
		ready(srv)
	}
	return srv.Serve(l)
}

// listenUnix listens on path with owner-only permissions, in a directory
// only the owner can enter. A socket file left by a dead server is
// replaced; one a live server answers on is an error.
func listenUnix(path string) (*net.UnixListener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: socket directory %s: %v", ErrInitialization, dir, err)
	}
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 && dir != os.TempDir() {
		os.Chmod(dir, 0o700)
	}
	if _, err := os.Lstat(path); err == nil {
		if c, err := net.Dial("unixpacket", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: a fault server already listens on %s", ErrInitialization, path)
		}
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("%w: listen on %s: %v", ErrInitialization, path, err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.Close()
		return nil, fmt.Errorf("%w: chmod %s: %v", ErrInitialization, path, err)
	}
	return l, nil
}

// dupCloexec returns a duplicate of f's descriptor that this process owns
// (f may be closed), close-on-exec.
func dupCloexec(f *os.File) (int, error) {
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return -1, fmt.Errorf("%w: dup: %v", ErrInternal, err)
	}
	syscall.CloseOnExec(fd)
	return fd, nil
}
