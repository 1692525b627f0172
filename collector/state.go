package collector

import (
	"strconv"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
)

// What the NVML sampler saw, as the orchestration joins and renders it.
type (
	DeviceState    = nvmlsampler.DeviceState
	GPUState       = nvmlsampler.GPUState
	MIGLayout      = nvmlsampler.MIGLayout
	MIGProfileInfo = nvmlsampler.MIGProfileInfo
	MIGPlacement   = nvmlsampler.MIGPlacement
	DriverInfo     = nvmlsampler.DriverInfo
	NodeSample     = nvmlsampler.NodeSample
)

// labelValues are a device series' identity labels (deviceLabels).
func labelValues(d *DeviceState) []string {
	gi, ci := "", ""
	if d.IsMIG() {
		gi, ci = strconv.Itoa(d.GPUInstance), strconv.Itoa(d.ComputeInstance)
	}
	return []string{strconv.Itoa(d.GPU), d.UUID, gi, d.MIGProfile, ci}
}
