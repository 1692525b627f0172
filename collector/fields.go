package collector

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// Source says which sampler a field comes from; it decides merges when two
// samplers report the same field.
type Source string

// Sources of device fields.
const (
	SourceNVML Source = "nvml"
	SourceDCGM Source = "dcgm"
)

type fieldSpec struct {
	name      string
	help      string
	valueType prometheus.ValueType
	source    Source
}

// deviceLabels identify a device series: a whole GPU has gpu_instance="" and
// mig_profile="", a MIG instance has both set. They never change when pods
// come and go.
var deviceLabels = []string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance"}

var fieldSpecs = [sample.NumFields]fieldSpec{
	sample.FieldMemoryUsed:          {"gpu_memory_used_bytes", "Framebuffer memory in use, in bytes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryTotal:         {"gpu_memory_total_bytes", "Framebuffer memory in total, in bytes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldUtilization:         {"gpu_utilization_ratio", "Fraction of the last sample period during which one or more kernels ran on the GPU (NVML busy time, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryUtilization:   {"gpu_memory_utilization_ratio", "Fraction of the last sample period during which device memory was read or written (0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldTemperature:         {"gpu_temperature_celsius", "GPU die temperature in degrees Celsius.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPower:               {"gpu_power_watts", "Power draw of the GPU board in watts.", prometheus.GaugeValue, SourceNVML},
	sample.FieldEnergy:              {"gpu_energy_joules_total", "Energy consumed by the GPU since the driver was loaded, in joules.", prometheus.CounterValue, SourceNVML},
	sample.FieldSMClock:             {"gpu_sm_clock_hertz", "Current SM clock in hertz.", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryClock:         {"gpu_memory_clock_hertz", "Current memory clock in hertz.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPCIeLinkGeneration:  {"gpu_pcie_link_generation", "Current PCIe link generation.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPCIeLinkWidth:       {"gpu_pcie_link_width", "Current PCIe link width in lanes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPowerLimit:          {"gpu_power_limit_watts", "Power management limit of the board in watts.", prometheus.GaugeValue, SourceNVML},
	sample.FieldSlowdownTemperature: {"gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows its clocks.", prometheus.GaugeValue, SourceNVML},
	sample.FieldShutdownTemperature: {"gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down.", prometheus.GaugeValue, SourceNVML},
	sample.FieldSMActive:            {"gpu_sm_active_ratio", "Fraction of time at least one warp was active on an SM, averaged over SMs (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldSMOccupancy:         {"gpu_sm_occupancy_ratio", "Resident warps over the maximum, averaged over SMs (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldTensorActive:        {"gpu_tensor_active_ratio", "Fraction of cycles the tensor pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldDRAMActive:          {"gpu_dram_active_ratio", "Fraction of cycles device memory was being read or written (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldGraphicsActive:      {"gpu_graphics_active_ratio", "Fraction of time the graphics or compute engine was active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP64Active:          {"gpu_fp64_active_ratio", "Fraction of cycles the FP64 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP32Active:          {"gpu_fp32_active_ratio", "Fraction of cycles the FP32 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP16Active:          {"gpu_fp16_active_ratio", "Fraction of cycles the FP16 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldPCIeTxBytes:         {"gpu_pcie_transmit_bytes_total", "Bytes sent over PCIe (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldPCIeRxBytes:         {"gpu_pcie_receive_bytes_total", "Bytes received over PCIe (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldNVLinkTxBytes:       {"gpu_nvlink_transmit_bytes_total", "Bytes sent over NVLink (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldNVLinkRxBytes:       {"gpu_nvlink_receive_bytes_total", "Bytes received over NVLink (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldMemoryTemperature:   {"gpu_memory_temperature_celsius", "Memory (HBM) temperature in degrees Celsius (NVML field NVML_FI_DEV_MEMORY_TEMP; GPUs without a memory sensor have none).", prometheus.GaugeValue, SourceNVML},
	sample.FieldEncoderUtilization:  {"gpu_encoder_utilization_ratio", "Fraction of the last sample period the video encoder was busy (NVML, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldDecoderUtilization:  {"gpu_decoder_utilization_ratio", "Fraction of the last sample period the video decoder was busy (NVML, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryReserved:      {"gpu_memory_reserved_bytes", "Framebuffer memory the driver and firmware reserve, in bytes (NVML memory info v2, R510 and later); not part of gpu_memory_used_bytes there.", prometheus.GaugeValue, SourceNVML},
}

var fieldDescs = func() [sample.NumFields]*prometheus.Desc {
	var d [sample.NumFields]*prometheus.Desc
	for f, s := range fieldSpecs {
		d[f] = prometheus.NewDesc(s.name, s.help, deviceLabels, nil)
	}
	return d
}()
