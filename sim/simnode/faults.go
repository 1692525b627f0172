package simnode

import (
	"encoding/binary"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// faultState is what the scenario's faults do to one GPU at one moment.
type faultState struct {
	lost, hang bool
	hangUntil  time.Duration // 0: until the node is closed
	throttle   uint64
	remap      RemapFault
	// remapBanks is the row remapper's histogram (max .. none).
	remapBanks     [5]int
	recovery       int
	eccCorrected   uint64 // aggregate: over the board's life
	eccUncorrected uint64
	// volatile: since the last reset
	eccCorrectedVolatile, eccUncorrectedVolatile uint64
	// dcgmHealth is DCGM's health watch: system -> warn or fail.
	dcgmHealth map[string]string
}

func active(f FaultSpec, t time.Duration) bool {
	return t >= time.Duration(f.At) && (f.Until == 0 || t < time.Duration(f.Until))
}

// faultsAt folds the scenario's faults on GPU gpu at elapsed time t.
func (n *Node) faultsAt(gpu int, t time.Duration) faultState {
	var s faultState
	s.remapBanks[0] = SimulatedRemapBanks
	var lastReset time.Duration = -1
	for _, f := range n.Scenario.Faults {
		if f.Reset && f.GPU != nil && *f.GPU == gpu && t >= time.Duration(f.At) {
			lastReset = max(lastReset, time.Duration(f.At))
		}
	}
	for _, f := range n.Scenario.Faults {
		if f.GPU == nil || *f.GPU != gpu {
			continue
		}
		if f.ECC != nil && t >= time.Duration(f.At) {
			// Errors that happened stay counted.
			s.eccCorrected += f.ECC.Corrected
			s.eccUncorrected += f.ECC.Uncorrected
			if time.Duration(f.At) >= lastReset {
				s.eccCorrectedVolatile += f.ECC.Corrected
				s.eccUncorrectedVolatile += f.ECC.Uncorrected
			}
		}
		if r := f.Remap; r != nil && r.WalkEvery > 0 && t >= time.Duration(f.At) {
			end := t
			if f.Until != 0 {
				end = min(t, time.Duration(f.Until))
			}
			steps := int((end - time.Duration(f.At)) / time.Duration(r.WalkEvery))
			s.remapBanks = walkBanks(s.remapBanks, steps)
			s.remap.Uncorrectable += steps
		}
		if !active(f, t) {
			continue
		}
		switch {
		case f.Lost, f.XID == 79: // XID 79: the GPU fell off the bus
			s.lost = true
		case f.Hang:
			s.hang, s.hangUntil = true, time.Duration(f.Until)
		case len(f.Throttle) > 0:
			for _, r := range f.Throttle {
				s.throttle |= ThrottleReasons[r]
			}
		case f.Remap != nil:
			walked := s.remap.Uncorrectable
			s.remap = *f.Remap
			s.remap.Uncorrectable += walked
			if b := f.Remap.Banks; b != nil {
				moved := [5]int{0, b.High, b.Partial, b.Low, b.None}
				for i := 1; i < 5; i++ {
					n := min(moved[i], s.remapBanks[0])
					s.remapBanks[0] -= n
					s.remapBanks[i] += n
				}
			}
		case f.RecoveryAction != "":
			s.recovery = RecoveryActions[f.RecoveryAction]
		case f.DCGMHealth != nil:
			if s.dcgmHealth == nil {
				s.dcgmHealth = map[string]string{}
			}
			s.dcgmHealth[f.DCGMHealth.System] = f.DCGMHealth.Result
		}
	}
	return s
}

// walkBanks moves banks one level of spare rows down, steps times: the
// first bank with spare rows left goes down until it has none, then the
// next.
func walkBanks(h [5]int, steps int) [5]int {
	for ; steps > 0; steps-- {
		// The lowest level above none that holds a bank: the bank being walked.
		lvl := -1
		for i := 3; i >= 0; i-- {
			if h[i] > 0 {
				lvl = i
				break
			}
		}
		if lvl < 0 {
			return h // every bank is exhausted
		}
		h[lvl]-- //nolint:gosec // G602: lvl is at most 3 of 5
		h[lvl+1]++
	}
	return h
}

// XIDEvent is an XID the simulated node raises.
type XIDEvent struct {
	GPU  int
	UUID string
	Code int
	At   time.Duration
	// GPUInstance and ComputeInstance are the MIG device's, -1 for the GPU.
	GPUInstance, ComputeInstance int
}

// XIDsBetween lists the XID events with from <= At < to, in time order, one
// per occurrence (a fault with count 2 raises two events).
func (n *Node) XIDsBetween(from, to time.Duration) []XIDEvent {
	var out []XIDEvent
	for _, f := range n.Scenario.Faults {
		if f.XID == 0 || f.GPU == nil {
			continue
		}
		at := time.Duration(f.At)
		if at < from || at >= to {
			continue
		}
		c := f.Count
		if c == 0 {
			c = 1
		}
		gi, ci := -1, -1
		if f.MIG != nil {
			m := n.devices[*f.GPU].migs[*f.MIG]
			gi, ci = m.gi, m.ci
		}
		for i := 0; i < c; i++ {
			out = append(out, XIDEvent{GPU: *f.GPU, UUID: n.devices[*f.GPU].UUID(), Code: f.XID, At: at, GPUInstance: gi, ComputeInstance: ci})
		}
	}
	return out
}

// Elapsed is the simulated time since the node started.
func (n *Node) Elapsed() time.Duration { return n.elapsed() }

// DevicePluginAllocatable says whether a device plugin fault is active, and
// the allocatable device count it imposes.
func (n *Node) DevicePluginAllocatable() (int, bool) {
	t := n.elapsed()
	for _, f := range n.Scenario.Faults {
		if f.DevicePlugin != nil && active(f, t) {
			return f.DevicePlugin.Allocatable, true
		}
	}
	return 0, false
}

// Close releases NVML calls blocked by a hang fault.
func (n *Node) Close() {
	n.closeOnce.Do(func() { close(n.closed); n.closeHost() })
}

// enter is called first by every device method that can fail: it counts the
// call and applies lost and hang faults.
func (d *Device) enter() nvml.Return {
	d.node.count()
	f := d.node.faultsAt(d.index, d.node.elapsed())
	if f.hang {
		for {
			select {
			case <-d.node.closed:
				return nvml.ERROR_TIMEOUT
			case <-time.After(10 * time.Millisecond):
			}
			f = d.node.faultsAt(d.index, d.node.elapsed())
			if !f.hang {
				break
			}
		}
	}
	if f.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

func (d *Device) faults() faultState { return d.node.faultsAt(d.index, d.node.elapsed()) }

// GetTotalEccErrors implements nvmlsampler.Device.
func (d *Device) GetTotalEccErrors(e nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	if d.node.unsupported("ecc") {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	f := d.faults()
	var v uint64
	switch {
	case e == nvml.MEMORY_ERROR_TYPE_CORRECTED && c == nvml.AGGREGATE_ECC:
		v = f.eccCorrected + uint64(d.index%3) // a few old corrected errors over the board's life
	case e == nvml.MEMORY_ERROR_TYPE_CORRECTED:
		v = f.eccCorrectedVolatile
	case c == nvml.AGGREGATE_ECC:
		v = f.eccUncorrected
	default:
		v = f.eccUncorrectedVolatile
	}
	return v, nvml.SUCCESS
}

// GetRetiredPages implements nvmlsampler.Device: Ampere and later remap rows
// instead, as real GPUs do.
func (d *Device) GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nil, ret
	}
	return nil, nvml.ERROR_NOT_SUPPORTED
}

// GetRetiredPagesPendingStatus implements nvmlsampler.Device.
func (d *Device) GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetRemappedRows implements nvmlsampler.Device.
func (d *Device) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, 0, false, false, ret
	}
	if d.node.unsupported("ecc") {
		return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
	}
	r := d.faults().remap
	return r.Correctable, r.Uncorrectable, r.Pending, r.Failed, nvml.SUCCESS
}

