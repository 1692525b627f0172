// Package fakenvml is a fake NVIDIA driver library for tests: a small C
// libnvidia-ml.so.1 (csrc/fakenvml.c) that exports NVML's C functions with
// the prototypes of NVIDIA's nvml.h, built by Build with the system C
// compiler, and loaded by the real exporter binary through
// --nvml.library. It serves the node a Node describes, written to the file
// named by the environment variable FAKENVML_NODE. Variants of the library
// export only the functions of one driver branch (R470 ... R580), so a call
// the branch lacks ends the way it does on a real node.
//
// The node file is re-read whenever it changes (Node.WriteFile replaces it
// atomically), so a test can make a GPU fall off the bus, hang, answer
// NO_PERMISSION or raise an XID while the exporter runs.
package fakenvml

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// EnvNode is the environment variable that names the node file.
const EnvNode = "FAKENVML_NODE"

// EnvTrace names a file (when set) the library appends every call to
// ("symbol gpu mig" per line).
const EnvTrace = "FAKENVML_TRACE"

// Forever makes a blocked call wait until the block is lifted.
const Forever time.Duration = -1

// Node is a GPU node as the driver reports it. Every optional field that is
// nil (or empty) makes the matching NVML function answer NOT_SUPPORTED, as a
// driver does for a feature the device lacks.
type Node struct {
	DriverVersion     string
	NVMLVersion       string
	CUDADriverVersion int // e.g. 12040 for 12.4
	// FieldMax is NVML_FI_MAX of the driver's header: field IDs from it on
	// answer INVALID_ARGUMENT (0: every field is known).
	FieldMax uint32
	GPUs     []GPU
	// Events are raised when the library first reads them (on its next
	// call, from any thread): every event set registered for their GPU and
	// type at that moment gets a copy, in order; with no such set an event
	// is lost, as on a real driver.
	Events []Event
	// Bursts are storms of one event (at most 8): each falls due at its
	// rate from when the library first reads it, and every
	// nvmlEventSetWait delivers the next one due to every set registered
	// for its GPU and type then. A burst arrives no faster than the process
	// waits, so which sets get each event depends on the order of the
	// process's calls only, not on the machine's load.
	Bursts []Burst
	// Returns forces the answer of a function that takes no device
	// (e.g. "nvmlInit_v2": nvml.ERROR_DRIVER_NOT_LOADED).
	Returns map[string]nvml.Return
	// Blocks makes functions block for a while, or Forever; "all" blocks
	// every call on every device (a GPU hung in the kernel driver holding
	// a driver-wide lock).
	Blocks map[string]time.Duration
	// DriverGeneration names the loaded driver: changing it under a
	// running process is a driver reload (an upgrade, a crashed driver
	// container): every call answers UNINITIALIZED and every event set is
	// gone until nvmlInit is called again.
	DriverGeneration int
	// DriverUnloaded: no kernel module. nvmlInit answers
	// DRIVER_NOT_LOADED; an initialised library is torn down as on a reload.
	DriverUnloaded bool
}

// Event is an NVML event: an XID, or an ECC error.
type Event struct {
	GPU  int
	Type uint64 // nvml.EventTypeXidCriticalError, ...
	Data uint64 // the XID
	// GPUInstance and ComputeInstance locate an XID inside a MIG GPU; nil
	// reports 0xFFFFFFFF, as for a whole GPU.
	GPUInstance, ComputeInstance *uint32
}

// Burst is Count events of one kind on one GPU, one every Every.
type Burst struct {
	GPU   int
	Type  uint64 // nvml.EventTypeXidCriticalError, ...
	Data  uint64 // the XID
	Count int
	Every time.Duration
}

// Memory is framebuffer memory in bytes. Used excludes Reserved (as
// nvmlMemory_v2_t); the v1 call reports Used+Reserved as used.
type Memory struct{ Total, Reserved, Used uint64 }

