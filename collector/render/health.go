package render

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

var (
	eccErrorNames  = [2]string{"corrected", "uncorrected"}
	eccScopeNames  = [2]string{"volatile", "aggregate"}
	retireCauses   = [2]string{"single_bit_ecc", "double_bit_ecc"}
	remapTypeNames = [2]string{"correctable", "uncorrectable"}
)

const eccHelp = "ECC errors counted by the driver: volatile since the last driver load, aggregate over the GPU's life."

const clockEventHelp = "1 while a clock event (throttle) reason holds the clocks down; a state set over reasons (several can hold at once)."

// slowdownReasons are the clock event reasons that slow a busy GPU down
// against its will: hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown
// and hw_power_brake_slowdown (the GPUThrottled alert). The others (the
// software power cap, which every busy GPU at its power limit shows, idle,
// application clocks, sync boost, display clock) are in clock_events.
const slowdownReasons = 0x8 | 0x20 | 0x40 | 0x80

var (
	eccDesc = groupDesc(GroupECC, "gpu_ecc_errors_total", eccHelp, []string{"gpu", "uuid", "error", "scope"})
	// eccAggregateDesc is the same family for scope="aggregate" (group
	// ecc_detail): the GPU's lifetime counts, for RMA decisions.
	eccAggregateDesc = groupDesc(GroupECCDetail, "gpu_ecc_errors_total", eccHelp, []string{"gpu", "uuid", "error", "scope"})
	// eccCorrectedDesc is the same family for error="corrected",
	// scope="volatile" (group ecc_corrected).
	eccCorrectedDesc = groupDesc(GroupECCCorrected, "gpu_ecc_errors_total", eccHelp, []string{"gpu", "uuid", "error", "scope"})
	retiredDesc      = groupDesc(GroupECCDetail, "gpu_retired_pages",
		"Framebuffer pages retired, by cause (GPUs before Ampere).", []string{"gpu", "uuid", "cause"})
	retiredPendingDesc = groupDesc(GroupECC, "gpu_retired_pages_pending",
		"1 if a page retirement waits for the next driver reload.", []string{"gpu", "uuid"})
	remappedDesc = groupDesc(GroupECCDetail, "gpu_remapped_rows",
		"Memory rows remapped, by the kind of error that caused it (Ampere and later).", []string{"gpu", "uuid", "type"})
	remapPendingDesc = groupDesc(GroupECC, "gpu_remapped_rows_pending",
		"1 if a row remap waits for a GPU reset to take effect.", []string{"gpu", "uuid"})
	remapFailedDesc = groupDesc(GroupECC, "gpu_remapped_rows_failed",
		"1 if a row remap failed: the GPU needs service.", []string{"gpu", "uuid"})
	// remapBanksDesc is the row remapper's histogram (group ecc_detail);
	// remapBanksLowDesc the part of it that says a GPU is running out of
	// spare rows (group ecc), for the replacement signal on every profile:
	// sparse, like the ECC increase time, so it costs a healthy GPU nothing.
	remapBanksDesc = groupDesc(GroupECCDetail, "gpu_row_remap_banks",
		"Memory banks by the spare rows they have left for row remapping (nvmlDeviceGetRowRemapperHistogram; Ampere and later): availability max, high, partial, low or none. A bank with none left cannot repair another uncorrectable error by remapping.",
		[]string{"gpu", "uuid", "availability"})
	remapBanksLowDesc = groupDesc(GroupECC, "gpu_row_remap_banks_low_availability",
		"Memory banks with low or no spare rows left for row remapping (the low and none levels of gpu_row_remap_banks; Ampere and later): the GPU is running out of memory repairs. Served only for GPUs that have such banks, so that a healthy fleet pays no series for it.",
		[]string{"gpu", "uuid"})
	clockEventDesc = groupDesc(GroupThrottle, "gpu_clock_event_active",
		clockEventHelp, []string{"gpu", "uuid", "reason"})
	// clockEventOtherDesc is the same family for the reasons that do not
	// slow a busy GPU down (group clock_events, off by default).
	clockEventOtherDesc = groupDesc(GroupClockEvents, "gpu_clock_event_active",
		clockEventHelp, []string{"gpu", "uuid", "reason"})
	clockEventSummaryDesc = groupDesc(GroupThrottleSummary, "gpu_clock_event_active",
		clockEventHelp, []string{"gpu", "uuid", "reason"})
	pcieReplayDesc = groupDesc(GroupPCIe, "gpu_pcie_replay_errors_total",
		"PCIe replays: link-level retransmissions, a sign of a bad link or riser.", []string{"gpu", "uuid"})
	nvlinkErrDesc = groupDesc(GroupNVLinkErrors, "gpu_nvlink_errors_total",
		"NVLink errors by type, summed over the GPU's links (per link: nvidia-smi nvlink -e): replay, recovery, crc_flit, crc_data before Blackwell; recovery, recovery_failed, symbol, effective, receive from NVLink5's counters on Blackwell.", []string{"gpu", "uuid", "type"})
	nvlinkErrSummaryDesc = groupDesc(GroupNVLinkErrorsSummary, "gpu_nvlink_errors_total",
		"NVLink errors by type, summed over the GPU's links (per link: nvidia-smi nvlink -e): replay, recovery, crc_flit, crc_data before Blackwell; recovery, recovery_failed, symbol, effective, receive from NVLink5's counters on Blackwell.", []string{"gpu", "uuid", "type"})
	recoveryDesc = groupDesc(GroupRecovery, "gpu_recovery_action_code",
		"The recovery action NVML asks for (XID 154, R570 and later), as its code (nvmlDeviceGpuRecoveryAction_t): 0 none, 1 gpu_reset, 2 node_reboot, 3 drain_p2p, 4 drain_and_reset, 5 recover_imex_domain, 6 bus_reset, 7 system_reboot; a newer code is shown as is. One action holds at a time, so one series with its code rather than a state set.",
		[]string{"gpu", "uuid"})
	nvlinkActiveDesc = groupDesc(GroupDetails, "gpu_nvlink_active_links",
		"Number of NVLinks up on the GPU.", []string{"gpu", "uuid"})
	numaDesc = groupDesc(GroupDetails, "gpu_numa_node",
		"NUMA node the GPU is attached to.", []string{"gpu", "uuid"})
)

