package nvmlsampler

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// NVML is the part of the NVML library the exporter uses. The real library is
// adapted by NewNVML; the simulated node implements it directly.
type NVML interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	SystemGetNVMLVersion() (string, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(index int) (Device, nvml.Return)
	// LookupSymbol says whether the loaded library exports a C function;
	// see symbols.go for why every function newer than R470 is probed.
	SymbolLookup
}

// SymbolLookup answers whether the loaded library exports a function:
// go-nvml's Extensions().LookupSymbol on the real library, the scenario's
// driver branch on the simulated node.
type SymbolLookup interface {
	LookupSymbol(name string) error
}

// Device is the part of an NVML device handle the exporter uses. A MIG device
// handle is a Device too.
type Device interface {
	GetUUID() (string, nvml.Return)
	GetName() (string, nvml.Return)
	GetIndex() (int, nvml.Return)
	GetMinorNumber() (int, nvml.Return)
	GetPciInfo() (nvml.PciInfo, nvml.Return)
	GetMigMode() (int, int, nvml.Return)
	GetMaxMigDeviceCount() (int, nvml.Return)
	GetMigDeviceHandleByIndex(index int) (Device, nvml.Return)
	GetGpuInstanceId() (int, nvml.Return)
	GetComputeInstanceId() (int, nvml.Return)
	GetAttributes() (nvml.DeviceAttributes, nvml.Return)
	GetMemoryInfo() (nvml.Memory, nvml.Return)
	GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) // R510+: probe first
	GetUtilizationRates() (nvml.Utilization, nvml.Return)
	GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) // every branch; deprecated in 13.0: probe first
	// GetTemperatureV1 is nvmlDeviceGetTemperatureV with a v1 struct, for
	// the GPU's sensor (R570+: probe first).
	GetTemperatureV1() (nvml.Temperature, nvml.Return)
	GetPowerUsage() (uint32, nvml.Return)
	GetTotalEnergyConsumption() (uint64, nvml.Return)
	GetClockInfo(nvml.ClockType) (uint32, nvml.Return)
	GetCurrPcieLinkGeneration() (int, nvml.Return)
	GetCurrPcieLinkWidth() (int, nvml.Return)
	GetEncoderUtilization() (uint32, uint32, nvml.Return) // utilisation %, sampling period µs
	GetDecoderUtilization() (uint32, uint32, nvml.Return)
	HealthDevice
	ProcessDevice
	// MIG layout, for fragmentation.
	GetGpuInstanceProfileInfo(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return)
	// GetGpuInstanceProfileInfoV2 is nvmlDeviceGetGpuInstanceProfileInfoV
	// with a v2 struct, which carries the profile's name (R510+: probe first).
	GetGpuInstanceProfileInfoV2(profile int) (nvml.GpuInstanceProfileInfo_v2, nvml.Return)
	GetGpuInstancePossiblePlacements(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return)
	GetGpuInstances(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return)
}

// HealthDevice is what the health reader needs beyond Device. It is part
// of Device; split out to keep the list readable.
type HealthDevice interface {
	GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return)
	GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return)
	GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return)
	GetRemappedRows() (int, int, bool, bool, nvml.Return)
	GetRowRemapperHistogram() (nvml.RowRemapperHistogramValues, nvml.Return)
	GetCurrentClocksEventReasons() (uint64, nvml.Return)    // R535+: probe first
	GetCurrentClocksThrottleReasons() (uint64, nvml.Return) // every branch; renamed in R535, deprecated in 13.0: probe first
	GetPcieReplayCounter() (int, nvml.Return)
	GetNvLinkState(link int) (nvml.EnableState, nvml.Return)
	GetNvLinkErrorCounter(link int, counter nvml.NvLinkErrorCounter) (uint64, nvml.Return)
	GetPowerManagementLimit() (uint32, nvml.Return)
	GetTemperatureThreshold(nvml.TemperatureThresholds) (uint32, nvml.Return)
	GetFieldValues([]nvml.FieldValue) nvml.Return
	GetNumaNodeId() (int, nvml.Return) // R550+: probe first
}

