package config

import (
	"time"
)

// Restarts.
const (
	// defaultRestartAttempts is how many new servers in a row the guard
	// starts, each failing before it has taken over, before it gives up.
	DefaultRestartAttempts = 5
	// restartBackoff is the wait before the second attempt, doubled for
	// each further one.
	RestartBackoff = 50 * time.Millisecond
	// adoptTimeout bounds a new server's takeover.
	AdoptTimeout = 30 * time.Second
)
