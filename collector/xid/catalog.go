// Package xid turns NVIDIA Xid errors into a true per-device counter.
//
// It has four parts:
//
//   - catalog.go: NVIDIA's Xid catalog, condensed into data: for each code a
//     short description, a category and the catalog's recommended immediate
//     action, as label-friendly words, so alerts can route by action rather
//     than by memorised numbers.
//   - counter.go: a concurrency-safe counter of Xid events per (GPU, code)
//     that never decreases while the process lives, with de-duplication of the
//     same event reported by two sources (the NVML event set and DCGM's last
//     Xid field).
//   - instances.go: the Xid counts of MIG devices, kept by the device's
//     UUID (an InstanceResolver names the device behind an event's GPU and
//     compute instance IDs, which the driver hands on to the next instance
//     created in their place).
//   - events.go: an NVML event reader that runs in its own goroutine over a
//     narrow EventSource interface (the real go-nvml one is
//     NewNVMLEventSource), re-creating the event set with backoff when it
//     fails, and counting Xid and ECC events.
//
// The exported metric (rendered elsewhere) is
// gpu_xid_errors_total{gpu,uuid,xid,category,action}.
package xid

import (
	"sort"
	"strconv"
)

// Categories: where an Xid most likely comes from. Every Entry has exactly one.
const (
	// CategoryApplication: raised by, or confined to, the workload (bad
	// memory access, corrupt push buffer, channel killed after an app
	// fault). The GPU itself is fine; look at the application first.
	CategoryApplication = "application"
	// CategoryMemory: GPU memory (HBM/GDDR) ECC errors, row remapping and
	// page retirement.
	CategoryMemory = "memory"
	// CategoryHardware: the device itself: PCIe (fell off the bus), init
	// failure, fixed-function engine (copy, video, JPEG, optical flow) faults
	// that the catalog sends to support when they persist.
	CategoryHardware = "hardware"
	// CategoryFirmware: the driver and the GPU's microcontrollers (GSP, PMU,
	// FECS, SEC2): firmware errors, driver-side timeouts.
	CategoryFirmware = "firmware"
	// CategoryNVLink: NVLink, NVLink-C2C and fabric link errors.
	CategoryNVLink = "nvlink"
	// CategoryRecovery: the driver's note that the device's recovery action
	// changed (Xid 154); the action itself is read from NVML.
	CategoryRecovery = "recovery"
	// CategoryThermal: power or cooling conditions that cut clocks.
	CategoryThermal = "thermal"
	// CategoryUnknown: a code this catalog does not list (including 999,
	// NVML's "unknown Xid").
	CategoryUnknown = "unknown"
)

// Actions: the catalog's recommended immediate action ("Resolution Bucket
// (Immediate Action)"), as a label value.
const (
	// ActionNone: nothing to do now (the catalog's IGNORE); keep watching
	// the rate.
	ActionNone = "none"
	// ActionRestartApp: restart the application; the GPU stays usable.
	ActionRestartApp = "restart_app"
	// ActionResetGPU: drain the GPU and reset it (nvidia-smi -r, or reboot
	// where a reset is not possible).
	ActionResetGPU = "reset_gpu"
	// ActionRebootNode: reboot the node (the catalog's RESTART_BM: a
	// bare-metal/baseboard restart); a GPU reset is not enough.
	ActionRebootNode = "reboot_node"
	// ActionContactSupport: no fix on site; collect nvidia-bug-report and
	// open a case.
	ActionContactSupport = "contact_support"
	// ActionCheckNVLink: follow NVIDIA's NVLink error workflow: the action
	// depends on decoded link error registers (often none, sometimes a GPU
	// reset); watch the NVLink error counters and the recovery action.
	ActionCheckNVLink = "check_nvlink"
	// ActionCheckRecoveryAction: read the device's recovery action from NVML
	// (exported as gpu_recovery_action: none, GPU reset, node reboot, drain
	// P2P, drain and reset) and do that.
	ActionCheckRecoveryAction = "check_recovery_action"
	// ActionCheckMechanicals: check power cables, seating and cooling.
	ActionCheckMechanicals = "check_mechanicals"
	// ActionUpdateSoftware: update the driver, vGPU software or firmware
	// (the catalog's UPDATE_SWFW).
	ActionUpdateSoftware = "update_sw_fw"
	// ActionRestartVM: restart the virtual machine (confidential computing).
	ActionRestartVM = "restart_vm"
	// ActionCheckLogs: the code is not in this catalog; read the kernel log
	// (dmesg, "NVRM: Xid") and NVIDIA's current catalog.
	ActionCheckLogs = "check_logs"
)

// Entry is one Xid code in the catalog.
type Entry struct {
	Code     int
	Name     string // short description
	Category string // one of the Category* constants
	Action   string // one of the Action* constants
}

