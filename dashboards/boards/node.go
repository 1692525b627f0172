package boards

import (
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// onGPUs filters device series by the $node and $gpu variables.
const onGPUs = job + `, node=~"$node", gpu=~"$gpu"`

// device names a GPU or a MIG instance in legends.
const device = "GPU {{gpu}} {{mig_profile}}"

func gpuVar() *dashboard.QueryVariableBuilder {
	return queryVar("gpu", "GPU", `label_values(gpu_info{`+job+`, node=~"$node"}, gpu)`).
		Description("GPU index (NVML) on the chosen node.").
		Multi(true).
		IncludeAll(true).
		AllValue(".*")
}

func node() *dashboard.DashboardBuilder {
	d := newDashboard("gpu-node", "GPU pools / Node",
		"One GPU node, per GPU and MIG instance: utilisation, SM activity, VRAM, temperature, power, throttling, errors and XIDs, and the pods holding each device (gpu-pool-exporter).").
		WithVariable(datasourceVar()).
		WithVariable(nodepoolVar()).
		WithVariable(nodeVar(false)).
		WithVariable(gpuVar()).
		WithVariable(namespaceVar())

	up := valueText("0", "down", "red", "1", "up", "green")

	d = d.WithRow(dashboard.NewRowBuilder("Node")).
		WithPanel(statPanel("GPUs", "Physical GPUs on the node.", "none", 3, 4, nil,
			series(`count(gpu_info{`+job+`, node=~"$node"})`, "GPUs"))).
		WithPanel(statPanel("Driver", "NVIDIA driver and the CUDA version it supports.", "none", 5, 4, nil,
			series(`gpu_driver_info{`+job+`, node=~"$node"}`, "{{driver_version}} (CUDA {{cuda_driver_version}})").Instant()).
			TextMode(common.BigValueTextModeName).GraphMode(common.BigValueGraphModeNone)).
		WithPanel(statPanel("Units by state", "Schedulable units (whole GPUs and MIG instances): free, allocated, unhealthy.", "none", 5, 4, nil,
			series(`sum by (state) (gpu_devices{`+job+`, node=~"$node"})`, "{{state}}")).
			TextMode(common.BigValueTextModeValueAndName)).
		WithPanel(statPanel("kubelet allocatable / healthy", "What the kubelet advertises (all GPU resources) against the healthy units: lower means the device plugin lost capacity.", "none", 4, 4, nil,
			series(`sum(gpu_kubelet_allocatable_devices{`+job+`, node=~"$node"}) or vector(0)`, "allocatable"),
			series(`sum(gpu_healthy_devices{`+job+`, node=~"$node"})`, "healthy")).
			TextMode(common.BigValueTextModeValueAndName)).
		WithPanel(statPanel("Stranded VRAM", "Free VRAM on allocated GPUs of this node.", "bytes", 3, 4, nil,
			series(`sum(gpu_memory_stranded_bytes{`+job+`, node=~"$node"})`, "stranded"))).
		WithPanel(statPanel("Sample age", "Age of the oldest reading the exporter serves; over 60s the samples are stale.", "s", 4, 4, thresholds("green", step{30, "orange"}, step{60, "red"}),
			series(`max(gpu_exporter_sample_age_seconds{`+job+`, node=~"$node"})`, "age"))).
		WithPanel(statPanel("Exporter collectors", "Whether each collector's last run worked.", "none", 24, 3, nil,
			series(`gpu_exporter_collector_up{`+job+`, node=~"$node"}`, "{{collector}}").Instant()).
			Mappings(up).ColorMode(common.BigValueColorModeBackground).GraphMode(common.BigValueGraphModeNone).
			TextMode(common.BigValueTextModeValueAndName))

	d = d.WithRow(dashboard.NewRowBuilder("Utilisation per GPU and MIG instance")).
		WithPanel(timeseriesPanel("GPU utilisation (NVML)", "Busy time of each whole GPU (NVML does not report it per MIG instance).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_utilization_ratio{`+onGPUs+`}`, "GPU {{gpu}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("SM active (DCGM)", "Fraction of time streaming multiprocessors had work, per GPU and MIG instance (DCGM profiling; empty without DCGM).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_sm_active_ratio{`+onGPUs+`}`, device),
		}, ratio)).
		WithPanel(timeseriesPanel("Tensor cores and memory bandwidth", "Tensor core activity and DRAM activity (DCGM), and NVML's memory controller busy time.", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_tensor_active_ratio{`+onGPUs+`}`, device+" tensor"),
			series(`gpu_dram_active_ratio{`+onGPUs+`}`, device+" DRAM"),
			series(`gpu_memory_utilization_ratio{`+onGPUs+`}`, device+" memory controller"),
		}, ratio)).
		WithPanel(timeseriesPanel("VRAM used", "Framebuffer in use per GPU and MIG instance (a MIG GPU's board series includes its instances).", "bytes", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_memory_used_bytes{`+onGPUs+`}`, device),
		})).
		WithPanel(timeseriesPanel("VRAM used (share)", "Framebuffer used over total, per GPU and MIG instance.", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_memory_used_bytes{`+onGPUs+`} / gpu_memory_total_bytes{`+onGPUs+`}`, device),
		}, ratio)).
		WithPanel(timeseriesPanel("PCIe and NVLink throughput", "Bytes per second over PCIe and NVLink, per GPU (DCGM).", "Bps", 12, 8, []*prometheus.DataqueryBuilder{
			series(`rate(gpu_pcie_transmit_bytes_total{`+onGPUs+`, gpu_instance=""}[$__rate_interval])`, "GPU {{gpu}} PCIe tx"),
			series(`rate(gpu_pcie_receive_bytes_total{`+onGPUs+`, gpu_instance=""}[$__rate_interval])`, "GPU {{gpu}} PCIe rx"),
			series(`rate(gpu_nvlink_transmit_bytes_total{`+onGPUs+`, gpu_instance=""}[$__rate_interval])`, "GPU {{gpu}} NVLink tx"),
			series(`rate(gpu_nvlink_receive_bytes_total{`+onGPUs+`, gpu_instance=""}[$__rate_interval])`, "GPU {{gpu}} NVLink rx"),
		}))

	d = d.WithRow(dashboard.NewRowBuilder("Temperature, power and throttling")).
		WithPanel(timeseriesPanel("Temperature", "GPU die temperature, and the slowdown temperature where the GPU starts to throttle.", "celsius", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_temperature_celsius{`+onGPUs+`, gpu_instance=""}`, "GPU {{gpu}}"),
			series(`min(gpu_slowdown_temperature_celsius{`+onGPUs+`})`, "slowdown"),
		})).
		WithPanel(timeseriesPanel("Power", "Board power draw and its limit.", "watt", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_power_watts{`+onGPUs+`, gpu_instance=""}`, "GPU {{gpu}}"),
			series(`gpu_power_limit_watts{`+onGPUs+`}`, "GPU {{gpu}} limit"),
		})).
		WithPanel(timeseriesPanel("SM clock", "Streaming multiprocessor clock: drops under throttling.", "hertz", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_sm_clock_hertz{`+onGPUs+`, gpu_instance=""}`, "GPU {{gpu}}"),
		})).
		WithPanel(stateTimelinePanel("Throttling", "Clock event reasons that cut clocks: thermal and power slowdowns (sustained ones raise GPUThrottled) and the power cap.", 12, 8,
			valueText("0", "no", "transparent", "1", "active", "orange"),
			series(`max by (gpu, reason) (gpu_clock_event_active{`+onGPUs+`, reason=~"hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown|hw_slowdown|sw_power_cap|all"})`, "GPU {{gpu}} {{reason}}")))

	d = d.WithRow(dashboard.NewRowBuilder("Errors and XIDs")).
		WithPanel(timeseriesPanel("XID errors in the last hour", "XID errors per GPU and code over a sliding hour, with the catalog's recommended action.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (gpu, xid, action) (gpu_xid:gpu_xid_errors:increase1h{node=~"$node", gpu=~"$gpu"})`, "GPU {{gpu}} XID {{xid}} ({{action}})"),
		})).
		WithPanel(timeseriesPanel("PCIe replays and NVLink errors", "Rates of PCIe replays and NVLink errors: rising rates point to a bad link or riser.", "ops", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (gpu) (rate(gpu_pcie_replay_errors_total{`+onGPUs+`}[$__rate_interval]))`, "GPU {{gpu}} PCIe replays"),
			series(`sum by (gpu, type) (rate(gpu_nvlink_errors_total{`+onGPUs+`}[$__rate_interval]))`, "GPU {{gpu}} NVLink {{type}}"),
		})).
		WithPanel(tablePanel("GPU health", "Per GPU now: answering NVML, ECC errors, memory repair state, recovery action, XIDs.", 24, 9, []string{"gpu", "uuid"}, "",
			column{"Up", "", `max by (gpu, uuid) (gpu_up{` + onGPUs + `, gpu_instance=""})`},
			column{"Uncorrectable ECC (24h)", "none", `sum by (gpu, uuid) (increase(gpu_ecc_errors_total{` + onGPUs + `, error="uncorrected", scope="volatile"}[24h]))`},
			column{"Correctable ECC (24h)", "none", `sum by (gpu, uuid) (increase(gpu_ecc_errors_total{` + onGPUs + `, error="corrected", scope="volatile"}[24h]))`},
			column{"Row remap pending", "", `max by (gpu, uuid) (gpu_remapped_rows_pending{` + onGPUs + `})`},
			column{"Row remap failed", "", `max by (gpu, uuid) (gpu_remapped_rows_failed{` + onGPUs + `})`},
			column{"Recovery action needed", "", `max by (gpu, uuid) (gpu_recovery_action_code{` + onGPUs + `})`},
			column{"XIDs (1h)", "none", `sum by (gpu, uuid) (gpu_xid:gpu_xid_errors:increase1h{node=~"$node", gpu=~"$gpu"})`},
			column{"PCIe replays (24h)", "none", `sum by (gpu, uuid) (increase(gpu_pcie_replay_errors_total{` + onGPUs + `}[24h]))`},
		))

	d = d.WithRow(dashboard.NewRowBuilder("Holders and MIG")).
		WithPanel(tablePanel("Who holds each GPU", "One row per holder (a time-shared GPU has several): its share of the device, the device's utilisation and SM activity, the container's own VRAM, and idleness.", 24, 9,
			[]string{"gpu", "gpu_instance", "mig_profile", "namespace", "pod", "container", "resource"}, "",
			column{"Share of device", "percentunit", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container, resource) (
  allocation:gpu_devices:share{node=~"$node", gpu=~"$gpu", namespace=~"$namespace"}
)`},
			column{"Device utilisation", "percentunit", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container, resource) (
  gpu_allocation_info{` + onGPUs + `, namespace=~"$namespace"}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_utilization_ratio{` + onGPUs + `}
)`},
			column{"Device SM active", "percentunit", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container, resource) (
  gpu_allocation_info{` + onGPUs + `, namespace=~"$namespace"}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_sm_active_ratio{` + onGPUs + `}
)`},
			column{"VRAM used by container", "bytes", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container) (
  gpu_container_memory_used_bytes{` + onGPUs + `, namespace=~"$namespace"}
)`},
			column{"Idle now", "", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container, resource) (
  gpu_allocation_idle{` + onGPUs + `, namespace=~"$namespace"}
)`},
			column{"Idle in last 24h", "s", `
max by (gpu, gpu_instance, mig_profile, namespace, pod, container, resource) (
  increase(gpu_allocation_idle_seconds_total{` + onGPUs + `, namespace=~"$namespace"}[24h])
)`},
		).OverrideByName("Idle now", []dashboard.DynamicConfigValue{{Id: "mappings", Value: valueText("0", "no", "green", "1", "idle", "orange")}})).
		WithPanel(barGaugePanel("Free MIG slices", "Compute slices not used by any MIG instance, per MIG-enabled GPU.", "none", 8, 7,
			series(`gpu_mig_free_slices{`+onGPUs+`}`, "GPU {{gpu}}").Instant())).
		WithPanel(barGaugePanel("Largest placeable MIG instance", "Slices of the largest MIG profile that can still be created, per GPU.", "none", 8, 7,
			series(`gpu_mig_largest_placeable_slices{`+onGPUs+`}`, "GPU {{gpu}}").Instant())).
		WithPanel(tablePanel("MIG instances", "MIG instances of the node's GPUs and their VRAM in use.", 8, 7, []string{"gpu", "gpu_instance", "mig_profile"}, "",
			column{"Compute instances", "none", `count by (gpu, gpu_instance, mig_profile) (gpu_mig_info{` + onGPUs + `})`},
			column{"VRAM used", "bytes", `max by (gpu, gpu_instance, mig_profile) (gpu_memory_used_bytes{` + onGPUs + `, gpu_instance!=""})`},
			column{"VRAM", "bytes", `max by (gpu, gpu_instance, mig_profile) (gpu_memory_total_bytes{` + onGPUs + `, gpu_instance!=""})`},
		))

	d = d.WithRow(dashboard.NewRowBuilder("Exporter")).
		WithPanel(statPanel("Exporter version", "gpu-pool-exporter build on this node.", "none", 6, 8, nil,
			series(`gpu_exporter_build_info{`+job+`, node=~"$node"}`, "{{version}}").Instant()).
			TextMode(common.BigValueTextModeName).GraphMode(common.BigValueGraphModeNone)).
		WithPanel(statPanel("Unmatched kubelet device IDs", "Device IDs the kubelet reports that the exporter could not match to a GPU: their pods are missing from the holders table.", "none", 6, 8, thresholds("green", step{1, "orange"}),
			series(`sum(gpu_kubelet_unmatched_device_ids{`+job+`, node=~"$node"}) or vector(0)`, "unmatched"))).
		WithPanel(timeseriesPanel("Collector run time", "How long each collector's last run took (NVML, DCGM, pod mapping).", "s", 12, 8, []*prometheus.DataqueryBuilder{
			series(`gpu_exporter_collector_duration_seconds{`+job+`, node=~"$node"}`, "{{collector}}"),
		}))
	return d
}
