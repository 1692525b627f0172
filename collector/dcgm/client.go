package dcgm

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// LibraryName is the shared library DCGM is loaded from (dlopen, at Init).
const LibraryName = "libdcgm.so.4"

// DefaultHostEnginePort is where nv-hostengine listens (the GPU Operator's
// nvidia-dcgm DaemonSet included).
const DefaultHostEnginePort = "5555"

// Errors DefaultOpen and Client methods wrap; test them with errors.Is.
var (
	// ErrLibraryNotFound: libdcgm.so.4 could not be loaded (or this binary
	// was built without cgo). In auto mode the sampler turns DCGM off.
	ErrLibraryNotFound = errors.New("DCGM library " + LibraryName + " not found")
	// ErrConnection: the host engine is gone (connection not valid, not
	// initialised). The sampler drops the client and reconnects.
	ErrConnection = errors.New("DCGM host engine connection lost")
	// ErrDisabled: mode "off".
	ErrDisabled = errors.New("DCGM disabled (mode off)")
	// ErrBusy: a real client is already open in this process (go-dcgm keeps
	// one global connection).
	ErrBusy = errors.New("DCGM client already open in this process")
)

// EntityKind is the kind of a DCGM entity the sampler watches.
type EntityKind int

// Entity kinds (DCGM_FE_GPU, DCGM_FE_GPU_I and DCGM_FE_GPU_CI), from the
// coarsest to the finest: a GPU holds GPU instances, a GPU instance holds
// compute instances.
const (
	EntityGPU             EntityKind = iota // a whole GPU
	EntityGPUInstance                       // a MIG GPU instance
	EntityComputeInstance                   // a MIG compute instance
)

func (k EntityKind) String() string {
	switch k {
	case EntityGPUInstance:
		return "gpu_instance"
	case EntityComputeInstance:
		return "compute_instance"
	}
	return "gpu"
}

// Entity names one DCGM entity: a kind and DCGM's ID for it (DCGM's GPU ID,
// GPU instance or compute instance entity ID; none is necessarily the NVML
// index or the NVML instance ID).
type Entity struct {
	Kind EntityKind
	ID   uint
}

func (e Entity) String() string { return fmt.Sprintf("%s:%d", e.Kind, e.ID) }

// DeviceInfo describes one entity found by Client.Devices.
type DeviceInfo struct {
	Entity Entity
	// GPU is the NVML index of the (parent) GPU.
	GPU int
	// UUID is the physical GPU's UUID (the parent's for a MIG instance).
	UUID string
	// GPUInstance is the NVML GPU instance ID of a MIG instance (of a
	// compute instance: of its GPU instance), -1 for a whole GPU.
	GPUInstance int
	// ComputeInstance is the NVML compute instance ID of a compute
	// instance, -1 for a whole GPU or a GPU instance.
	ComputeInstance int
	// Parent is the DCGM GPU ID of a MIG instance's GPU (its own ID for a
	// whole GPU).
	Parent uint
}

// RawValue is one field value as DCGM returned it, before the sampler
// filters it.
type RawValue struct {
	Entity  Entity
	FieldID uint16
	// Status is DCGM's per-value status: StatusOK, or StatusNotSupported,
	// StatusNotWatched, StatusNoData... (the value is then meaningless).
	Status int
	// Type is FieldTypeDouble or FieldTypeInt64 (others are ignored).
	Type  byte
	Float float64
	Int   int64
	// Time is DCGM's timestamp of the value (for XIDs: when it happened);
	// zero when DCGM gave none.
	Time time.Time
}

// HealthIncident is one non-passing health watch result from HealthCheck.
type HealthIncident struct {
	Entity  Entity
	System  string // HealthPCIe, HealthMemory, ...
	Result  string // HealthWarn or HealthFail
	Message string
}

// Client is the narrow set of DCGM operations the sampler uses. realClient
// implements it over go-dcgm's package functions (one process-wide
// connection); Fake implements it for tests and the simulated node.
//
// A Client is used from one goroutine at a time. Errors that mean the host
// engine is gone wrap ErrConnection.
type Client interface {
	// Devices discovers the GPUs DCGM supports, their MIG GPU instances
	// and the compute instances of those (dcgmGetAllSupportedDevices,
	// dcgmGetGpuInstanceHierarchy).
	Devices() ([]DeviceInfo, error)
	// Watch replaces any earlier watch: it groups the entities, creates a
	// field group with fieldIDs and has DCGM sample them every `every`,
	// keeping samples for `keep` (dcgmGroupCreate, dcgmFieldGroupCreate,
	// dcgmWatchFields), and sets health watches on the whole GPUs among the
	// entities (dcgmHealthSet). Fields a device cannot provide (profiling
	// on a GPU without DCP) are not an error: their values come back with
	// a not-supported or not-watched status.
	Watch(entities []Entity, fieldIDs []uint16, every, keep time.Duration) error
	// Latest returns the latest value of every field for every entity
	// (dcgmEntitiesGetLatestValues).
	Latest(entities []Entity, fieldIDs []uint16) ([]RawValue, error)
	// HealthCheck returns the non-passing results of the health watches
	// set by Watch (dcgmHealthCheck).
	HealthCheck() ([]HealthIncident, error)
	// Close removes the watches and disconnects (or stops the embedded
	// host engine). The client is unusable afterwards.
	Close() error
}