// ErrNoNVML is returned when libnvidia-ml.so.1 cannot be loaded.
var ErrNoNVML = errors.New("cannot load libnvidia-ml.so.1 (NVIDIA's NVML library): " +
	"install the NVIDIA driver, or point LD_LIBRARY_PATH at the directory that holds it " +
	"(on GKE the driver is mounted at /usr/local/nvidia/lib64), " +
	"or run gpu-pool-exporter-sim to try the exporter on a simulated GPU node")

// NewNVML loads the real NVML library. libraryPath may be empty to use the
// dynamic loader's search path.
func NewNVML(libraryPath string) (NVML, error) {
	var opts []nvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libraryPath))
	}
	// Only load the library here: nvmlInit runs once, in the background
	// (the sampler's life cycle). An Init, Shutdown, Init at start costs
	// two driver round trips and, without persistence mode, tears every
	// GPU down and brings it up again.
	if err := loadable(libraryPath); err != nil {
		return nil, err
	}
	return &realNVML{lib: nvml.New(opts...)}, nil
}

// loadable opens and closes the library with the dynamic loader, as
// go-nvml will, without calling into it.
func loadable(path string) error {
	if path == "" {
		path = "libnvidia-ml.so.1"
	}
	lib := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return fmt.Errorf("%w: %v", ErrNoNVML, err)
	}
	return lib.Close()
}

type realNVML struct{ lib nvml.Interface }

func (r *realNVML) Init() nvml.Return     { return r.lib.Init() }
func (r *realNVML) Shutdown() nvml.Return { return r.lib.Shutdown() }
func (r *realNVML) SystemGetDriverVersion() (string, nvml.Return) {
	return r.lib.SystemGetDriverVersion()
}
func (r *realNVML) SystemGetNVMLVersion() (string, nvml.Return) { return r.lib.SystemGetNVMLVersion() }
func (r *realNVML) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return r.lib.SystemGetCudaDriverVersion()
}
func (r *realNVML) DeviceGetCount() (int, nvml.Return) { return r.lib.DeviceGetCount() }

// LookupSymbol asks the dynamic loader, through go-nvml, whether the
// driver's library exports name. Valid only between Init and Shutdown.
func (r *realNVML) LookupSymbol(name string) error { return r.lib.Extensions().LookupSymbol(name) }
func (r *realNVML) DeviceGetHandleByIndex(i int) (Device, nvml.Return) {
	d, ret := r.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return realDevice{d}, ret
}

// realDevice adapts nvml.Device; only the methods returning handles differ.
type realDevice struct{ nvml.Device }

func (d realDevice) GetMigDeviceHandleByIndex(i int) (Device, nvml.Return) {
	m, ret := d.Device.GetMigDeviceHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return realDevice{m}, ret
}

// GetTemperatureV1 asks for the GPU sensor's temperature (go-nvml's v1
// struct leaves the sensor type 0, NVML_TEMPERATURE_GPU).
func (d realDevice) GetTemperatureV1() (nvml.Temperature, nvml.Return) {
	return d.Device.GetTemperatureV().V1()
}

// GetGpuInstanceProfileInfoV2 asks for the v2 profile info, with its name.
func (d realDevice) GetGpuInstanceProfileInfoV2(profile int) (nvml.GpuInstanceProfileInfo_v2, nvml.Return) {
	return d.Device.GetGpuInstanceProfileInfoV(profile).V2()
}

// unsupported reports whether NVML says a field does not exist on a device:
// such a field is skipped, never an error.
func unsupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// validUTF8 keeps a label value that a driver bug or a corrupt answer made
// invalid from panicking the metrics registry.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// XIDSource returns the NVML event source behind lib: the real library's
// event set, or whatever a simulated library provides.
func XIDSource(lib NVML) (xid.EventSource, bool) {
	switch l := lib.(type) {
	case *realNVML:
		return xid.NewNVMLEventSource(l.lib, nil), true
	case interface{ XIDSource() xid.EventSource }:
		return l.XIDSource(), true
	}
	return nil, false
}
