package render

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// The faults the alert rules look for, each a series of its own that is
// served only while it holds. The dense families say the same for every
// GPU (gpu_up, gpu_remapped_rows_failed, gpu_recovery_action_code,
// gpu_dcgm_health_status, gpu_clock_event_active: 0 or pass on a healthy
// GPU); a Prometheus rule must read every series a selector names before it
// can drop the healthy ones, so rules that read these instead cost nothing
// on a healthy fleet (docs/performance.md). Each fault belongs to the group
// of the dense family it is read from and is served only while that group
// is.
const faultHelp = "1 while the fault holds on the GPU, no series otherwise: fault=lost (the GPU or one of its MIG instances does not answer NVML: gpu_up 0), row_remap_failed (gpu_remapped_rows_failed 1), recovery_action (NVML asks for a recovery action; the value is its code, as gpu_recovery_action_code), dcgm_health (a DCGM health watch fails: gpu_dcgm_health_status 2; system as there), clock_slowdown (a reason that slows a busy GPU down holds: gpu_clock_event_active 1; reason as there)."

var faultLabels = []string{"gpu", "uuid", "fault", "system", "reason"}

// Fault kinds, the values of the fault label.
const (
	FaultLost           = "lost"
	FaultRowRemapFailed = "row_remap_failed"
	FaultRecoveryAction = "recovery_action"
	FaultDCGMHealth     = "dcgm_health"
	FaultClockSlowdown  = "clock_slowdown"
)

var (
	faultDescs = map[Group]*prometheus.Desc{}
	// faultedDevicesDesc is always served, 0 on a healthy node: it says
	// that the exporter serves gpu_fault_active, so the rules can tell a
	// node whose exporter predates it (and whose faults they cannot see)
	// from a healthy one.
	faultedDevicesDesc = groupDesc(GroupCore, "gpu_faulted_devices",
		"Physical GPUs with at least one series in gpu_fault_active (of the groups served); 0 on a healthy node.", nil)
)

func init() {
	for _, g := range []Group{GroupCore, GroupECC, GroupRecovery, GroupDCGMHealth, GroupDCGMHealthSummary, GroupThrottle, GroupThrottleSummary} {
		faultDescs[g] = groupDesc(g, "gpu_fault_active", faultHelp, faultLabels)
	}
}

// gpuFault is one fault of a GPU and the group that serves it.
type gpuFault struct {
	group          Group
	fault          string
	system, reason string
	value          float64
}

// gpuFaults lists the faults of physical GPU g (and its MIG instances).
func gpuFaults(g *sample.GPUState) []gpuFault {
	var out []gpuFault
	lost := !g.Up
	for i := range g.MIG {
		lost = lost || !g.MIG[i].Up
	}
	if lost {
		out = append(out, gpuFault{group: GroupCore, fault: FaultLost, value: 1})
	}
	// Each fault follows its dense family: NVML's health families are not
	// served for a GPU that does not answer (collectHealth), DCGM's health
	// watches are, as DCGM keeps reporting on it (collectDCGMHealth).
	h := &g.Health
	if g.Up && h.RemapCorr.OK && h.RemapFailed.V {
		out = append(out, gpuFault{group: GroupECC, fault: FaultRowRemapFailed, value: 1})
	}
	if g.Up && h.RecoveryAction.OK && h.RecoveryAction.V > 0 {
		out = append(out, gpuFault{group: GroupRecovery, fault: FaultRecoveryAction, value: float64(h.RecoveryAction.V)})
	}
	if g.DCGMHealth != nil {
		failing := false
		for _, sys := range dcgm.HealthSystems {
			if g.DCGMHealth[sys] == dcgm.HealthFail {
				failing = true
				out = append(out, gpuFault{group: GroupDCGMHealth, fault: FaultDCGMHealth, system: sys, value: 1})
			}
		}
		if failing {
			out = append(out, gpuFault{group: GroupDCGMHealthSummary, fault: FaultDCGMHealth, system: "all", value: 1})
		}
	}
	if g.Up && h.ClockReasons.OK && h.ClockReasons.V&slowdownReasons != 0 {
		for _, r := range sample.ClockEventReasons {
			if r.Bit&slowdownReasons != 0 && h.ClockReasons.V&r.Bit != 0 {
				out = append(out, gpuFault{group: GroupThrottle, fault: FaultClockSlowdown, reason: r.Name, value: 1})
			}
		}
		out = append(out, gpuFault{group: GroupThrottleSummary, fault: FaultClockSlowdown, reason: "all", value: 1})
	}
	return out
}

// collectFaults serves gpu_fault_active for every GPU of the sample and
// gpu_faulted_devices, counting only the faults of the groups served.
func collectFaults(gpus []sample.GPUState, groups GroupSet, ch chan<- prometheus.Metric) {
	faulted := 0
	for i := range gpus {
		g := &gpus[i]
		has := false
		for _, f := range gpuFaults(g) {
			if !groups.On(f.group) {
				continue
			}
			has = true
			ch <- prometheus.MustNewConstMetric(faultDescs[f.group], prometheus.GaugeValue, f.value,
				strconv.Itoa(g.GPU), g.UUID, f.fault, f.system, f.reason)
		}
		if has {
			faulted++
		}
	}
	ch <- prometheus.MustNewConstMetric(faultedDevicesDesc, prometheus.GaugeValue, float64(faulted))
}
