package wire

import (
	"errors"

	"github.com/softuvm/softuvm/internal/core"
)

// errorCode is the wire form of an error class.
type errorCode uint32

const (
	CodeOK errorCode = iota
	codeInvalidValue
	codeMemoryAllocation
	codeInvalidDevice
	codeInitialization
	codeNotSupported
	codeInternal
	codeLaunchFailure
)

var codeErrors = [...]error{
	codeInvalidValue:     core.ErrInvalidValue,
	codeMemoryAllocation: core.ErrMemoryAllocation,
	codeInvalidDevice:    core.ErrInvalidDevice,
	codeInitialization:   core.ErrInitialization,
	codeNotSupported:     core.ErrNotSupported,
	codeInternal:         core.ErrInternal,
	codeLaunchFailure:    core.ErrLaunchFailure,
}

func codeOf(err error) errorCode {
	for code, class := range codeErrors {
		if class != nil && errors.Is(err, class) {
			return errorCode(code)
		}
	}
	return codeInternal
}

// remoteError is an error the server reported: its class and message.
type remoteError struct {
	class error
	msg   string
}

func errorFromWire(code errorCode, msg string) error {
	class := core.ErrInternal
	if int(code) < len(codeErrors) && codeErrors[code] != nil {
		class = codeErrors[code]
	}
	return &remoteError{class: class, msg: msg}
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() error { return e.class }