// Device is what a whole GPU and a MIG device have in common.
type Device struct {
	UUID        string
	Name        string
	Memory      *Memory
	Utilization *nvml.Utilization
	// EncoderUtilization and DecoderUtilization answer
	// nvmlDevice{En,De}coderUtilization: percent and sampling period in µs.
	EncoderUtilization, DecoderUtilization *[2]uint32
	Attributes                             *nvml.DeviceAttributes
	Processes                              *Processes
	// Returns forces a function's answer on this device, e.g.
	// {"nvmlDeviceGetMemoryInfo_v2": nvml.ERROR_NO_PERMISSION}; "all" is
	// not a key here (use GPU.Lost).
	Returns map[string]nvml.Return
	// Blocks makes a function (or "all") block on this device.
	Blocks map[string]time.Duration
}

// Processes are the device's running processes and their utilisation.
type Processes struct {
	Compute, Graphics, MPS []nvml.ProcessInfo
	Utilization            []nvml.ProcessUtilizationInfo_v1
}

// GPU is one physical GPU.
type GPU struct {
	Device
	Serial       string
	Minor        int
	PCIBusID     string // 00000000:18:00.0
	PCIDeviceID  uint32
	Architecture nvml.DeviceArchitecture
	// ComputeCapability is major, minor.
	ComputeCapability *[2]int
	Clocks            map[nvml.ClockType]uint32 // MHz
	MaxClocks         map[nvml.ClockType]uint32
	PowerUsage        *uint32 // milliwatts
	PowerLimit        *uint32
	EnforcedLimit     *uint32
	Energy            *uint64                            // millijoules since the driver loaded
	Temperatures      map[nvml.TemperatureSensors]uint32 // °C
	Thresholds        map[nvml.TemperatureThresholds]uint32
	PCIe              *PCIe
	ECC               *ECC
	RemappedRows      *RemappedRows
	// RemapperHistogram is nvmlDeviceGetRowRemapperHistogram's banks by
	// spare rows left: max, high, partial, low, none; nil: not supported.
	RemapperHistogram *[5]uint32
	// RetiredPages by cause; nil: not supported (Ampere and later).
	RetiredPages        map[nvml.PageRetirementCause][]uint64
	RetiredPagesPending *bool
	NVLinks             []NVLink // nil: no NVLink
	// Fields answers nvmlDeviceGetFieldValues by field ID, FieldReturns
	// forces a field's own return code.
	Fields       map[uint32]uint64
	FieldReturns map[uint32]nvml.Return
	// ScopedFields answers a field for one scope (field ID -> scope ID,
	// e.g. an NVLink for NVML_FI_DEV_NVLINK_COUNT_*), before Fields.
	ScopedFields map[uint32]map[uint32]uint64
	// ClockEventReasons is served by both ...ClocksEventReasons and
	// ...ClocksThrottleReasons (one function, renamed in R535).
	ClockEventReasons          *uint64
	SupportedClockEventReasons *uint64
	NUMANode                   *int
	// SupportedEvents defaults to XID, and single and double bit ECC where
	// ECC is enabled.
	SupportedEvents *uint64
	MIG             *MIG
	// Lost makes every call on the GPU answer GPU_IS_LOST.
	Lost bool
}

// PCIe is the link state and counters.
type PCIe struct {
	Gen, Width, MaxGen, MaxWidth uint32
	TxKBs, RxKBs                 uint32 // nvmlDeviceGetPcieThroughput, KB/s
	Replays                      uint32
}

// ECC is the ECC mode and counters, [nvml.MemoryErrorType][nvml.EccCounterType].
type ECC struct {
	Enabled bool
	Counts  [2][2]uint64
}

// RemappedRows is the row remapper's state.
type RemappedRows struct {
	Correctable, Uncorrectable int
	Pending, Failed            bool
}

// NVLink is one link.
type NVLink struct {
	Active bool
	Errors map[nvml.NvLinkErrorCounter]uint64
}