// GetRowRemapperHistogram implements nvmlsampler.Device.
func (d *Device) GetRowRemapperHistogram() (nvml.RowRemapperHistogramValues, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nvml.RowRemapperHistogramValues{}, ret
	}
	b := d.faults().remapBanks
	return nvml.RowRemapperHistogramValues{Max: uint32(b[0]), High: uint32(b[1]), Partial: uint32(b[2]), Low: uint32(b[3]), None: uint32(b[4])}, nvml.SUCCESS
}

// GetCurrentClocksEventReasons implements nvmlsampler.Device (R535 and later).
func (d *Device) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	d.node.require("nvmlDeviceGetCurrentClocksEventReasons")
	return d.clockReasons()
}

// GetCurrentClocksThrottleReasons implements nvmlsampler.Device: the same
// bits under the name every branch exports (deprecated since R535).
func (d *Device) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	return d.clockReasons()
}

func (d *Device) clockReasons() (uint64, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	r := d.faults().throttle
	if d.utilAt(d.node.elapsed()) < 0.01 {
		r |= ThrottleReasons["gpu_idle"]
	}
	return r, nvml.SUCCESS
}

// GetPcieReplayCounter implements nvmlsampler.Device.
func (d *Device) GetPcieReplayCounter() (int, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	return 0, nvml.SUCCESS
}

