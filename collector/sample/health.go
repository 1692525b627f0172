package sample

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// Opt is a value the driver may not have given.
type Opt[T any] struct {
	V  T
	OK bool
}

// Some is a value that was read.
func Some[T any](v T) Opt[T] { return Opt[T]{V: v, OK: true} }

// Health is a GPU's board-level health in one sample. Fields the driver does
// not support on the device are left unset and not exported.
type Health struct {
	ECC            [2][2]Opt[uint64] // [corrected, uncorrected][volatile, aggregate]
	RetiredPages   [2]Opt[int]       // [single bit, double bit]
	RetiredPending Opt[bool]
	RemapCorr      Opt[int]
	RemapUncorr    Opt[int]
	RemapPending   Opt[bool]
	RemapFailed    Opt[bool]
	// RemapBanks is the row remapper's histogram: how many memory banks
	// have each level of spare rows left (RemapAvailabilityNames order:
	// max, high, partial, low, none). Ampere and later.
	RemapBanks Opt[[NumRemapAvailability]int]
	// ClockReasons is NVML's clock event reasons bit mask (nvml.h); the
	// bits are named in ClockEventReasons.
	ClockReasons Opt[uint64]
	PCIeReplay   Opt[int]
	// NVLinkErrors sums each error type (NVLinkErrorNames) over every link
	// ever seen up, with a link's last value kept while it is down: a link
	// going down must not make the counter fall. NVLinkErrorSeen says which
	// types the GPU reports.
	NVLinkErrors    [NumNVLinkErrorTypes]uint64
	NVLinkErrorSeen [NumNVLinkErrorTypes]bool
	HasNVLink       bool
	// RecoveryAction is NVML's nvmlDeviceGpuRecoveryAction_t, named in
	// RecoveryActions.
	RecoveryAction Opt[int]
	NUMANode       Opt[int]
	// NVLinkActive is the number of NVLinks up; unset where the GPU's
	// NVLink calls answer NOT_SUPPORTED (no NVLink), so that "no NVLink"
	// is not read as "every link down".
	NVLinkActive Opt[int]
}

// NumRemapAvailability is the number of levels of the row remapper's
// histogram.
const NumRemapAvailability = 5

// RemapAvailabilityNames name Health.RemapBanks' entries, from most spare
// rows left to none (nvmlRowRemapperHistogramValues_t).
var RemapAvailabilityNames = [NumRemapAvailability]string{"max", "high", "partial", "low", "none"}

// NumNVLinkErrorTypes is the number of NVLink error counts kept per GPU.
const NumNVLinkErrorTypes = 8

// NVLinkErrorNames name Health.NVLinkErrors' entries (the metric's type
// label): the data-link counters of Ampere and Hopper, then NVLink5's.
var NVLinkErrorNames = [NumNVLinkErrorTypes]string{
	"replay", "recovery", "crc_flit", "crc_data",
	"symbol", "effective", "receive", "recovery_failed",
}

var (
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
