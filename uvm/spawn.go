package uvm

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/device"
	"github.com/softuvm/softuvm/internal/server"
	"github.com/softuvm/softuvm/internal/wire"
)

// The fault server runs in its own process: a Go handler cannot serve
// faults taken by goroutines of its own runtime (a goroutine blocked in a
// fault inside memmove cannot be preempted, so the garbage collector's
// stop-the-world waits for it forever). A client without a daemon starts a
// private server by re-executing its own binary with SOFTUVM_ROLE=server;
// this package's init function notices the role and runs the server
// instead of the program. The guard process is started the same way.
func init() {
	switch role := os.Getenv(config.RoleEnv); role {
	case "":
		return
	case "server":
		os.Unsetenv(config.RoleEnv)
		runRole(runPrivateServer)
	case "guard":
		os.Unsetenv(config.RoleEnv)
		runRole(server.RunGuard)
	case "adopt":
		os.Unsetenv(config.RoleEnv)
		runRole(server.RunAdoptedServer)
	case "serve":
		os.Unsetenv(config.RoleEnv)
		runRole(server.RunServeRole)
	case "device":
		// Not here: the program's kernels are registered by init
		// functions of packages that import this one, which have not run
		// yet. Main runs the device once initialization is over.
		os.Unsetenv(config.RoleEnv)
		deviceRole = true
		go func() {
			time.Sleep(deviceMainDeadline)
			if !deviceMainCalled.Load() {
				fmt.Fprintf(os.Stderr, "softuvm: this program launches kernels but its main does not call uvm.Main() first; the device process (pid %d) cannot start and exits\n", os.Getpid())
				os.Exit(3)
			}
		}()
	default:
		fmt.Fprintf(os.Stderr, "softuvm: unknown %s=%q\n", config.RoleEnv, role)
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
		runRole(device.RunDevice)
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

func startPrivateServer(cfg ServerConfig, log *os.File) (*net.UnixConn, *privateServer, error) {
	if err := cfg.Validate(); err != nil {
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
	if text := os.Getenv(config.ServerConfigEnv); text != "" {
		cfg, err = config.UnmarshalServerConfig(text)
	} else {
		cfg, err = ServerConfigFromEnv()
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
