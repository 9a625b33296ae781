package uvm

import (
	"github.com/softuvm/softuvm/internal/config"
	"github.com/softuvm/softuvm/internal/core"
	"github.com/softuvm/softuvm/policy"
)

// The names below are the program's vocabulary. Their definitions live in
// the packages the server and the devices share with this one; these
// aliases make them the same types, so a value crosses no conversion.

// Device names a processor: a device index from 0, or CPU for the host.
type Device = core.Device

const (
	// CPU is the host processor, CUDA's cudaCpuDeviceId (CU_DEVICE_CPU).
	CPU = core.CPU
	// InvalidDevice is returned where no single device answers a query,
	// CUDA's CU_DEVICE_INVALID.
	InvalidDevice = core.InvalidDevice
)

// PageSize is the unit faults and migrations move; BlockSize is the
// residency block (2 MiB) whose lock serializes every decision about its
// pages.
const (
	PageSize  = core.PageSize
	BlockSize = core.BlockSize
)

// DeviceInfo describes one device as the server configured it.
type DeviceInfo = core.DeviceInfo

// RangeAttributes are the answers of cuMemRangeGetAttribute for one range.
type RangeAttributes = core.RangeAttributes

// RangeAttr names one attribute for RangeAttribute.
type RangeAttr = core.RangeAttr

const (
	AttrReadMostly           = core.AttrReadMostly
	AttrPreferredLocation    = core.AttrPreferredLocation
	AttrAccessedBy           = core.AttrAccessedBy
	AttrLastPrefetchLocation = core.AttrLastPrefetchLocation
	// The locations' types (a MemLocationType) and ids (an int), as
	// cudaMemRangeAttributePreferredLocationType and its kin (5 to 8).
	AttrPreferredLocationType    = core.AttrPreferredLocationType
	AttrPreferredLocationID      = core.AttrPreferredLocationID
	AttrLastPrefetchLocationType = core.AttrLastPrefetchLocationType
	AttrLastPrefetchLocationID   = core.AttrLastPrefetchLocationID
)

// Advice is cuMemAdvise's advice.
type Advice = core.Advice

const (
	AdviseSetReadMostly          = core.AdviseSetReadMostly
	AdviseUnsetReadMostly        = core.AdviseUnsetReadMostly
	AdviseSetPreferredLocation   = core.AdviseSetPreferredLocation
	AdviseUnsetPreferredLocation = core.AdviseUnsetPreferredLocation
	AdviseSetAccessedBy          = core.AdviseSetAccessedBy
	AdviseUnsetAccessedBy        = core.AdviseUnsetAccessedBy
)

// ParseAdvice reads an advice's name, as Advice.String writes it.
func ParseAdvice(s string) (Advice, error) { return core.ParseAdvice(s) }

// Statistics: what Session.Stats, Allocation.Stats and Session.ServerStats
// return.
type (
	Stats           = core.Stats
	ProcessorFaults = core.ProcessorFaults
	Migration       = core.Migration
	ProcessorPages  = core.ProcessorPages
	ProcessorCount  = core.ProcessorCount
	// ProcessorRefaults counts one processor's refaults and its resident
	// core (Stats.Refaults).
	ProcessorRefaults = core.ProcessorRefaults
	Histogram         = core.Histogram
	Bucket            = core.Bucket
	FaultAnatomy      = core.FaultAnatomy
)

// Info is the server's configuration and state (Session.Info).
type (
	Info        = config.Info
	RestartInfo = config.RestartInfo
	SessionInfo = config.SessionInfo
	ArenaInfo   = config.ArenaInfo
)

// ServerConfig configures a private server (Config.Private).
type ServerConfig = config.ServerConfig

// DefaultServerConfig is one device with a DefaultArenaSize arena, and
// every policy at its default.
func DefaultServerConfig() ServerConfig { return config.DefaultServerConfig() }

// ServerConfigFromEnv is DefaultServerConfig changed by the UVM_*
// environment variables.
func ServerConfigFromEnv() (ServerConfig, error) {
	c, err := config.ServerConfigFromEnv()
	return c, policyHint(err)
}

// PrefetchSpec names a fault prefetch policy and its argument
// (WithPrefetch); the policies are those of package policy.
type PrefetchSpec = policy.PrefetchSpec

// ParsePrefetchSpec reads "name" or "name:arg".
func ParsePrefetchSpec(text string) (PrefetchSpec, error) { return policy.ParsePrefetchSpec(text) }

// The errors of the runtime, after CUDA's error codes; every error a
// function returns wraps one of them (errors.Is).
var (
	ErrInvalidValue     = core.ErrInvalidValue
	ErrMemoryAllocation = core.ErrMemoryAllocation
	ErrInvalidDevice    = core.ErrInvalidDevice
	ErrInitialization   = core.ErrInitialization
	ErrNotSupported     = core.ErrNotSupported
	ErrServerGone       = core.ErrServerGone
	ErrLaunchFailure    = core.ErrLaunchFailure
	ErrInternal         = core.ErrInternal
	// ErrInvalidConfiguration is a grid launch of a shape past the
	// device's limits (cudaErrorInvalidConfiguration).
	ErrInvalidConfiguration = core.ErrInvalidConfiguration
	// ErrCooperativeLaunchTooLarge is a cooperative launch of more blocks
	// than are resident at once (cudaErrorCooperativeLaunchTooLarge).
	ErrCooperativeLaunchTooLarge = core.ErrCooperativeLaunchTooLarge
)

// The environment variables a program's session reads (ConfigFromEnv).
const (
	EnvServer    = config.EnvServer
	EnvSocket    = config.EnvSocket
	EnvCoherence = config.EnvCoherence
	// EnvTrace names the file a client's own events are recorded to
	// (from its start, or between ProfilerStart and ProfilerStop).
	EnvTrace = config.EnvTrace
)

// ParseSize reads a size such as 64MiB, 2GiB or 4096; FormatSize writes one.
func ParseSize(text string) (int64, error) { return core.ParseSize(text) }

// FormatSize writes n bytes as ParseSize reads them.
func FormatSize(n int64) string { return core.FormatSize(n) }
