package render

import (
	"strconv"

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
	group     Group
	name      string
	help      string
	valueType prometheus.ValueType
	source    Source
}

// deviceLabels identify a device series: a whole GPU has gpu_instance="" and
// mig_profile="", a MIG instance has both set. They never change when pods
// come and go.
var deviceLabels = []string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance"}

// labelValues are a device series' identity labels (deviceLabels).
func labelValues(d *sample.DeviceState) []string {
	gi, ci := "", ""
	if d.IsMIG() {
		gi, ci = strconv.Itoa(d.GPUInstance), strconv.Itoa(d.ComputeInstance)
	}
	return []string{strconv.Itoa(d.GPU), d.UUID, gi, d.MIGProfile, ci}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var fieldSpecs = [sample.NumFields]fieldSpec{
	sample.FieldMemoryUsed:          {GroupCore, "gpu_memory_used_bytes", "Framebuffer memory in use, in bytes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryTotal:         {GroupCore, "gpu_memory_total_bytes", "Framebuffer memory in total, in bytes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldUtilization:         {GroupCore, "gpu_utilization_ratio", "Fraction of the last sample period during which one or more kernels ran on the GPU (NVML busy time, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryUtilization:   {GroupMemory, "gpu_memory_utilization_ratio", "Fraction of the last sample period during which device memory was read or written (0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldTemperature:         {GroupTemperature, "gpu_temperature_celsius", "GPU die temperature in degrees Celsius.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPower:               {GroupPower, "gpu_power_watts", "Power draw of the GPU board in watts.", prometheus.GaugeValue, SourceNVML},
	sample.FieldEnergy:              {GroupEnergy, "gpu_energy_joules_total", "Energy consumed by the GPU since the driver was loaded, in joules.", prometheus.CounterValue, SourceNVML},
	sample.FieldSMClock:             {GroupClocks, "gpu_sm_clock_hertz", "Current SM clock in hertz.", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryClock:         {GroupDetails, "gpu_memory_clock_hertz", "Current memory clock in hertz.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPCIeLinkGeneration:  {GroupDetails, "gpu_pcie_link_generation", "Current PCIe link generation.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPCIeLinkWidth:       {GroupDetails, "gpu_pcie_link_width", "Current PCIe link width in lanes.", prometheus.GaugeValue, SourceNVML},
	sample.FieldPowerLimit:          {GroupPower, "gpu_power_limit_watts", "Power management limit of the board in watts.", prometheus.GaugeValue, SourceNVML},
	sample.FieldSlowdownTemperature: {GroupTemperature, "gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows its clocks.", prometheus.GaugeValue, SourceNVML},
	sample.FieldShutdownTemperature: {GroupDetails, "gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down.", prometheus.GaugeValue, SourceNVML},
	sample.FieldSMActive:            {GroupDCGMProfiling, "gpu_sm_active_ratio", "Fraction of time at least one warp was active on an SM, averaged over SMs (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldSMOccupancy:         {GroupDCGMDetail, "gpu_sm_occupancy_ratio", "Resident warps over the maximum, averaged over SMs (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldTensorActive:        {GroupDCGMProfiling, "gpu_tensor_active_ratio", "Fraction of cycles the tensor pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldDRAMActive:          {GroupDCGMProfiling, "gpu_dram_active_ratio", "Fraction of cycles device memory was being read or written (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldGraphicsActive:      {GroupDCGMDetail, "gpu_graphics_active_ratio", "Fraction of time the graphics or compute engine was active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP64Active:          {GroupDCGMDetail, "gpu_fp64_active_ratio", "Fraction of cycles the FP64 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP32Active:          {GroupDCGMDetail, "gpu_fp32_active_ratio", "Fraction of cycles the FP32 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldFP16Active:          {GroupDCGMDetail, "gpu_fp16_active_ratio", "Fraction of cycles the FP16 pipes were active (DCGM profiling).", prometheus.GaugeValue, SourceDCGM},
	sample.FieldPCIeTxBytes:         {GroupPCIe, "gpu_pcie_transmit_bytes_total", "Bytes sent over PCIe (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldPCIeRxBytes:         {GroupPCIe, "gpu_pcie_receive_bytes_total", "Bytes received over PCIe (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldNVLinkTxBytes:       {GroupNVLink, "gpu_nvlink_transmit_bytes_total", "Bytes sent over NVLink (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldNVLinkRxBytes:       {GroupNVLink, "gpu_nvlink_receive_bytes_total", "Bytes received over NVLink (DCGM rate, integrated by the exporter).", prometheus.CounterValue, SourceDCGM},
	sample.FieldMemoryTemperature:   {GroupMemoryDetail, "gpu_memory_temperature_celsius", "Memory (HBM) temperature in degrees Celsius (NVML field NVML_FI_DEV_MEMORY_TEMP; GPUs without a memory sensor have none).", prometheus.GaugeValue, SourceNVML},
	sample.FieldEncoderUtilization:  {GroupMedia, "gpu_encoder_utilization_ratio", "Fraction of the last sample period the video encoder was busy (NVML, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldDecoderUtilization:  {GroupMedia, "gpu_decoder_utilization_ratio", "Fraction of the last sample period the video decoder was busy (NVML, 0-1).", prometheus.GaugeValue, SourceNVML},
	sample.FieldMemoryReserved:      {GroupMemoryDetail, "gpu_memory_reserved_bytes", "Framebuffer memory the driver and firmware reserve, in bytes (NVML memory info v2, R510 and later); not part of gpu_memory_used_bytes there.", prometheus.GaugeValue, SourceNVML},
}

var fieldDescs = func() [sample.NumFields]*prometheus.Desc {
	var d [sample.NumFields]*prometheus.Desc
	for f, s := range fieldSpecs {
		d[f] = groupDesc(s.group, s.name, s.help, deviceLabels)
	}
	return d
}()