// catalog holds the known codes. Sources: NVIDIA's Xid catalog for Ampere and
// newer GPUs (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with
// the Xid Catalog"), overridden where the project's DESIGN.md says otherwise:
// 43 and 45 are application faults with action restart_app there (the catalog
// says IGNORE for 43 and a correlation workflow for 45). Where the catalog's
// immediate action is a workflow rather than a single step, the entry carries
// the workflow's common outcome: 48 (solo) -> reset_gpu; 74 and 144-150 ->
// check_nvlink; 154 -> check_recovery_action. The catalog's mnemonic is in the
// comment on each line.
var catalog = map[int]Entry{}

func add(code int, name, category, action string) {
	catalog[code] = Entry{Code: code, Name: name, Category: category, Action: action}
}

func init() {
	const (
		app  = CategoryApplication
		mem  = CategoryMemory
		hw   = CategoryHardware
		fw   = CategoryFirmware
		link = CategoryNVLink
	)

	// Application faults.
	add(8, "GPU stopped processing (channel idle timeout)", app, ActionRestartApp)              // ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT
	add(11, "Invalid or corrupted push buffer stream", app, ActionRestartApp)                   // ROBUST_CHANNEL_GR_ERROR_MISSING_HW
	add(13, "Graphics engine exception", app, ActionRestartApp)                                 // ROBUST_CHANNEL_GR_EXCEPTION
	add(25, "Illegal graphics engine notify", app, ActionRestartApp)                            // ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY
	add(31, "GPU memory page fault (MMU error)", app, ActionRestartApp)                         // ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT
	add(32, "Invalid or corrupted push buffer stream (PBDMA error)", app, ActionRestartApp)     // ROBUST_CHANNEL_PBDMA_ERROR
	add(37, "Unimplemented firmware method called", app, ActionNone)                            // ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD
	add(43, "GPU stopped processing (reset channel verification error)", app, ActionRestartApp) // ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR
	add(45, "Preemptive cleanup after previous errors", app, ActionRestartApp)                  // ROBUST_CHANNEL_PREEMPTIVE_REMOVAL
	add(69, "Graphics engine class error", app, ActionRestartApp)                               // ROBUST_CHANNEL_GR_CLASS_ERROR
	add(80, "Push buffer CRC mismatch", app, ActionRestartApp)                                  // PBDMA_PUSHBUFFER_CRC_MISMATCH

	// Memory.
	add(48, "Double-bit (uncorrectable) ECC error", mem, ActionResetGPU)              // ROBUST_CHANNEL_GPU_ECC_DBE
	add(63, "Row remapping or page retirement recorded", mem, ActionNone)             // INFOROM_DRAM_RETIREMENT_EVENT
	add(64, "Row remapping or page retirement failed", mem, ActionResetGPU)           // INFOROM_DRAM_RETIREMENT_FAILURE
	add(92, "High single-bit ECC error rate", mem, ActionNone)                        // EXCESSIVE_SBE_INTERRUPTS
	add(94, "Contained ECC error (one application affected)", mem, ActionRestartApp)  // ROBUST_CHANNEL_CONTAINED_ERROR
	add(95, "Uncontained ECC error (all applications affected)", mem, ActionResetGPU) // ROBUST_CHANNEL_UNCONTAINED_ERROR
	add(140, "Unrecovered ECC error", mem, ActionResetGPU)                            // UNRECOVERABLE_ECC_ERROR_ESCAPE
	add(156, "Resource retirement event", mem, ActionResetGPU)                        // RESOURCE_RETIREMENT_EVENT

	// Hardware: PCIe, init, fixed-function engines.
	add(79, "GPU has fallen off the bus", hw, ActionRebootNode)     // ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
	add(143, "GPU initialization failure", hw, ActionResetGPU)      // GPU_INIT_ERROR
	add(158, "GPU fatal timeout", hw, ActionResetGPU)               // GPU_FATAL_TIMEOUT
	add(142, "Video encoder 3 exception", hw, ActionContactSupport) // ROBUST_CHANNEL_NVENC3_ERROR
	// Copy engines CE0-CE19 (ROBUST_CHANNEL_CEn_ERROR).
	for i, code := range []int{39, 40, 41, 70, 71, 72, 75, 76, 77, 85, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135} {
		add(code, "Copy engine "+strconv.Itoa(i)+" exception", hw, ActionRestartApp)
	}
	// Video decoders NVDEC0-NVDEC7 (ROBUST_CHANNEL_NVDECn_ERROR).
	for i, code := range []int{68, 83, 84, 88, 89, 96, 97, 98} {
		add(code, "Video decoder "+strconv.Itoa(i)+" exception", hw, ActionRestartApp)
	}
	// JPEG decoders NVJPG0-NVJPG7 (ROBUST_CHANNEL_NVJPGn_ERROR).
	for i, code := range []int{82, 99, 100, 101, 102, 103, 104, 105} {
		add(code, "JPEG decoder "+strconv.Itoa(i)+" exception", hw, ActionRestartApp)
	}
	// Optical flow accelerators OFA0-OFA1 (ROBUST_CHANNEL_OFAn_ERROR).
	for i, code := range []int{86, 139} {
		add(code, "Optical flow accelerator "+strconv.Itoa(i)+" exception", hw, ActionRestartApp)
	}

	// Firmware and driver.
	add(38, "Driver firmware error (FECS watchdog timeout)", fw, ActionNone)       // ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT
	add(44, "Graphics engine fault during context switch", fw, ActionNone)         // ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW
	add(46, "GPU stopped processing (GPU timeout)", fw, ActionResetGPU)            // ROBUST_CHANNEL_GPU_TIMEOUT_ERROR
	add(60, "Security engine (SEC2) exception", fw, ActionRestartApp)              // ROBUST_CHANNEL_SEC2_ERROR
	add(61, "Internal microcontroller breakpoint (PMU)", fw, ActionContactSupport) // PMU_BREAKPOINT
	add(62, "Internal microcontroller halt (PMU)", fw, ActionResetGPU)             // PMU_HALT_ERROR
	add(66, "Firmware register access violation (FECS)", fw, ActionNone)           // ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION
	add(67, "Firmware verification violation (FECS)", fw, ActionNone)              // ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION
	add(78, "vGPU start error", fw, ActionUpdateSoftware)                          // VGPU_START_ERROR
	add(93, "InfoROM erase limit exceeded", fw, ActionNone)                        // INFOROM_ERASE_LIMIT_EXCEEDED
	add(109, "Context switch timeout", fw, ActionResetGPU)                         // ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR
	add(110, "Security fault", fw, ActionResetGPU)                                 // SEC_FAULT_ERROR
	add(119, "GSP RPC timeout", fw, ActionResetGPU)                                // GSP_RPC_TIMEOUT
	add(120, "GSP firmware error", fw, ActionResetGPU)                             // GSP_ERROR
	add(151, "Key rotation error (confidential computing)", fw, ActionRestartVM)   // ROBUST_CHANNEL_KEY_ROTATION_ERROR

	// NVLink.
	add(74, "NVLink error", link, ActionCheckNVLink)                     // NVLINK_ERROR
	add(108, "NVLink remote translation error", link, ActionNone)        // NVLINK_REMOTE_TRANSLATION_ERROR
	add(121, "NVLink-C2C error", link, ActionNone)                       // C2C_ERROR
	add(136, "NVLink link training (ALI) failure", link, ActionResetGPU) // ALI_TRAINING_FAIL
	add(137, "NVLink privileged register error", link, ActionNone)       // NVLINK_PRIV_ERR
	add(144, "NVLink SAW error", link, ActionCheckNVLink)                // NVLINK_SAW_ERROR
	add(145, "NVLink RLW error", link, ActionCheckNVLink)                // NVLINK_RLW_ERROR
	add(146, "NVLink TLW error", link, ActionCheckNVLink)                // NVLINK_TLW_ERROR
	add(147, "NVLink TREX error", link, ActionCheckNVLink)               // NVLINK_TREX_ERROR
	add(148, "NVLink NVLPW control error", link, ActionCheckNVLink)      // NVLINK_NVLPW_CTRL_ERROR
	add(149, "NVLink NETIR error", link, ActionCheckNVLink)              // NVLINK_NETIR_ERROR
	add(150, "NVLink MSE error", link, ActionCheckNVLink)                // NVLINK_MSE_ERROR
	add(155, "NVLink software-defined error", link, ActionResetGPU)      // NVLINK_SW_DEFINED_ERROR

	// Thermal and power.
	add(54, "Clocks reduced for power or cooling (silent running)", CategoryThermal, ActionCheckMechanicals) // SILENT_RUNNING_PWR_REDUCED_CLOCKING

	// Recovery.
	add(154, "GPU recovery action changed", CategoryRecovery, ActionCheckRecoveryAction) // GPU_RECOVERY_ACTION_CHANGED
}

