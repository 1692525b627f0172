package collector

import (
	"strconv"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// labelValues are a device series' identity labels (deviceLabels).
func labelValues(d *sample.DeviceState) []string {
	gi, ci := "", ""
	if d.IsMIG() {
		gi, ci = strconv.Itoa(d.GPUInstance), strconv.Itoa(d.ComputeInstance)
	}
	return []string{strconv.Itoa(d.GPU), d.UUID, gi, d.MIGProfile, ci}
}
