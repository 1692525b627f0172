package nvml

import (
	"encoding/binary"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// HealthDevice is what the health reader needs beyond Device. It is part
// of Device; split out to keep the list readable.
type HealthDevice interface {
	GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return)
	GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return)
	GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return)
	GetRemappedRows() (int, int, bool, bool, nvml.Return)
	GetCurrentClocksEventReasons() (uint64, nvml.Return)    // R535+: probe first
	GetCurrentClocksThrottleReasons() (uint64, nvml.Return) // every branch; deprecated in R535
	GetPcieReplayCounter() (int, nvml.Return)
	GetNvLinkState(link int) (nvml.EnableState, nvml.Return)
	GetNvLinkErrorCounter(link int, counter nvml.NvLinkErrorCounter) (uint64, nvml.Return)
	GetPowerManagementLimit() (uint32, nvml.Return)
	GetTemperatureThreshold(nvml.TemperatureThresholds) (uint32, nvml.Return)
	GetFieldValues([]nvml.FieldValue) nvml.Return
	GetNumaNodeId() (int, nvml.Return) // R550+: probe first
}

// opt is a value NVML may not have given.
type opt[T any] struct {
	V  T
	OK bool
}

func some[T any](v T) opt[T] { return opt[T]{V: v, OK: true} }

// Health is a GPU's board-level health in one sample. Fields NVML does not
// support on the device are left unset and not exported.
type Health struct {
	ECC            [2][2]opt[uint64] // [corrected, uncorrected][volatile, aggregate]
	RetiredPages   [2]opt[int]       // [single bit, double bit]
	RetiredPending opt[bool]
	RemapCorr      opt[int]
	RemapUncorr    opt[int]
	RemapPending   opt[bool]
	RemapFailed    opt[bool]
	ClockReasons   opt[uint64]
	PCIeReplay     opt[int]
	// NVLinkErrors sums each error type (NVLinkErrorTypes) over every link
	// ever seen up, with a link's last value kept while it is down: a link
	// going down must not make the counter fall. NVLinkErrorSeen says which
	// types the GPU reports: per-link counters before Blackwell, NVLink5
	// field values (NVML_FI_DEV_NVLINK_COUNT_*) on Blackwell.
	NVLinkErrors    [numNVLinkErrorTypes]uint64
	NVLinkErrorSeen [numNVLinkErrorTypes]bool
	HasNVLink       bool
	RecoveryAction  opt[int]
	NUMANode        opt[int]
	NVLinkActive    int // number of active NVLinks
}

const numNVLinkErrorTypes = 8

// nvlinkKey is one error counter of one link.
type nvlinkKey struct{ link, typ int }

var (
	// NVLinkErrorTypes are the NVLink error counts read, in the order of
	// Health.NVLinkErrors: the data-link counters of
	// nvmlDeviceGetNvLinkErrorCounter (Ampere, Hopper), and on Blackwell,
	// where those answer NOT_SUPPORTED, NVLink5's per-link field values
	// (R570+). Field 0: no NVLink5 field; Counter -1: no per-link counter.
	NVLinkErrorTypes = [numNVLinkErrorTypes]struct {
		Name    string
		Counter nvml.NvLinkErrorCounter
		Field   uint32
	}{
		{"replay", nvml.NVLINK_ERROR_DL_REPLAY, 0},
		{"recovery", nvml.NVLINK_ERROR_DL_RECOVERY, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS},
		{"crc_flit", nvml.NVLINK_ERROR_DL_CRC_FLIT, 0},
		{"crc_data", nvml.NVLINK_ERROR_DL_CRC_DATA, 0},
		{"symbol", -1, nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS},
		{"effective", -1, nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS},
		{"receive", -1, nvml.FI_DEV_NVLINK_COUNT_RCV_ERRORS},
		{"recovery_failed", -1, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS},
	}

	// ClockEventReasons are NVML's clock event (throttle) reason bits, from
	// go-nvml's constants (nvml.h). R535 renamed ClocksThrottleReason* to
	// ClocksEventReason*; go-nvml keeps the three hardware ones under the
	// old name only. Every bit of nvml.ClocksEventReasonAll is here.
	ClockEventReasons = []struct {
		Name string
		Bit  uint64
	}{
		{"gpu_idle", nvml.ClocksEventReasonGpuIdle},
		{"applications_clocks_setting", nvml.ClocksEventReasonApplicationsClocksSetting},
		{"sw_power_cap", nvml.ClocksEventReasonSwPowerCap},
		{"hw_slowdown", nvml.ClocksThrottleReasonHwSlowdown},
		{"sync_boost", nvml.ClocksEventReasonSyncBoost},
		{"sw_thermal_slowdown", nvml.ClocksEventReasonSwThermalSlowdown},
		{"hw_thermal_slowdown", nvml.ClocksThrottleReasonHwThermalSlowdown},
		{"hw_power_brake_slowdown", nvml.ClocksThrottleReasonHwPowerBrakeSlowdown},
		{"display_clock_setting", nvml.ClocksEventReasonDisplayClockSetting},
		{"board_limit", nvml.ClocksEventReasonBoardLimit},
		{"reliability", nvml.ClocksEventReasonReliability},
	}

	// RecoveryActions are NVML's recovery actions
	// (nvmlDeviceGpuRecoveryAction_t), from go-nvml's constants, for the
	// metric's documentation; the code itself is exported, a newer one too.
	RecoveryActions = []struct {
		Name  string
		Value nvml.DeviceGpuRecoveryAction
	}{
		{"none", nvml.GPU_RECOVERY_ACTION_NONE},
		{"gpu_reset", nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"node_reboot", nvml.GPU_RECOVERY_ACTION_NODE_REBOOT},
		{"drain_p2p", nvml.GPU_RECOVERY_ACTION_DRAIN_P2P},
		{"drain_and_reset", nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET},
		{"recover_imex_domain", nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN},
		{"bus_reset", nvml.GPU_RECOVERY_ACTION_BUS_RESET},
		{"system_reboot", nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT},
	}
)