func (d *Device) nvlinks() int {
	if gddrPCIe(d.cfg) {
		return 0
	}
	switch d.cfg.Architecture {
	case nvml.DEVICE_ARCH_HOPPER, nvml.DEVICE_ARCH_BLACKWELL:
		return 18
	case nvml.DEVICE_ARCH_AMPERE:
		if d.cfg.Name == "NVIDIA A100-PCIE-40GB" || d.cfg.Name == "NVIDIA A100-PCIE-80GB" || d.cfg.Name == "NVIDIA A30-PCIE-24GB" {
			return 0
		}
		return 12
	}
	return 0
}

// GetNvLinkState implements nvmlsampler.Device.
func (d *Device) GetNvLinkState(link int) (nvml.EnableState, nvml.Return) {
	d.node.count()
	if d.nvlinks() == 0 { // a PCIe board without NVLink bridges
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	if link >= d.nvlinks() {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.FEATURE_ENABLED, nvml.SUCCESS
}

// GetNvLinkErrorCounter implements nvmlsampler.Device. Blackwell's NVLink5
// answers NOT_SUPPORTED: its counts are field values (GetFieldValues).
func (d *Device) GetNvLinkErrorCounter(link int, _ nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	d.node.count()
	if link >= d.nvlinks() {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	if d.cfg.Architecture == nvml.DEVICE_ARCH_BLACKWELL {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return 0, nvml.SUCCESS
}

// nvlink5Field answers an NVLink5 error count field of one link on
// Blackwell: a few symbol errors per link (the link's index), nothing else.
func (d *Device) nvlink5Field(id, link uint32) (uint64, bool) {
	if d.cfg.Architecture != nvml.DEVICE_ARCH_BLACKWELL || int(link) >= d.nvlinks() {
		return 0, false
	}
	switch id {
	case nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS:
		return uint64(link), true
	case nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, nvml.FI_DEV_NVLINK_COUNT_RCV_ERRORS,
		nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
		return 0, true
	}
	return 0, false
}

// GetPowerManagementLimit implements nvmlsampler.Device (milliwatts).
func (d *Device) GetPowerManagementLimit() (uint32, nvml.Return) {
	d.node.count()
	if d.node.unsupported("power") {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return uint32(d.board.maxW * 1000), nvml.SUCCESS
}

// GetTemperatureThreshold implements nvmlsampler.Device.
func (d *Device) GetTemperatureThreshold(t nvml.TemperatureThresholds) (uint32, nvml.Return) {
	d.node.count()
	switch t {
	case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
		return 87, nvml.SUCCESS
	case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
		return 92, nvml.SUCCESS
	}
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetFieldValues implements nvmlsampler.Device: the recovery action, the
// memory (HBM) temperature, and NVLink5's error counts on Blackwell; other
// fields are NOT_SUPPORTED, each on its own, as the driver answers.
func (d *Device) GetFieldValues(fv []nvml.FieldValue) nvml.Return {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return ret
	}
	for i := range fv {
		if v, ok := d.nvlink5Field(fv[i].FieldId, fv[i].ScopeId); ok {
			fv[i].NvmlReturn = uint32(nvml.SUCCESS)
			fv[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
			binary.LittleEndian.PutUint64(fv[i].Value[:], v)
			continue
		}
		switch fv[i].FieldId {
		case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
			fv[i].NvmlReturn = uint32(nvml.SUCCESS)
			fv[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			binary.LittleEndian.PutUint32(fv[i].Value[:4], uint32(d.faults().recovery))
		case nvml.FI_DEV_MEMORY_TEMP:
			if gddrPCIe(d.cfg) { // GDDR: no memory sensor
				fv[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			fv[i].NvmlReturn = uint32(nvml.SUCCESS)
			fv[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			binary.LittleEndian.PutUint32(fv[i].Value[:4], d.memoryTemperature())
		default:
			fv[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
		}
	}
	return nvml.SUCCESS
}

// GetNumaNodeId implements nvmlsampler.Device (R550 and later). The
// simulated node is an x86 server, where GPUs are not NUMA nodes and NVML
// answers NOT_SUPPORTED; the GPUs' NUMA nodes are in sysfs (WriteSysfs).
func (d *Device) GetNumaNodeId() (int, nvml.Return) {
	d.node.require("nvmlDeviceGetNumaNodeId")
	d.node.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// numaNode: two sockets, GPUs split evenly.
func (d *Device) numaNode() int { return d.index * 2 / len(d.node.devices) }

func (m *MIGDevice) unsupported() nvml.Return { m.count(); return nvml.ERROR_NOT_SUPPORTED }

// The board-level health calls are not supported on MIG device handles.

// GetTotalEccErrors implements nvmlsampler.Device.
func (m *MIGDevice) GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
	return 0, m.unsupported()
}

// GetRetiredPages implements nvmlsampler.Device.
func (m *MIGDevice) GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	return nil, m.unsupported()
}

// GetRetiredPagesPendingStatus implements nvmlsampler.Device.
func (m *MIGDevice) GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return) {
	return 0, m.unsupported()
}

// GetRemappedRows implements nvmlsampler.Device.
func (m *MIGDevice) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	return 0, 0, false, false, m.unsupported()
}

// GetRowRemapperHistogram implements nvmlsampler.Device.
func (m *MIGDevice) GetRowRemapperHistogram() (nvml.RowRemapperHistogramValues, nvml.Return) {
	return nvml.RowRemapperHistogramValues{}, m.unsupported()
}

// GetCurrentClocksEventReasons implements nvmlsampler.Device.
func (m *MIGDevice) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	m.parent.node.require("nvmlDeviceGetCurrentClocksEventReasons")
	return 0, m.unsupported()
}

// GetCurrentClocksThrottleReasons implements nvmlsampler.Device.
func (m *MIGDevice) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	return 0, m.unsupported()
}

// GetPcieReplayCounter implements nvmlsampler.Device.
func (m *MIGDevice) GetPcieReplayCounter() (int, nvml.Return) { return 0, m.unsupported() }

// GetNvLinkState implements nvmlsampler.Device.
func (m *MIGDevice) GetNvLinkState(int) (nvml.EnableState, nvml.Return) { return 0, m.unsupported() }

// GetNvLinkErrorCounter implements nvmlsampler.Device.
func (m *MIGDevice) GetNvLinkErrorCounter(int, nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	return 0, m.unsupported()
}

// GetPowerManagementLimit implements nvmlsampler.Device.
func (m *MIGDevice) GetPowerManagementLimit() (uint32, nvml.Return) { return 0, m.unsupported() }

// GetTemperatureThreshold implements nvmlsampler.Device.
func (m *MIGDevice) GetTemperatureThreshold(nvml.TemperatureThresholds) (uint32, nvml.Return) {
	return 0, m.unsupported()
}

// GetFieldValues implements nvmlsampler.Device.
func (m *MIGDevice) GetFieldValues([]nvml.FieldValue) nvml.Return { return m.unsupported() }

// GetNumaNodeId implements nvmlsampler.Device.
func (m *MIGDevice) GetNumaNodeId() (int, nvml.Return) {
	m.parent.node.require("nvmlDeviceGetNumaNodeId")
	return 0, m.unsupported()
}
