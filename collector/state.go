package collector

import (
	"strconv"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvml"
)

// What the NVML sampler saw, as the orchestration joins and renders it.
type (
	DeviceState    = nvml.DeviceState
	GPUState       = nvml.GPUState
	MIGLayout      = nvml.MIGLayout
	MIGProfileInfo = nvml.MIGProfileInfo
	MIGPlacement   = nvml.MIGPlacement
	DriverInfo     = nvml.DriverInfo
	NodeSample     = nvml.NodeSample
)

// labelValues are a device series' identity labels (deviceLabels).
func labelValues(d *DeviceState) []string {
	gi, ci := "", ""
	if d.IsMIG() {
		gi, ci = strconv.Itoa(d.GPUInstance), strconv.Itoa(d.ComputeInstance)
	}
	return []string{strconv.Itoa(d.GPU), d.UUID, gi, d.MIGProfile, ci}
}
