package nvmlsampler

// Every NVML C function the exporter calls, in one place: the fake
// libnvidia-ml in sim/fakenvml must serve each of them, and each function newer
// than R470, or marked DEPRECATED in the newest nvml.h (a later driver may
// drop it), is called only after its symbol was found in the loaded library.
//
// go-nvml binds lazily: calling a function that the installed driver lacks
// does not return an error, the dynamic linker kills the process with
// "symbol lookup error" (exit 127). So the sampler asks the library
// (Extensions().LookupSymbol, as go-nvlib does) once at start and falls back
// to the older call, or leaves the metric out.
//
// Since is the first driver branch whose nvml.h declares the function, read
// from NVIDIA's headers as go-nvml's history carries them
// (github.com/NVIDIA/go-nvml, gen/nvml/nvml.h and pkg/nvml/nvml.h at the
// commits "Update nvml.h to v11.4" (R470), "... NVML 11.6" (R510),
// "Bump to NVML version 12.2" (R535), "12.4" (R550), "12.8" (R570) and
// "Bump nvml.h to 13.0.39" (R580)). CUDA 11.4 ships with R470, 11.6 with
// R510, 12.2 with R535, 12.4 with R550, 12.8 with R570, 13.0 with R580.

// Branch is an NVIDIA driver branch.
type Branch int

// The driver branches the exporter supports, and the ones that introduced
// functions it calls.
const (
	R470 Branch = 470 // CUDA 11.4, NVML 11.4: the oldest supported
	R510 Branch = 510 // CUDA 11.6: memory v2, profile info with names
	R535 Branch = 535 // CUDA 12.2: ClocksEventReasons replaces ClocksThrottleReasons
	R550 Branch = 550 // CUDA 12.4: nvmlDeviceGetNumaNodeId
	R570 Branch = 570 // CUDA 12.8: recovery action and NVLink5 COUNT_* fields
	R580 Branch = 580 // CUDA 13.0
)

// Symbol is one NVML C function the exporter calls.
type Symbol struct {
	Name  string
	Since Branch
	// Fallback is the older function used where Name is missing, if any.
	Fallback string
	// Deprecated is the first branch whose nvml.h marks the function
	// DEPRECATED: a later driver may drop it, so it too is called only
	// after its symbol was found.
	Deprecated Branch
}

// The functions that are newer than R470, or deprecated, and therefore
// probed.
const (
	symClocksEventReasons    = "nvmlDeviceGetCurrentClocksEventReasons"
	symClocksThrottleReasons = "nvmlDeviceGetCurrentClocksThrottleReasons"
	symMemoryInfoV2          = "nvmlDeviceGetMemoryInfo_v2"
	symNumaNodeID            = "nvmlDeviceGetNumaNodeId"
	symGPUInstanceProfileV   = "nvmlDeviceGetGpuInstanceProfileInfoV"
	symTemperature           = "nvmlDeviceGetTemperature"
	symTemperatureV          = "nvmlDeviceGetTemperatureV"
)