// MIG is a GPU's MIG mode, profiles and instances.
type MIG struct {
	// Enabled is the current MIG mode. Pending is the mode set for the
	// next GPU reset (nvidia-smi -mig 1 on a GPU in use, the MIG manager
	// before its reboot): nvmlDeviceGetMigMode answers it as pendingMode
	// until the reset; nil: the same as Enabled.
	Enabled bool
	Pending *bool
	// MaxDevices is nvmlDeviceGetMaxMigDeviceCount (7 on A100/H100).
	MaxDevices int
	// Profiles by profile index (nvml.GPU_INSTANCE_PROFILE_*).
	Profiles     map[int]GPUInstanceProfile
	GPUInstances []GPUInstance
	// Devices are the MIG device handles in index order, one per compute
	// instance.
	Devices []MIGDevice
	// created counts the GPU instances AddGPUInstance made, so that an
	// instance re-created after RemoveGPUInstance gets a new UUID, as
	// with the driver.
	created int
	// ciCreated counts the compute instances CreateComputeInstances made
	// in GPU instances that stood alone, for the same.
	ciCreated int
	// geo numbers the GPU instances by placement, as the driver does (nil:
	// the lowest free ID from 1).
	geo *miggeometry.Model
}

// GPUInstanceProfile is a profile's info and where it can be placed.
type GPUInstanceProfile struct {
	Info       nvml.GpuInstanceProfileInfo // Id may differ from the index
	Name       string                      // e.g. 3g.40gb
	Placements []nvml.GpuInstancePlacement // in memory slices
}

// GPUInstance is a GPU instance and its compute instances.
type GPUInstance struct {
	ID        int
	ProfileID uint32
	Placement nvml.GpuInstancePlacement
	// ComputeProfiles by compute instance profile index.
	ComputeProfiles  map[int]ComputeInstanceProfile
	ComputeInstances []ComputeInstance
}

// ComputeInstanceProfile is a compute instance profile inside a GPU instance.
type ComputeInstanceProfile struct {
	Info nvml.ComputeInstanceProfileInfo
	Name string
}

// ComputeInstance is a compute instance.
type ComputeInstance struct {
	ID        int
	ProfileID uint32
	Placement nvml.ComputeInstancePlacement
}

// MIGDevice is the device handle of one compute instance.
type MIGDevice struct {
	Device
	GPUInstance, ComputeInstance int
	// Index is what nvmlDeviceGetIndex answers on the MIG handle.
	Index *int
}

// Ptr returns a pointer to v, for the optional fields.
func Ptr[T any](v T) *T { return &v }

// kv collects the node file's lines.
type kv map[string]string

func (m kv) set(k string, v any) { m[k] = fmt.Sprint(v) }

// Encode renders the node file.
func (n *Node) Encode() ([]byte, error) {
	if len(n.GPUs) > 16 {
		return nil, fmt.Errorf("fakenvml: %d GPUs, the library holds at most 16", len(n.GPUs))
	}
	m := kv{}
	m.set("device_count", len(n.GPUs))
	if n.DriverVersion != "" {
		m.set("driver_version", n.DriverVersion)
	}
	if n.NVMLVersion != "" {
		m.set("nvml_version", n.NVMLVersion)
	}
	if n.CUDADriverVersion != 0 {
		m.set("cuda_driver_version", n.CUDADriverVersion)
	}
	if n.FieldMax != 0 {
		m.set("field_max", n.FieldMax)
	}
	behaviour(m, "", n.Returns, n.Blocks)
	if n.DriverGeneration != 0 {
		m.set("driver_generation", n.DriverGeneration)
	}
	if n.DriverUnloaded {
		m.set("driver_unloaded", 1)
	}
	for i, e := range n.Events {
		s := fmt.Sprintf("%d %d %d", e.GPU, e.Type, e.Data)
		if e.GPUInstance != nil {
			ci := uint32(0xFFFFFFFF)
			if e.ComputeInstance != nil {
				ci = *e.ComputeInstance
			}
			s += fmt.Sprintf(" %d %d", *e.GPUInstance, ci)
		}
		m.set(fmt.Sprintf("event.%d", i), s)
	}
	if len(n.Bursts) > 8 {
		return nil, fmt.Errorf("fakenvml: %d bursts, the library holds at most 8", len(n.Bursts))
	}
	for i, b := range n.Bursts {
		m.set(fmt.Sprintf("burst.%d", i), fmt.Sprintf("%d %d %d %d %d", b.GPU, b.Type, b.Data, b.Count, max(1, b.Every.Microseconds())))
	}
	for i := range n.GPUs {
		if err := n.GPUs[i].encode(m, fmt.Sprintf("gpu.%d.", i)); err != nil {
			return nil, fmt.Errorf("fakenvml: GPU %d: %w", i, err)
		}
	}
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if strings.ContainsAny(k, "=\n") || strings.Contains(v, "\n") {
			return nil, fmt.Errorf("fakenvml: key %q or its value %q holds '=' or a newline", k, v)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# fakenvml node file, written by sim/fakenvml\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, m[k])
	}
	return []byte(b.String()), nil
}