// readHealth reads the board's health; slow-moving counters (NVLink errors)
// only when full is set, otherwise they are carried from prev.
func readHealth(d Device, p probes, h *Health, prev *Health, full bool, seen map[nvlinkKey]uint64, ok func(nvml.Return) bool) {
	for e := 0; e < 2; e++ {
		for sc := 0; sc < 2; sc++ {
			if v, ret := d.GetTotalEccErrors(nvml.MemoryErrorType(e), nvml.EccCounterType(sc)); ok(ret) {
				h.ECC[e][sc] = some(v)
			}
		}
	}
	for c := 0; c < 2; c++ {
		if pages, ret := d.GetRetiredPages(nvml.PageRetirementCause(c)); ok(ret) {
			h.RetiredPages[c] = some(len(pages))
		}
	}
	if p, ret := d.GetRetiredPagesPendingStatus(); ok(ret) {
		h.RetiredPending = some(p == nvml.FEATURE_ENABLED)
	}
	if corr, unc, pending, failed, ret := d.GetRemappedRows(); ok(ret) {
		h.RemapCorr, h.RemapUncorr, h.RemapPending, h.RemapFailed = some(corr), some(unc), some(pending), some(failed)
	}
	if r, ret := clockReasons(d, p); ok(ret) {
		h.ClockReasons = some(r)
	}
	if n, ret := d.GetPcieReplayCounter(); ok(ret) {
		h.PCIeReplay = some(n)
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := d.GetFieldValues(fv); ok(ret) && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		h.RecoveryAction = some(int(binary.LittleEndian.Uint32(fv[0].Value[:4])))
	}
	carry := func() {
		if prev != nil {
			h.NVLinkErrors, h.NVLinkErrorSeen, h.HasNVLink, h.NVLinkActive, h.NUMANode = prev.NVLinkErrors, prev.NVLinkErrorSeen, prev.HasNVLink, prev.NVLinkActive, prev.NUMANode
		}
	}
	if !full {
		carry()
		return
	}
	if !p.numaNodeID { //nolint:revive // empty-block: the comment is why nothing is read
		// R470-R545 lack nvmlDeviceGetNumaNodeId: calling it would kill
		// the process. The sampler reads sysfs first anyway.
	} else if n, ret := d.GetNumaNodeId(); ok(ret) {
		h.NUMANode = some(n)
	} else if prev != nil {
		h.NUMANode = prev.NUMANode
	}
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		st, ret := d.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if link == 0 && !unsupported(ret) && ret != nvml.ERROR_INVALID_ARGUMENT {
				carry() // a failed read says nothing about the links
				return
			}
			break // no NVLink, or past the last link
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		h.NVLinkActive++
		perLink := false
		for t, et := range NVLinkErrorTypes {
			if et.Counter < 0 {
				continue
			}
			if v, ret := d.GetNvLinkErrorCounter(link, et.Counter); ok(ret) {
				seen[nvlinkKey{link, t}] = v
				perLink = true
			}
		}
		if !perLink {
			readNVLink5Errors(d, link, seen, ok)
		}
	}
	for k, v := range seen {
		h.NVLinkErrors[k.typ] += v
		h.NVLinkErrorSeen[k.typ] = true
		h.HasNVLink = true
	}
}

// clockReasons reads the clock event reasons under the name the driver
// exports: R535 renamed nvmlDeviceGetCurrentClocksThrottleReasons, which
// older drivers have alone (same bits).
func clockReasons(d Device, p probes) (uint64, nvml.Return) {
	if p.clocksEventReasons {
		return d.GetCurrentClocksEventReasons()
	}
	return d.GetCurrentClocksThrottleReasons()
}

// readNVLink5Errors reads one link's error counts from NVLink5's field
// values: Blackwell answers NOT_SUPPORTED to the per-link counters.
func readNVLink5Errors(d Device, link int, seen map[nvlinkKey]uint64, ok func(nvml.Return) bool) {
	var fv []nvml.FieldValue
	var types []int
	for t, et := range NVLinkErrorTypes {
		if et.Field != 0 {
			fv = append(fv, nvml.FieldValue{FieldId: et.Field, ScopeId: uint32(link)})
			types = append(types, t)
		}
	}
	if !ok(d.GetFieldValues(fv)) {
		return
	}
	for i, v := range fv {
		if nvml.Return(v.NvmlReturn) == nvml.SUCCESS {
			seen[nvlinkKey{link, types[i]}] = binary.LittleEndian.Uint64(v.Value[:])
		}
	}
}
