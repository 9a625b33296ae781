package wire

import (
	"errors"
)

var ErrPeerGone = errors.New("peer closed the connection")