// WriteFile writes the node file atomically (write, then rename), so the
// library never reads half a file.
func (n *Node) WriteFile(path string) error {
	b, err := n.Encode()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".fakenvml-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func retName(r nvml.Return) string { return fmt.Sprint(int32(r)) }

func behaviour(m kv, p string, rets map[string]nvml.Return, blocks map[string]time.Duration) {
	for fn, r := range rets {
		m.set(p+"ret."+fn, retName(r))
	}
	for fn, d := range blocks {
		if d == Forever {
			m.set(p+"block."+fn, "forever")
		} else {
			m.set(p+"block."+fn, d.Milliseconds())
		}
	}
}

func (d *Device) encode(m kv, p string) {
	if d.UUID != "" {
		m.set(p+"uuid", d.UUID)
	}
	if d.Name != "" {
		m.set(p+"name", d.Name)
	}
	if d.Memory != nil {
		m.set(p+"memory.total", d.Memory.Total)
		m.set(p+"memory.reserved", d.Memory.Reserved)
		m.set(p+"memory.used", d.Memory.Used)
	}
	if u := d.Utilization; u != nil {
		m.set(p+"utilization", fmt.Sprintf("%d %d", u.Gpu, u.Memory))
	}
	if u := d.EncoderUtilization; u != nil {
		m.set(p+"encoder_utilization", fmt.Sprintf("%d %d", u[0], u[1]))
	}
	if u := d.DecoderUtilization; u != nil {
		m.set(p+"decoder_utilization", fmt.Sprintf("%d %d", u[0], u[1]))
	}
	if a := d.Attributes; a != nil {
		m.set(p+"attributes", fmt.Sprintf("%d %d %d %d %d %d %d %d %d", a.MultiprocessorCount, a.SharedCopyEngineCount,
			a.SharedDecoderCount, a.SharedEncoderCount, a.SharedJpegCount, a.SharedOfaCount,
			a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount, a.MemorySizeMB))
	}
	if pr := d.Processes; pr != nil {
		for kind, list := range map[string][]nvml.ProcessInfo{"compute": pr.Compute, "graphics": pr.Graphics, "mps": pr.MPS} {
			var s []string
			for _, x := range list {
				s = append(s, fmt.Sprintf("%d:%d:%d:%d", x.Pid, x.UsedGpuMemory, x.GpuInstanceId, x.ComputeInstanceId))
			}
			m.set(p+"processes."+kind, strings.Join(s, " "))
		}
		var s []string
		for _, u := range pr.Utilization {
			s = append(s, fmt.Sprintf("%d:%d:%d:%d:%d:%d:%d:%d", u.Pid, u.TimeStamp, u.SmUtil, u.MemUtil, u.EncUtil, u.DecUtil, u.JpgUtil, u.OfaUtil))
		}
		m.set(p+"process_utilization", strings.Join(s, " "))
	}
	behaviour(m, p, d.Returns, d.Blocks)
}

func (g *GPU) encode(m kv, p string) error {
	g.Device.encode(m, p)
	if g.Serial != "" {
		m.set(p+"serial", g.Serial)
	}
	m.set(p+"minor", g.Minor)
	if g.PCIBusID != "" {
		m.set(p+"pci.bus_id", g.PCIBusID)
		m.set(p+"pci.device_id", fmt.Sprintf("0x%08X", g.PCIDeviceID))
	}
	if g.Architecture != 0 {
		m.set(p+"architecture", uint32(g.Architecture))
	}
	if c := g.ComputeCapability; c != nil {
		m.set(p+"cuda_compute_capability", fmt.Sprintf("%d %d", c[0], c[1]))
	}
	for t, v := range g.Clocks {
		m.set(fmt.Sprintf("%sclock.%d", p, t), v)
	}
	for t, v := range g.MaxClocks {
		m.set(fmt.Sprintf("%sclock_max.%d", p, t), v)
	}
	opt := func(k string, v any) {
		switch x := v.(type) {
		case *uint32:
			if x != nil {
				m.set(p+k, *x)
			}
		case *uint64:
			if x != nil {
				m.set(p+k, *x)
			}
		case *int:
			if x != nil {
				m.set(p+k, *x)
			}
		}
	}
	opt("power.usage", g.PowerUsage)
	opt("power.limit", g.PowerLimit)
	opt("power.enforced_limit", g.EnforcedLimit)
	opt("energy", g.Energy)
	opt("clocks_event_reasons", g.ClockEventReasons)
	opt("supported_clocks_event_reasons", g.SupportedClockEventReasons)
	opt("numa_node", g.NUMANode)
	opt("supported_events", g.SupportedEvents)
	for s, v := range g.Temperatures {
		m.set(fmt.Sprintf("%stemperature.%d", p, s), v)
	}
	for t, v := range g.Thresholds {
		m.set(fmt.Sprintf("%stemperature_threshold.%d", p, t), v)
	}
	if x := g.PCIe; x != nil {
		m.set(p+"pcie.gen", x.Gen)
		m.set(p+"pcie.width", x.Width)
		m.set(p+"pcie.max_gen", x.MaxGen)
		m.set(p+"pcie.max_width", x.MaxWidth)
		m.set(fmt.Sprintf("%spcie.throughput.%d", p, nvml.PCIE_UTIL_TX_BYTES), x.TxKBs)
		m.set(fmt.Sprintf("%spcie.throughput.%d", p, nvml.PCIE_UTIL_RX_BYTES), x.RxKBs)
		m.set(p+"pcie.replay", x.Replays)
	}
	if e := g.ECC; e != nil {
		mode := 0
		if e.Enabled {
			mode = 1
		}
		m.set(p+"ecc.mode", fmt.Sprintf("%d %d", mode, mode))
		for et := 0; et < 2; et++ {
			for ct := 0; ct < 2; ct++ {
				m.set(fmt.Sprintf("%secc.%d.%d", p, et, ct), e.Counts[et][ct])
			}
		}
	}
	if r := g.RemappedRows; r != nil {
		m.set(p+"remapped_rows", fmt.Sprintf("%d %d %d %d", r.Correctable, r.Uncorrectable, b2i(r.Pending), b2i(r.Failed)))
	}
	if h := g.RemapperHistogram; h != nil {
		m.set(p+"remapper_histogram", fmt.Sprintf("%d %d %d %d %d", h[0], h[1], h[2], h[3], h[4]))
	}
	for c, pages := range g.RetiredPages {
		var s []string
		for _, a := range pages {
			s = append(s, fmt.Sprintf("0x%x", a))
		}
		m.set(fmt.Sprintf("%sretired_pages.%d", p, c), strings.Join(s, " "))
	}
	if g.RetiredPagesPending != nil {
		m.set(p+"retired_pages.pending", b2i(*g.RetiredPagesPending))
	}
	if g.NVLinks != nil {
		m.set(p+"nvlink.count", len(g.NVLinks))
		for l, link := range g.NVLinks {
			m.set(fmt.Sprintf("%snvlink.%d.state", p, l), b2i(link.Active))
			for c, v := range link.Errors {
				m.set(fmt.Sprintf("%snvlink.%d.error.%d", p, l, c), v)
			}
		}
	}
	for id, v := range g.Fields {
		m.set(fmt.Sprintf("%sfield.%d", p, id), v)
	}
	for id, scopes := range g.ScopedFields {
		for scope, v := range scopes {
			m.set(fmt.Sprintf("%sfield.%d@%d", p, id, scope), v)
		}
	}
	for id, r := range g.FieldReturns {
		m.set(fmt.Sprintf("%sfield.%d.ret", p, id), retName(r))
	}
	if g.Lost {
		m.set(p+"lost", 1)
	}
	if g.MIG != nil {
		return g.MIG.encode(m, p)
	}
	return nil
}

func (x *MIG) encode(m kv, p string) error {
	mode := 0
	if x.Enabled {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	pending := mode
	if x.Pending != nil {
		pending = b2i(*x.Pending) * nvml.DEVICE_MIG_ENABLE
	}
	m.set(p+"mig_mode", fmt.Sprintf("%d %d", mode, pending))
	m.set(p+"mig_max", x.MaxDevices)
	for idx, pr := range x.Profiles {
		if idx < 0 || idx >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return fmt.Errorf("MIG profile index %d is out of range 0-%d", idx, nvml.GPU_INSTANCE_PROFILE_COUNT-1)
		}
		i := pr.Info
		m.set(fmt.Sprintf("%sgip.%d", p, idx), fmt.Sprintf("%d %d %d %d %d %d %d %d %d %d %d", i.Id, i.SliceCount, i.InstanceCount,
			i.MultiprocessorCount, i.CopyEngineCount, i.DecoderCount, i.EncoderCount, i.JpegCount, i.OfaCount, i.MemorySizeMB, i.IsP2pSupported))
		if pr.Name != "" {
			m.set(fmt.Sprintf("%sgip.%d.name", p, idx), pr.Name)
		}
		var pl []string
		for _, x := range pr.Placements {
			pl = append(pl, fmt.Sprintf("%d:%d", x.Start, x.Size))
		}
		m.set(fmt.Sprintf("%sgip.%d.placements", p, idx), strings.Join(pl, " "))
	}
	gis := map[int]bool{}
	for _, gi := range x.GPUInstances {
		if gi.ID < 0 || gi.ID >= 16 {
			return fmt.Errorf("GPU instance ID %d is out of range 0-15", gi.ID)
		}
		gis[gi.ID] = true
		gp := fmt.Sprintf("%sgi.%d", p, gi.ID)
		m.set(gp, fmt.Sprintf("%d %d %d", gi.ProfileID, gi.Placement.Start, gi.Placement.Size))
		for idx, cp := range gi.ComputeProfiles {
			i := cp.Info
			m.set(fmt.Sprintf("%s.cip.%d", gp, idx), fmt.Sprintf("%d %d %d %d %d %d %d %d %d", i.Id, i.SliceCount, i.InstanceCount,
				i.MultiprocessorCount, i.SharedCopyEngineCount, i.SharedDecoderCount, i.SharedEncoderCount, i.SharedJpegCount, i.SharedOfaCount))
			if cp.Name != "" {
				m.set(fmt.Sprintf("%s.cip.%d.name", gp, idx), cp.Name)
			}
		}
		for _, ci := range gi.ComputeInstances {
			if ci.ID < 0 || ci.ID >= 8 {
				return fmt.Errorf("compute instance ID %d is out of range 0-7", ci.ID)
			}
			m.set(fmt.Sprintf("%s.ci.%d", gp, ci.ID), fmt.Sprintf("%d %d %d", ci.ProfileID, ci.Placement.Start, ci.Placement.Size))
		}
	}
	if len(x.Devices) > 8 {
		return fmt.Errorf("%d MIG devices, the library holds at most 8", len(x.Devices))
	}
	for i := range x.Devices {
		d := &x.Devices[i]
		if !gis[d.GPUInstance] {
			return fmt.Errorf("MIG device %d is in GPU instance %d, which is not in GPUInstances", i, d.GPUInstance)
		}
		mp := fmt.Sprintf("%smig.%d.", p, i)
		d.encode(m, mp)
		m.set(mp+"gi", d.GPUInstance)
		m.set(mp+"ci", d.ComputeInstance)
		if d.Index != nil {
			m.set(mp+"index", *d.Index)
		}
	}
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
