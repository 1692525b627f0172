package render

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
)

var (
	gpuInfoDesc = groupDesc(GroupCore, "gpu_info",
		"Static facts about a physical GPU; value 1. device is the GKE/kubelet name nvidiaN, N being the NVML minor number.",
		[]string{"gpu", "uuid", "model", "pci_bus_id", "device", "mig_mode"})
	migPendingDesc = groupDesc(GroupCore, "gpu_mig_mode_pending",
		"1 while a MIG mode change waits for the GPU's next reset or a reboot: mig_mode is the mode NVML will apply (gpu_info's mig_mode is the current one). No series while none is pending.",
		[]string{"gpu", "uuid", "mig_mode"})
	migInfoDesc = groupDesc(GroupCore, "gpu_mig_info",
		"Static facts about a MIG instance; value 1.",
		[]string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance", "mig_uuid"})
	gpuUpDesc = groupDesc(GroupCore, "gpu_up",
		"1 if the device answered NVML in the last sample, 0 if it is lost, failing or hanging.",
		deviceLabels)
	gpuLastSampleDesc = groupDesc(GroupDetails, "gpu_last_sample_timestamp_seconds",
		"Unix time of the last sample in which the GPU answered NVML.",
		[]string{"gpu", "uuid"})
	driverInfoDesc = groupDesc(GroupCore, "gpu_driver_info",
		"The node's NVIDIA driver stack; value 1.",
		[]string{"driver_version", "cuda_driver_version", "nvml_version"})
	collectorUpDesc = groupDesc(GroupCore, "gpu_exporter_collector_up",
		"1 if the collector's last run succeeded.", []string{"collector"})
	xidEventsSupportedDesc = groupDesc(GroupCore, "gpu_exporter_xid_events_supported",
		"1 if the node's boards support NVML XID/ECC events, 0 if they do not (the xid collector then has nothing to watch and reports up).", nil)
	collectorDurationDesc = groupDesc(GroupCore, "gpu_exporter_collector_duration_seconds",
		"How long the collector's last run took.", []string{"collector"})
	lastSampleDesc = groupDesc(GroupCore, "gpu_exporter_last_sample_timestamp_seconds",
		"Unix time of the last sample; time() minus this is the age of what /metrics serves.", nil)
	xidDesc = groupDesc(GroupXID, "gpu_xid_errors_total",
		"XID errors reported by the driver, by code, with the category and the immediate action of NVIDIA's Xid catalog. Every occurrence counts.",
		[]string{"gpu", "uuid", "xid", "category", "action"})
	migXIDDesc = groupDesc(GroupXID, "gpu_mig_xid_errors_total",
		"XID errors NVML attributed to a MIG device (also counted in gpu_xid_errors_total of its GPU), kept with the device (mig_uuid): a destroyed instance's count leaves with it, and one created with the same IDs counts its own; join gpu_allocation_info on uuid, gpu_instance, compute_instance for the pod. One NVML attributes to a GPU instance but to none of its compute instances is counted on each of them, as it hits every holder of the GPU instance: count a GPU's XIDs with gpu_xid_errors_total, not by summing these.",
		[]string{"gpu", "uuid", "gpu_instance", "compute_instance", "mig_uuid", "xid", "category", "action"})
	eccEventsDesc = groupDesc(GroupECCDetail, "gpu_ecc_error_events_total",
		"ECC error events delivered by NVML's event set since the exporter started: single_bit (corrected) or double_bit (uncorrected).",
		[]string{"gpu", "uuid", "type"})
	// The alert rules' "new XID in the last hour" is time() minus these, not
	// increase(): a counter cannot tell a scrape gap or a fresh Prometheus
	// from new events, nor a new event after an exporter restart from none.
	xidFirstDesc = groupDesc(GroupXID, "gpu_xid_first_timestamp_seconds",
		"Unix time of the first XID of this code on this GPU since the exporter started: gpu_xid_errors_total was 0 (absent) before it.",
		[]string{"gpu", "uuid", "xid", "category", "action"})
	xidLastDesc = groupDesc(GroupXID, "gpu_xid_last_timestamp_seconds",
		"Unix time of the latest XID of this code on this GPU since the exporter started.",
		[]string{"gpu", "uuid", "xid", "category", "action"})
	lastXIDDesc = groupDesc(GroupXID, "gpu_last_xid_timestamp_seconds",
		"Unix time of the GPU's last XID error.", []string{"gpu", "uuid"})
	nvmlInitializedDesc = groupDesc(GroupCore, "gpu_exporter_nvml_initialized",
		"1 while NVML is initialised and usable; 0 while the exporter waits for nvmlInit or the driver went away (reloaded, upgraded, unloaded). The landing page and /readyz say why.", nil)
	nvmlInitsDesc = groupDesc(GroupDetails, "gpu_exporter_nvml_inits_total",
		"Successful nvmlInit calls: more than one means NVML was initialised again after the driver went away.", nil)
	xidRegisteredDesc = groupDesc(GroupDetails, "gpu_xid_events_registered",
		"1 if the GPU is registered on NVML's event set, so that its XIDs are seen; 0 if not (its registration failed or hangs, or no set is open). NVML keeps no history: an XID raised while 0 is lost.",
		[]string{"gpu", "uuid"})
	xidUnregisteredDesc = groupDesc(GroupXID, "gpu_exporter_xid_unregistered_gpus",
		"GPUs not registered on NVML's event set now: their XIDs are not seen (gpu_xid_events_registered, in the details group, and the landing page say which). All of them while no set is open.", nil)
	xidUncoveredDesc = groupDesc(GroupDetails, "gpu_exporter_xid_uncovered_seconds_total",
		"Seconds since the exporter started during which no NVML event set was open: XIDs raised then were not seen. Tells \"no XID\" from \"not listening\".", nil)
	// draTaintDesc is sparse: a series only while a DRA driver has a taint
	// on a device, so that a healthy node serves none.
	draTaintDesc = groupDesc(GroupCore, "gpu_dra_device_taint",
		"1 per taint a DRA driver put on the device in this node's ResourceSlice (its health check's verdict, e.g. NVIDIA's gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost): key, value and effect as on the slice; dra_driver, dra_pool and dra_device the DRA device it was published as. A NoSchedule or NoExecute taint counts the device unhealthy (gpu_devices). Only with --kubernetes.resource-slices; no series while no device is tainted.",
		append(slices.Clone(deviceLabels), "dra_driver", "dra_pool", "dra_device", "key", "value", "effect"))
	sampleAgeDesc = groupDesc(GroupCore, "gpu_exporter_sample_age_seconds",
		"Age, at render time, of the oldest NVML answer on the page: grows while a GPU's NVML calls hang.", nil)
)

// eccLastIncreaseDesc is the time the exporter last saw a GPU's volatile
// uncorrected ECC count grow: the exporter's own timestamp, so that
// GPUUncorrectableECCErrors reads a series only for GPUs that had an error
// (a healthy fleet serves none) instead of an hour of every GPU's counter.
var eccLastIncreaseDesc = groupDesc(GroupECC, "gpu_ecc_uncorrected_last_increase_timestamp_seconds",
	"Unix time of the sample in which this exporter process last saw the GPU's volatile uncorrected ECC error count grow (also after a reset, if it is above 0 again). No series until it has; the count it had before the exporter started does not count.",
	[]string{"gpu", "uuid"})

// collectState renders the state but for the dcgm-exporter families.
func collectState(st *state.State, groups GroupSet, ch chan<- prometheus.Metric) {
	s := st.Sample
	ch <- prometheus.MustNewConstMetric(driverInfoDesc, prometheus.GaugeValue, 1,
		s.Driver.DriverVersion, s.Driver.CUDADriverVersion, s.Driver.NVMLVersion)
	oldest := st.Rendered
	for i := range s.GPUs {
		g := &s.GPUs[i]
		migMode := "disabled"
		if g.MIGEnabled {
			migMode = "enabled"
		}
		device := ""
		if g.Minor >= 0 {
			device = "nvidia" + strconv.Itoa(g.Minor)
		}
		ch <- prometheus.MustNewConstMetric(gpuInfoDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(g.GPU), g.UUID, g.Model, g.PCIBusID, device, migMode)
		if g.MIGPending != "" {
			ch <- prometheus.MustNewConstMetric(migPendingDesc, prometheus.GaugeValue, 1, strconv.Itoa(g.GPU), g.UUID, g.MIGPending)
		}
		collectDevice(&g.DeviceState, ch)
		collectHealth(g, ch)
		collectDCGMHealth(g, ch)
		if i < len(st.LastGood) && !st.LastGood[i].IsZero() {
			ch <- prometheus.MustNewConstMetric(gpuLastSampleDesc, prometheus.GaugeValue,
				float64(st.LastGood[i].UnixNano())/1e9, strconv.Itoa(g.GPU), g.UUID)
		}
		if i < len(st.LastAnswer) && !st.LastAnswer[i].IsZero() && st.LastAnswer[i].Before(oldest) {
			oldest = st.LastAnswer[i]
		}
		for j := range g.MIG {
			m := &g.MIG[j]
			ch <- prometheus.MustNewConstMetric(migInfoDesc, prometheus.GaugeValue, 1,
				strconv.Itoa(m.GPU), m.UUID, strconv.Itoa(m.GPUInstance), m.MIGProfile,
				strconv.Itoa(m.ComputeInstance), m.MIGUUID)
			collectDevice(m, ch)
		}
	}
	collectFaults(s.GPUs, groups, ch)
	collectAllocations(st, ch)
	collectDerived(st, ch)
	for _, x := range st.XIDs {
		lv := []string{strconv.Itoa(x.GPU), x.UUID, strconv.Itoa(x.Code), x.Entry.Category, x.Entry.Action}
		ch <- prometheus.MustNewConstMetric(xidDesc, prometheus.CounterValue, float64(x.Total), lv...)
		ch <- prometheus.MustNewConstMetric(xidFirstDesc, prometheus.GaugeValue, float64(x.First.UnixNano())/1e9, lv...)
		ch <- prometheus.MustNewConstMetric(xidLastDesc, prometheus.GaugeValue, float64(x.Last.UnixNano())/1e9, lv...)
	}
	for _, x := range st.XIDInstances {
		ci := ""
		if x.Instance.ComputeInstance >= 0 {
			ci = strconv.Itoa(x.Instance.ComputeInstance)
		}
		ch <- prometheus.MustNewConstMetric(migXIDDesc, prometheus.CounterValue, float64(x.Total),
			strconv.Itoa(x.GPU), x.UUID, strconv.Itoa(x.Instance.GPUInstance), ci, x.MIGUUID, strconv.Itoa(x.Code), x.Entry.Category, x.Entry.Action)
	}
	for i, n := range st.ECCEvents {
		if i >= len(s.GPUs) {
			break
		}
		g := &s.GPUs[i]
		// A GPU not registered for a type (ECC off) cannot say: no series.
		if n.SingleWatched {
			ch <- prometheus.MustNewConstMetric(eccEventsDesc, prometheus.CounterValue, float64(n.Single), strconv.Itoa(g.GPU), g.UUID, "single_bit")
		}
		if n.DoubleWatched {
			ch <- prometheus.MustNewConstMetric(eccEventsDesc, prometheus.CounterValue, float64(n.Double), strconv.Itoa(g.GPU), g.UUID, "double_bit")
		}
	}
	for _, x := range st.ECCUncorrectedGrew {
		ch <- prometheus.MustNewConstMetric(eccLastIncreaseDesc, prometheus.GaugeValue, float64(x.At.UnixNano())/1e9, strconv.Itoa(x.GPU), x.UUID)
	}
	for _, x := range st.XIDLast {
		ch <- prometheus.MustNewConstMetric(lastXIDDesc, prometheus.GaugeValue, float64(x.At.UnixNano())/1e9, strconv.Itoa(x.GPU), x.UUID)
	}
	for _, c := range st.Collectors {
		ch <- prometheus.MustNewConstMetric(collectorUpDesc, prometheus.GaugeValue, b2f(c.Up), c.Name)
		ch <- prometheus.MustNewConstMetric(collectorDurationDesc, prometheus.GaugeValue, c.Duration.Seconds(), c.Name)
	}
	if st.XIDEventsSupported != nil {
		ch <- prometheus.MustNewConstMetric(xidEventsSupportedDesc, prometheus.GaugeValue, b2f(*st.XIDEventsSupported))
	}
	ch <- prometheus.MustNewConstMetric(lastSampleDesc, prometheus.GaugeValue, float64(s.Time.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(nvmlInitializedDesc, prometheus.GaugeValue, b2f(s.NVML.Down == ""))
	ch <- prometheus.MustNewConstMetric(nvmlInitsDesc, prometheus.CounterValue, float64(s.NVML.Inits))
	if st.XIDOn {
		unregistered := 0
		for _, c := range st.XIDCoverage {
			ch <- prometheus.MustNewConstMetric(xidRegisteredDesc, prometheus.GaugeValue, b2f(c.Registered), strconv.Itoa(c.GPU), c.UUID)
			if !c.Registered && !c.Unsupported {
				unregistered++
			}
		}
		unsupported := st.XIDEventsSupported != nil && !*st.XIDEventsSupported
		if st.XIDCoverage == nil && !st.XIDUp && !unsupported {
			// No set open, and the source cannot say more. Boards that
			// support no events have nothing to listen to: none counts.
			unregistered = len(s.GPUs)
		}
		ch <- prometheus.MustNewConstMetric(xidUnregisteredDesc, prometheus.GaugeValue, float64(unregistered))
		ch <- prometheus.MustNewConstMetric(xidUncoveredDesc, prometheus.CounterValue, st.XIDUncoveredSeconds)
	}
	ch <- prometheus.MustNewConstMetric(sampleAgeDesc, prometheus.GaugeValue, st.Rendered.Sub(oldest).Seconds())
}

func collectDevice(d *sample.DeviceState, ch chan<- prometheus.Metric) {
	lv := labelValues(d)
	ch <- prometheus.MustNewConstMetric(gpuUpDesc, prometheus.GaugeValue, b2f(d.Up), lv...)
	for _, t := range d.Taints {
		ch <- prometheus.MustNewConstMetric(draTaintDesc, prometheus.GaugeValue, 1, append(slices.Clone(lv), t.Driver, t.Pool, t.Device, t.Key, t.Value, t.Effect)...)
	}
	for f := sample.Field(0); f < sample.NumFields; f++ {
		if v, ok := d.Values.Get(f); ok {
			ch <- prometheus.MustNewConstMetric(fieldDescs[f], fieldSpecs[f].valueType, v, lv...)
		}
	}
}