// Lookup returns the catalog entry for code. A code the catalog does not know
// (including 999, which NVML reports for an unknown Xid, and zero or negative
// codes) gets Category "unknown" and Action "check_logs"; Lookup never panics.
func Lookup(code int) Entry {
	if e, ok := catalog[code]; ok {
		return e
	}
	return Entry{Code: code, Name: "Unknown Xid", Category: CategoryUnknown, Action: ActionCheckLogs}
}

// Known returns every catalog entry, sorted by code. The slice is a copy.
func Known() []Entry {
	out := make([]Entry, 0, len(catalog))
	for _, e := range catalog {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Code < out[j].Code })
	return out
}

// Categories returns every category value, "unknown" last.
func Categories() []string {
	return []string{CategoryApplication, CategoryMemory, CategoryHardware, CategoryFirmware,
		CategoryNVLink, CategoryRecovery, CategoryThermal, CategoryUnknown}
}

// Actions returns every action value, "check_logs" (unknown code) last.
func Actions() []string {
	return []string{ActionNone, ActionRestartApp, ActionResetGPU, ActionRebootNode,
		ActionContactSupport, ActionCheckNVLink, ActionCheckRecoveryAction,
		ActionCheckMechanicals, ActionUpdateSoftware, ActionRestartVM, ActionCheckLogs}
}