// Symbols lists every NVML function the exporter calls (the NVML sampler
// here, and the XID event reader in collector/xid through go-nvml), with
// the branch that added it. go-nvml itself looks up the versioned names it
// prefers (nvmlDeviceGetPciInfo_v3, ..._v2) before using them.
var Symbols = []Symbol{
	// Library and system.
	{Name: "nvmlInit_v2", Since: R470},
	{Name: "nvmlShutdown", Since: R470},
	{Name: "nvmlSystemGetDriverVersion", Since: R470},
	{Name: "nvmlSystemGetCudaDriverVersion", Since: R470},
	{Name: "nvmlSystemGetNVMLVersion", Since: R470},
	{Name: "nvmlDeviceGetCount_v2", Since: R470},
	{Name: "nvmlDeviceGetHandleByIndex_v2", Since: R470},
	// Identity.
	{Name: "nvmlDeviceGetUUID", Since: R470},
	{Name: "nvmlDeviceGetName", Since: R470},
	{Name: "nvmlDeviceGetIndex", Since: R470},
	{Name: "nvmlDeviceGetMinorNumber", Since: R470},
	{Name: "nvmlDeviceGetPciInfo_v3", Since: R470},
	// Telemetry.
	{Name: "nvmlDeviceGetMemoryInfo", Since: R470},
	{Name: symMemoryInfoV2, Since: R510, Fallback: "nvmlDeviceGetMemoryInfo"},
	{Name: "nvmlDeviceGetUtilizationRates", Since: R470},
	{Name: symTemperature, Since: R470, Deprecated: R580},
	{Name: symTemperatureV, Since: R570, Fallback: symTemperature},
	{Name: "nvmlDeviceGetTemperatureThreshold", Since: R470},
	{Name: "nvmlDeviceGetPowerUsage", Since: R470},
	{Name: "nvmlDeviceGetPowerManagementLimit", Since: R470},
	{Name: "nvmlDeviceGetTotalEnergyConsumption", Since: R470},
	{Name: "nvmlDeviceGetClockInfo", Since: R470},
	{Name: "nvmlDeviceGetCurrPcieLinkGeneration", Since: R470},
	{Name: "nvmlDeviceGetCurrPcieLinkWidth", Since: R470},
	// Health.
	{Name: "nvmlDeviceGetTotalEccErrors", Since: R470},
	{Name: "nvmlDeviceGetRetiredPages", Since: R470},
	{Name: "nvmlDeviceGetRetiredPagesPendingStatus", Since: R470},
	{Name: "nvmlDeviceGetRemappedRows", Since: R470},
	{Name: "nvmlDeviceGetRowRemapperHistogram", Since: R470},
	{Name: symClocksThrottleReasons, Since: R470, Deprecated: R580},
	{Name: symClocksEventReasons, Since: R535, Fallback: symClocksThrottleReasons},
	{Name: "nvmlDeviceGetPcieReplayCounter", Since: R470},
	{Name: "nvmlDeviceGetNvLinkState", Since: R470},
	{Name: "nvmlDeviceGetNvLinkErrorCounter", Since: R470},
	// Field values: the recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
	// is an R570 field; older drivers answer it per field with an error.
	{Name: "nvmlDeviceGetFieldValues", Since: R470},
	// NUMA: read from sysfs first; NVML answers only where GPUs are NUMA nodes.
	{Name: symNumaNodeID, Since: R550},
	// MIG.
	{Name: "nvmlDeviceGetMigMode", Since: R470},
	{Name: "nvmlDeviceGetMaxMigDeviceCount", Since: R470},
	{Name: "nvmlDeviceGetMigDeviceHandleByIndex", Since: R470},
	{Name: "nvmlDeviceGetGpuInstanceId", Since: R470},
	{Name: "nvmlDeviceGetComputeInstanceId", Since: R470},
	{Name: "nvmlDeviceGetAttributes_v2", Since: R470},
	{Name: "nvmlDeviceGetGpuInstanceProfileInfo", Since: R470},
	{Name: symGPUInstanceProfileV, Since: R510, Fallback: "nvmlDeviceGetGpuInstanceProfileInfo"},
	{Name: "nvmlDeviceGetGpuInstancePossiblePlacements_v2", Since: R470},
	{Name: "nvmlDeviceGetGpuInstances", Since: R470},
	{Name: "nvmlGpuInstanceGetInfo", Since: R470},
	// Media engines (group media).
	{Name: "nvmlDeviceGetEncoderUtilization", Since: R470},
	{Name: "nvmlDeviceGetDecoderUtilization", Since: R470},
	// Process accounting of shared GPUs (processes.go). go-nvml looks up
	// the _v3 lists (R510+) itself and falls back to _v2.
	{Name: "nvmlDeviceGetComputeRunningProcesses_v2", Since: R470},
	{Name: "nvmlDeviceGetComputeRunningProcesses_v3", Since: R510, Fallback: "nvmlDeviceGetComputeRunningProcesses_v2"},
	{Name: "nvmlDeviceGetMPSComputeRunningProcesses_v2", Since: R470},
	{Name: "nvmlDeviceGetMPSComputeRunningProcesses_v3", Since: R510, Fallback: "nvmlDeviceGetMPSComputeRunningProcesses_v2"},
	{Name: "nvmlDeviceGetGraphicsRunningProcesses_v2", Since: R470},
	{Name: "nvmlDeviceGetGraphicsRunningProcesses_v3", Since: R510, Fallback: "nvmlDeviceGetGraphicsRunningProcesses_v2"},
	{Name: "nvmlDeviceGetProcessUtilization", Since: R470},
	// XID and ECC events (collector/xid).
	{Name: "nvmlEventSetCreate", Since: R470},
	{Name: "nvmlDeviceGetSupportedEventTypes", Since: R470},
	{Name: "nvmlDeviceRegisterEvents", Since: R470},
	{Name: "nvmlEventSetWait_v2", Since: R470},
	{Name: "nvmlEventSetFree", Since: R470},
}

// probes are the answers for the functions newer than R470 or deprecated,
// asked once at start: a driver does not grow or lose symbols while it is
// loaded.
type probes struct {
	clocksEventReasons    bool
	clocksThrottleReasons bool
	memoryInfoV2          bool
	numaNodeID            bool
	profileInfoV          bool
	temperature           bool
	temperatureV          bool
}

func probe(lib NVML) probes {
	has := func(name string) bool { return lib.LookupSymbol(name) == nil }
	return probes{
		clocksEventReasons:    has(symClocksEventReasons),
		clocksThrottleReasons: has(symClocksThrottleReasons),
		memoryInfoV2:          has(symMemoryInfoV2),
		numaNodeID:            has(symNumaNodeID),
		profileInfoV:          has(symGPUInstanceProfileV),
		temperature:           has(symTemperature),
		temperatureV:          has(symTemperatureV),
	}
}
