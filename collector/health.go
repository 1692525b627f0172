package collector

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvml"
)

var (
	eccErrorNames  = [2]string{"corrected", "uncorrected"}
	eccScopeNames  = [2]string{"volatile", "aggregate"}
	retireCauses   = [2]string{"single_bit_ecc", "double_bit_ecc"}
	remapTypeNames = [2]string{"correctable", "uncorrectable"}
)

var (
	eccDesc = prometheus.NewDesc("gpu_ecc_errors_total",
		"ECC errors counted by the driver: volatile since the last driver load, aggregate over the GPU's life.",
		[]string{"gpu", "uuid", "error", "scope"}, nil)
	retiredDesc = prometheus.NewDesc("gpu_retired_pages",
		"Framebuffer pages retired, by cause (GPUs before Ampere).", []string{"gpu", "uuid", "cause"}, nil)
	retiredPendingDesc = prometheus.NewDesc("gpu_retired_pages_pending",
		"1 if a page retirement waits for the next driver reload.", []string{"gpu", "uuid"}, nil)
	remappedDesc = prometheus.NewDesc("gpu_remapped_rows",
		"Memory rows remapped, by the kind of error that caused it (Ampere and later).", []string{"gpu", "uuid", "type"}, nil)
	remapPendingDesc = prometheus.NewDesc("gpu_remapped_rows_pending",
		"1 if a row remap waits for a GPU reset to take effect.", []string{"gpu", "uuid"}, nil)
	remapFailedDesc = prometheus.NewDesc("gpu_remapped_rows_failed",
		"1 if a row remap failed: the GPU needs service.", []string{"gpu", "uuid"}, nil)
	clockEventDesc = prometheus.NewDesc("gpu_clock_event_active",
		"1 while a clock event (throttle) reason holds the clocks down; a state set over reasons.", []string{"gpu", "uuid", "reason"}, nil)
	pcieReplayDesc = prometheus.NewDesc("gpu_pcie_replay_errors_total",
		"PCIe replays: link-level retransmissions, a sign of a bad link or riser.", []string{"gpu", "uuid"}, nil)
	nvlinkErrDesc = prometheus.NewDesc("gpu_nvlink_errors_total",
		"NVLink errors by type, summed over the GPU's links (per link: nvidia-smi nvlink -e): replay, recovery, crc_flit, crc_data before Blackwell; recovery, recovery_failed, symbol, effective, receive from NVLink5's counters on Blackwell.", []string{"gpu", "uuid", "type"}, nil)
	recoveryDesc = prometheus.NewDesc("gpu_recovery_action",
		"The recovery action NVML asks for (XID 154, R570 and later); a state set, 1 for the current action, unknown for a value newer than the exporter.", []string{"gpu", "uuid", "action"}, nil)
	nvlinkActiveDesc = prometheus.NewDesc("gpu_nvlink_active_links",
		"Number of NVLinks up on the GPU.", []string{"gpu", "uuid"}, nil)
	numaDesc = prometheus.NewDesc("gpu_numa_node",
		"NUMA node the GPU is attached to.", []string{"gpu", "uuid"}, nil)
)

func collectHealth(g *GPUState, ch chan<- prometheus.Metric) {
	if !g.Up {
		return
	}
	h := &g.Health
	gpu, uuid := strconv.Itoa(g.GPU), g.UUID
	for e := 0; e < 2; e++ {
		for sc := 0; sc < 2; sc++ {
			if v := h.ECC[e][sc]; v.OK {
				ch <- prometheus.MustNewConstMetric(eccDesc, prometheus.CounterValue, float64(v.V), gpu, uuid, eccErrorNames[e], eccScopeNames[sc])
			}
		}
	}
	for c := 0; c < 2; c++ {
		if v := h.RetiredPages[c]; v.OK {
			ch <- prometheus.MustNewConstMetric(retiredDesc, prometheus.GaugeValue, float64(v.V), gpu, uuid, retireCauses[c])
		}
	}
	if h.RetiredPending.OK {
		ch <- prometheus.MustNewConstMetric(retiredPendingDesc, prometheus.GaugeValue, b2f(h.RetiredPending.V), gpu, uuid)
	}
	if h.RemapCorr.OK {
		ch <- prometheus.MustNewConstMetric(remappedDesc, prometheus.GaugeValue, float64(h.RemapCorr.V), gpu, uuid, remapTypeNames[0])
		ch <- prometheus.MustNewConstMetric(remappedDesc, prometheus.GaugeValue, float64(h.RemapUncorr.V), gpu, uuid, remapTypeNames[1])
		ch <- prometheus.MustNewConstMetric(remapPendingDesc, prometheus.GaugeValue, b2f(h.RemapPending.V), gpu, uuid)
		ch <- prometheus.MustNewConstMetric(remapFailedDesc, prometheus.GaugeValue, b2f(h.RemapFailed.V), gpu, uuid)
	}
	if h.ClockReasons.OK {
		for _, r := range nvml.ClockEventReasons {
			ch <- prometheus.MustNewConstMetric(clockEventDesc, prometheus.GaugeValue, b2f(h.ClockReasons.V&r.Bit != 0), gpu, uuid, r.Name)
		}
	}
	if h.PCIeReplay.OK {
		ch <- prometheus.MustNewConstMetric(pcieReplayDesc, prometheus.CounterValue, float64(h.PCIeReplay.V), gpu, uuid)
	}
	if h.HasNVLink {
		// 18 links x 4 types per GPU would be 72 series; one per type says
		// which GPU to look at, and links up says whether one went down.
		for t, v := range h.NVLinkErrors {
			if h.NVLinkErrorSeen[t] {
				ch <- prometheus.MustNewConstMetric(nvlinkErrDesc, prometheus.CounterValue, float64(v), gpu, uuid, nvml.NVLinkErrorTypes[t].Name)
			}
		}
	}
	if h.RecoveryAction.OK {
		known := false
		for _, a := range nvml.RecoveryActions {
			cur := h.RecoveryAction.V == int(a.Value)
			known = known || cur
			ch <- prometheus.MustNewConstMetric(recoveryDesc, prometheus.GaugeValue, b2f(cur), gpu, uuid, a.Name)
		}
		ch <- prometheus.MustNewConstMetric(recoveryDesc, prometheus.GaugeValue, b2f(!known), gpu, uuid, nvml.RecoveryActionUnknown)
	}
	ch <- prometheus.MustNewConstMetric(nvlinkActiveDesc, prometheus.GaugeValue, float64(h.NVLinkActive), gpu, uuid)
	if h.NUMANode.OK {
		ch <- prometheus.MustNewConstMetric(numaDesc, prometheus.GaugeValue, float64(h.NUMANode.V), gpu, uuid)
	}
}