// Mode is how the sampler reaches DCGM.
type Mode string

// Modes.
const (
	// ModeAuto: embedded if libdcgm.so.4 loads, else off (one log line).
	ModeAuto Mode = "auto"
	// ModeEmbedded: run the host engine inside this process.
	ModeEmbedded Mode = "embedded"
	// ModeStandalone: connect to an nv-hostengine at Config.HostEngine.
	ModeStandalone Mode = "standalone"
	// ModeOff: no DCGM; NVML fields only.
	ModeOff Mode = "off"
)

// Modes lists the valid modes (for flag help).
var Modes = []Mode{ModeAuto, ModeEmbedded, ModeStandalone, ModeOff}

// ParseMode parses a mode name (case-insensitive; "" is auto).
func ParseMode(s string) (Mode, error) {
	m := Mode(strings.ToLower(strings.TrimSpace(s)))
	if m == "" {
		return ModeAuto, nil
	}
	for _, v := range Modes {
		if m == v {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown DCGM mode %q (want auto, embedded, standalone or off)", s)
}

// Config configures a Sampler and DefaultOpen.
type Config struct {
	Mode Mode
	// HostEngine is HOST:PORT of nv-hostengine for standalone mode (the GPU
	// Operator's nvidia-dcgm listens on 5555; a missing port means 5555),
	// or unix:///path/to/socket.
	HostEngine string
	// Interval is the sample period (default 10s); DCGM is asked to update
	// the watched fields at the same period.
	Interval time.Duration
	// MaxMissed: a value whose DCGM timestamp is more than MaxMissed
	// intervals old is dropped, and after MaxMissed failed samples in a row
	// the connection is re-established (default 3).
	MaxMissed int
	// MaxBackoff caps the reconnect backoff, which starts at Interval and
	// doubles per failed attempt (default 30s, never below Interval).
	MaxBackoff time.Duration
	// HealthHold keeps a warn or fail health result for this long after
	// DCGM last reported it, so an incident reported once is not missed
	// between scrapes (default 5m; negative: no hold).
	HealthHold time.Duration
	// Rediscover is how often the GPU/MIG hierarchy is re-read to pick up
	// MIG reconfiguration (default 1m).
	Rediscover time.Duration
	Log        zerolog.Logger
}

func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.Interval <= 0 {
		c.Interval = 10 * time.Second
	}
	if c.MaxMissed <= 0 {
		c.MaxMissed = 3
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.MaxBackoff < c.Interval {
		c.MaxBackoff = c.Interval
	}
	if c.HealthHold == 0 {
		c.HealthHold = 5 * time.Minute
	}
	if c.Rediscover <= 0 {
		c.Rediscover = time.Minute
	}
	return c
}

// standaloneAddress turns Config.HostEngine into go-dcgm's Standalone
// arguments: an address and "0" (TCP) or "1" (unix socket).
func standaloneAddress(hostEngine string) (addr, isSocket string, err error) {
	h := strings.TrimSpace(hostEngine)
	if h == "" {
		return "localhost:" + DefaultHostEnginePort, "0", nil
	}
	if p, ok := strings.CutPrefix(h, "unix://"); ok {
		if p == "" {
			return "", "", fmt.Errorf("DCGM host engine %q: empty socket path", hostEngine)
		}
		return p, "1", nil
	}
	h = strings.TrimPrefix(h, "tcp://")
	if _, _, err := net.SplitHostPort(h); err != nil {
		// No port: add the default one.
		h = net.JoinHostPort(strings.Trim(h, "[]"), DefaultHostEnginePort)
		if _, _, err := net.SplitHostPort(h); err != nil {
			return "", "", fmt.Errorf("DCGM host engine %q: %v", hostEngine, err)
		}
	}
	return h, "0", nil
}

// DefaultOpen connects to DCGM through go-dcgm as cfg.Mode says: embedded
// (and auto) start the host engine in this process, standalone connects to
// cfg.HostEngine. Without libdcgm.so.4 it returns an error wrapping
// ErrLibraryNotFound at once (go-dcgm's Init dlopens the library and
// returns an error; it does not panic, and a panic would be recovered).
// Mode off returns ErrDisabled. Only one client may be open at a time
// (ErrBusy).
func DefaultOpen(cfg Config) (Client, error) {
	cfg = cfg.withDefaults()
	switch cfg.Mode {
	case ModeOff:
		return nil, ErrDisabled
	case ModeAuto, ModeEmbedded:
		return openReal(cfg, false, "", "")
	case ModeStandalone:
		addr, sock, err := standaloneAddress(cfg.HostEngine)
		if err != nil {
			return nil, err
		}
		return openReal(cfg, true, addr, sock)
	}
	return nil, fmt.Errorf("unknown DCGM mode %q", cfg.Mode)
}
