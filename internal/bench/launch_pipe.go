package bench

import (
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"

	"github.com/softuvm/softuvm/devmem"
)

// PingPongCommand is the first argument that makes this binary the pipe
// round trip's child (PingPong) for `uvm bench launch`.
const PingPongCommand = "__pingpong"

// pingPongChild is a child process, pinned to a CPU, that echoes bytes
// over two pipes (pingPong), for the pipe round trip.
type pingPongChild struct {
	cmd       *exec.Cmd
	toChild   io.WriteCloser
	fromChild io.Reader
}

// startPingPong starts this binary as the pipe's child, pinned to cpu.
func startPingPong(cpu int) (*pingPongChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, PingPongCommand, strconv.Itoa(cpu))
	toChild, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	fromChild, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &pingPongChild{cmd: cmd, toChild: toChild, fromChild: fromChild}, nil
}

// roundTrips times timed one-byte round trips after warm untimed ones.
func (p *pingPongChild) roundTrips(warm, timed int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, timed)
	b := []byte{1}
	for i := 0; i < warm+timed; i++ {
		t0 := time.Now()
		if _, err := p.toChild.Write(b); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(p.fromChild, b); err != nil {
			return nil, err
		}
		if i >= warm {
			lat = append(lat, time.Since(t0))
		}
	}
	return lat, nil
}

func (p *pingPongChild) stop() {
	p.toChild.Close()
	p.cmd.Wait()
}

// PingPong is the child of the pipe round trip, which a binary linking
// this package runs when its arguments are PingPongCommand and a CPU
// (package cli's Main does): pinned to that CPU, it echoes bytes from
// standard input to standard output until standard input closes, and
// returns the exit status.
func PingPong(cpuArg string) int {
	runtime.LockOSThread()
	if cpu, err := strconv.Atoi(cpuArg); err == nil {
		devmem.PinCurrentThread(cpu) // best effort: unpinned, it still echoes
	}
	b := make([]byte, 1)
	for {
		if _, err := os.Stdin.Read(b); err != nil {
			return 0
		}
		if _, err := os.Stdout.Write(b); err != nil {
			return 1
		}
	}
}
