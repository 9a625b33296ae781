package wire

// Device copy operations. The client copies device memory itself, through
// its mapping of the device's file; only the bookkeeping is the server's.
// Operations 1 to 4 were copies through a staging window, before the
// copy engine.
const (
	// deviceWritten says the client wrote device memory at dst through
	// its mapping of the device's file (msgDeviceFile): the server records
	// the pages as populated.
	DeviceWritten = 5
)

type DeviceCopyRequest struct {
	Op       uint8
	Dst, src uint64
	Length   uint64
	value    uint8
}