func collectHealth(g *sample.GPUState, ch chan<- prometheus.Metric) {
	if !g.Up {
		return
	}
	h := &g.Health
	gpu, uuid := strconv.Itoa(g.GPU), g.UUID
	for e := 0; e < 2; e++ {
		for sc := 0; sc < 2; sc++ {
			if v := h.ECC[e][sc]; v.OK {
				d := eccDesc
				switch {
				case sc == 1:
					d = eccAggregateDesc
				case e == 0:
					d = eccCorrectedDesc
				}
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v.V), gpu, uuid, eccErrorNames[e], eccScopeNames[sc])
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
	if b := h.RemapBanks; b.OK {
		for i, n := range b.V {
			ch <- prometheus.MustNewConstMetric(remapBanksDesc, prometheus.GaugeValue, float64(n), gpu, uuid, sample.RemapAvailabilityNames[i])
		}
		if low := b.V[3] + b.V[4]; low > 0 {
			ch <- prometheus.MustNewConstMetric(remapBanksLowDesc, prometheus.GaugeValue, float64(low), gpu, uuid)
		}
	}
	if h.ClockReasons.OK {
		for _, r := range sample.ClockEventReasons {
			d := clockEventOtherDesc
			if r.Bit&slowdownReasons != 0 {
				d = clockEventDesc
			}
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, b2f(h.ClockReasons.V&r.Bit != 0), gpu, uuid, r.Name)
		}
		ch <- prometheus.MustNewConstMetric(clockEventSummaryDesc, prometheus.GaugeValue, b2f(h.ClockReasons.V&slowdownReasons != 0), gpu, uuid, "all")
	}
	if h.PCIeReplay.OK {
		ch <- prometheus.MustNewConstMetric(pcieReplayDesc, prometheus.CounterValue, float64(h.PCIeReplay.V), gpu, uuid)
	}
	if h.HasNVLink {
		// 18 links x 4 types per GPU would be 72 series; one per type says
		// which GPU to look at, and links up says whether one went down.
		var sum uint64
		for t, v := range h.NVLinkErrors {
			if !h.NVLinkErrorSeen[t] {
				continue
			}
			ch <- prometheus.MustNewConstMetric(nvlinkErrDesc, prometheus.CounterValue, float64(v), gpu, uuid, sample.NVLinkErrorNames[t])
			sum += v
		}
		ch <- prometheus.MustNewConstMetric(nvlinkErrSummaryDesc, prometheus.CounterValue, float64(sum), gpu, uuid, "all")
	}
	if h.RecoveryAction.OK {
		ch <- prometheus.MustNewConstMetric(recoveryDesc, prometheus.GaugeValue, float64(h.RecoveryAction.V), gpu, uuid)
	}
	if h.NVLinkActive.OK {
		ch <- prometheus.MustNewConstMetric(nvlinkActiveDesc, prometheus.GaugeValue, float64(h.NVLinkActive.V), gpu, uuid)
	}
	if h.NUMANode.OK {
		ch <- prometheus.MustNewConstMetric(numaDesc, prometheus.GaugeValue, float64(h.NUMANode.V), gpu, uuid)
	}
}

var (
	dcgmHealthDesc = groupDesc(GroupDCGMHealth, "gpu_dcgm_health_status",
		"DCGM health watch result per subsystem: 0 pass, 1 warn, 2 fail. One result holds at a time, so one series with its value rather than a state set.",
		[]string{"gpu", "uuid", "system"})
	dcgmHealthSummaryDesc = groupDesc(GroupDCGMHealthSummary, "gpu_dcgm_health_status",
		"DCGM health watch result per subsystem: 0 pass, 1 warn, 2 fail. One result holds at a time, so one series with its value rather than a state set.",
		[]string{"gpu", "uuid", "system"})
	dcgmStatusValues = map[string]float64{dcgm.HealthPass: 0, dcgm.HealthWarn: 1, dcgm.HealthFail: 2}
)

func collectDCGMHealth(g *sample.GPUState, ch chan<- prometheus.Metric) {
	if g.DCGMHealth == nil {
		return
	}
	gpu := strconv.Itoa(g.GPU)
	worst := 0.0
	for _, sys := range dcgm.HealthSystems {
		v := dcgmStatusValues[g.DCGMHealth[sys]] // not reported: 0, DCGM found nothing to say
		worst = max(worst, v)
		ch <- prometheus.MustNewConstMetric(dcgmHealthDesc, prometheus.GaugeValue, v, gpu, g.UUID, sys)
	}
	ch <- prometheus.MustNewConstMetric(dcgmHealthSummaryDesc, prometheus.GaugeValue, worst, gpu, g.UUID, "all")
}
