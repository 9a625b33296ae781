package wire

import (
	"fmt"

	"github.com/softuvm/softuvm/internal/core"
)

// LaunchGridRequest runs kernel Name as a grid of Grid blocks of Block
// threads each (a client to a device process, on a stream's socket, with
// no reply, as a launch): CUDA's launch, whose threads read their block's
// and their own index. SharedBytes is each block's dynamic shared memory;
// StackBytes the stack of each of a block's threads but the first (0: the
// default); Flags GridCooperative for a cooperative launch, whose blocks
// are all resident at once. Params are copied as a launch's; Cpu is the
// launching thread's CPU, as a launch's.
type LaunchGridRequest struct {
	Stream      uint32
	Grid, Block core.Dim3
	SharedBytes uint32
	StackBytes  uint32
	Flags       uint32
	Name        string
	Params      []byte
	Cpu         int32
}

func init() {
	requestDecoders[MsgLaunchGrid] = func(r *WireReader) any {
		lg := LaunchGridRequest{Stream: r.u32("stream"), Grid: r.dim3("grid"), Block: r.dim3("block"),
			SharedBytes: r.u32("shared memory"), StackBytes: r.u32("stack size"), Flags: r.u32("flags"),
			Name: r.Str("kernel name"), Params: r.bytes("parameters", core.MaxKernelParams), Cpu: r.i32("cpu")}
		if r.err == nil {
			r.err = lg.Check()
		}
		return lg
	}
}

// Check validates the shape, the stack and the flags of a grid launch.
func (lg *LaunchGridRequest) Check() error {
	if err := core.CheckGrid(lg.Grid, lg.Block, uint64(lg.SharedBytes)); err != nil {
		return fmt.Errorf("launch of %q: %w", lg.Name, err)
	}
	if lg.StackBytes != 0 && (lg.StackBytes < core.MinStackSize || lg.StackBytes > core.MaxStackSize) {
		return fmt.Errorf("%w: launch of %q with thread stacks of %d bytes: want 0 (the default, %d) or %d to %d", core.ErrInvalidValue, lg.Name, lg.StackBytes, core.DefaultStackSize, core.MinStackSize, core.MaxStackSize)
	}
	if lg.Flags&^core.GridCooperative != 0 {
		return fmt.Errorf("%w: launch of %q with flags %#x: want 0 or %#x (cooperative)", core.ErrInvalidValue, lg.Name, lg.Flags, core.GridCooperative)
	}
	return nil
}

func (r *WireReader) dim3(what string) core.Dim3 {
	return core.Dim3{X: r.u32(what + " x"), Y: r.u32(what + " y"), Z: r.u32(what + " z")}
}

func (w *wireWriter) dim3(d core.Dim3) {
	w.u32(d.X)
	w.u32(d.Y)
	w.u32(d.Z)
}

func EncodeLaunchGrid(seq uint32, lg LaunchGridRequest) []byte {
	w := NewMessage(Header{Typ: MsgLaunchGrid, Seq: seq})
	w.u32(lg.Stream)
	w.dim3(lg.Grid)
	w.dim3(lg.Block)
	w.u32(lg.SharedBytes)
	w.u32(lg.StackBytes)
	w.u32(lg.Flags)
	w.str(lg.Name)
	w.bytes(lg.Params)
	w.i32(lg.Cpu)
	return w.B
}
