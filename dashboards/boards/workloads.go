package boards

import (
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// held filters allocation series (exporter or recording rule) by the
// $node and $namespace variables.
const held = `node=~"$node", namespace=~"$namespace"`

// holders keys a holder: the labels joining gpu_allocation_info,
// gpu_allocation_idle and the allocation:* recording rules.
const holders = `node, uuid, gpu_instance, namespace, pod, container`

// heldUtilisation is the busy time of the devices each holder holds,
// weighted by its share of them: sum(share x util) / sum(share), by the
// given labels. MIG instances (no NVML busy time) are left out.
func heldUtilisation(by string) string {
	sum := "sum"
	if by != "" {
		sum = "sum by (" + by + ")"
	}
	return `
  ` + sum + ` (
    allocation:gpu_devices:share{` + held + `}
    * on (node, uuid, gpu_instance) group_left ()
    gpu_utilization_ratio{` + job + `}
  )
/
  ` + sum + ` (
    allocation:gpu_devices:share{` + held + `}
    and on (node, uuid, gpu_instance)
    gpu_utilization_ratio{` + job + `}
  )`
}

// idleShare is each idle holder's share of its device.
const idleShare = `
  allocation:gpu_devices:share{` + held + `}
  and on (` + holders + `)
  (gpu_allocation_idle{` + job + `, ` + held + `} == 1)`

func workloads() *dashboard.DashboardBuilder {
	d := newDashboard("gpu-workloads", "GPU pools / Workloads",
		"Per namespace and pod: GPUs held, how much of them is used, idle time and cost (gpu-pool-exporter). Time-shared GPUs are split between their holders.").
		WithVariable(datasourceVar()).
		WithVariable(nodepoolVar()).
		WithVariable(nodeVar(true)).
		WithVariable(namespaceVar())

	d = d.WithRow(dashboard.NewRowBuilder("Namespaces")).
		WithPanel(statPanel("GPUs held", "Schedulable units held by pods of the chosen namespaces (a time-shared GPU counts once, split between its holders).", "none", 4, 4, nil,
			series(`sum(allocation:gpu_devices:share{`+held+`}) or vector(0)`, "held"))).
		WithPanel(statPanel("Held but idle", "Of those, units whose holder has been idle for the exporter's idle window.", "none", 4, 4, thresholds("green", step{1, "orange"}),
			series(`sum(`+idleShare+`) or vector(0)`, "idle"))).
		WithPanel(statPanel("Utilisation of held GPUs", "NVML busy time of the held whole GPUs, weighted by share.", "percentunit", 4, 4, thresholds("red", step{0.3, "orange"}, step{0.6, "green"}),
			series(heldUtilisation(""), "utilisation"))).
		WithPanel(statPanel("Cost per hour", "What the held GPUs cost per hour (where a GPU price is configured).", "currencyUSD", 4, 4, nil,
			series(`sum(allocation:gpu_cost_dollars_per_hour:share{`+held+`}) or vector(0)`, "$/h"))).
		WithPanel(statPanel("Idle cost per hour", "What the idle ones cost per hour.", "currencyUSD", 4, 4, thresholds("green", step{1, "orange"}),
			series(`sum(allocation:gpu_idle_cost_dollars_per_hour:share{`+held+`}) or vector(0)`, "$/h"))).
		WithPanel(statPanel("Pending GPU pods", "Pods of the chosen namespaces Pending with a GPU request (kube-state-metrics).", "none", 4, 4, thresholds("green", step{1, "orange"}),
			series(`count(`+pendingInNamespaces+`) or vector(0)`, "pending"))).
		WithPanel(timeseriesPanel("GPUs held by namespace", "Schedulable units held, by namespace.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (allocation:gpu_devices:share{`+held+`})`, "{{namespace}}"),
		}, stacked)).
		WithPanel(timeseriesPanel("Idle GPUs by namespace", "Held units whose holder is idle, by namespace.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (`+idleShare+`)`, "{{namespace}}"),
		}, stacked)).
		WithPanel(timeseriesPanel("Utilisation of held GPUs by namespace", "NVML busy time of held whole GPUs, weighted by share: low means paying for GPUs that wait.", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(heldUtilisation("namespace"), "{{namespace}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("Cost per hour by namespace", "Hourly cost of held GPUs, by namespace.", "currencyUSD", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (allocation:gpu_cost_dollars_per_hour:share{`+held+`})`, "{{namespace}}"),
		}, stacked)).
		WithPanel(tablePanel("Namespaces", "Per namespace now; idle GPU-hours and their cost over the last 24 hours.", 24, 8, []string{"namespace"}, "GPUs held",
			column{"GPUs held", "none", `sum by (namespace) (allocation:gpu_devices:share{` + held + `})`},
			column{"Idle now", "none", `sum by (namespace) (` + idleShare + `)`},
			column{"Utilisation", "percentunit", heldUtilisation("namespace")},
			column{"VRAM used", "bytes", `sum by (namespace) (gpu_container_memory_used_bytes{` + job + `, ` + held + `})`},
			column{"Cost $/h", "currencyUSD", `sum by (namespace) (allocation:gpu_cost_dollars_per_hour:share{` + held + `})`},
			column{"Idle GPU-hours (24h)", "none", `sum by (namespace) (increase(gpu_allocation_idle_seconds_total{` + job + `, ` + held + `}[24h])) / 3600`},
			column{"Idle cost (24h)", "currencyUSD", `
sum by (namespace) (
  increase(gpu_allocation_idle_seconds_total{` + job + `, ` + held + `}[24h]) / 3600
  * on (` + holders + `)
  allocation:gpu_cost_dollars_per_hour:share{` + held + `}
)`},
		))

	d = d.WithRow(dashboard.NewRowBuilder("Pods")).
		WithPanel(tablePanel("Pods", "Per pod now: GPUs held and how much of them is used (device busy time and SM activity of the held devices; the pod's own VRAM where the exporter can attribute it), idle time and cost.", 24, 10,
			[]string{"namespace", "pod", "node"}, "GPUs held",
			column{"GPUs held", "none", `sum by (namespace, pod, node) (allocation:gpu_devices:share{` + held + `})`},
			column{"Device utilisation", "percentunit", `
avg by (namespace, pod, node) (
  gpu_allocation_info{` + job + `, ` + held + `}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_utilization_ratio{` + job + `}
)`},
			column{"SM active", "percentunit", `
avg by (namespace, pod, node) (
  gpu_allocation_info{` + job + `, ` + held + `}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_sm_active_ratio{` + job + `}
)`},
			column{"VRAM used", "bytes", `sum by (namespace, pod, node) (gpu_container_memory_used_bytes{` + job + `, ` + held + `})`},
			column{"VRAM held", "bytes", `
sum by (namespace, pod, node) (
  allocation:gpu_devices:share{` + held + `}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_memory_total_bytes{` + job + `}
)`},
			column{"Idle now", "none", `sum by (namespace, pod, node) (` + idleShare + `)`},
			column{"Idle in last 24h", "s", `max by (namespace, pod, node) (increase(gpu_allocation_idle_seconds_total{` + job + `, ` + held + `}[24h]))`},
			column{"Cost $/h", "currencyUSD", `sum by (namespace, pod, node) (allocation:gpu_cost_dollars_per_hour:share{` + held + `})`},
			column{"Idle cost (24h)", "currencyUSD", `
sum by (namespace, pod, node) (
  increase(gpu_allocation_idle_seconds_total{` + job + `, ` + held + `}[24h]) / 3600
  * on (` + holders + `)
  allocation:gpu_cost_dollars_per_hour:share{` + held + `}
)`},
		)).
		WithPanel(timeseriesPanel("Device utilisation by pod", "NVML busy time of the devices each pod holds (for a time-shared GPU: the whole device's).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`
avg by (namespace, pod) (
  gpu_allocation_info{`+job+`, `+held+`}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_utilization_ratio{`+job+`}
)`, "{{namespace}}/{{pod}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("Own utilisation by pod", "The containers' own GPU utilisation (gpu_container_utilization_ratio: exclusively held devices, or per-process accounting).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`avg by (namespace, pod) (gpu_container_utilization_ratio{`+job+`, `+held+`})`, "{{namespace}}/{{pod}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("SM active by pod (DCGM)", "Streaming multiprocessor activity of the held devices, also per MIG instance (DCGM).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`
avg by (namespace, pod) (
  gpu_allocation_info{`+job+`, `+held+`}
  * on (node, uuid, gpu_instance) group_left ()
  gpu_sm_active_ratio{`+job+`}
)`, "{{namespace}}/{{pod}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("VRAM used by pod", "Framebuffer used by each pod's containers.", "bytes", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace, pod) (gpu_container_memory_used_bytes{`+job+`, `+held+`})`, "{{namespace}}/{{pod}}"),
		})).
		WithPanel(timeseriesPanel("Share of time idle by pod", "How much of the time each pod's GPUs were idle (idle seconds per second, averaged over its devices).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`avg by (namespace, pod) (rate(gpu_allocation_idle_seconds_total{`+job+`, `+held+`}[$__rate_interval]))`, "{{namespace}}/{{pod}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("Cost per hour by pod", "Hourly cost of the GPUs each pod holds.", "currencyUSD", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace, pod) (allocation:gpu_cost_dollars_per_hour:share{`+held+`})`, "{{namespace}}/{{pod}}"),
		}, stacked)).
		WithPanel(tablePanel("Pending GPU pods by request", "Pods of the chosen namespaces Pending with a GPU request (kube-state-metrics): see the GPU pool overview's fragmentation panels and GPUPodPendingWhileGPUsFree.", 24, 6,
			[]string{"namespace", "pod"}, "GPUs requested",
			column{"GPUs requested", "none", `
sum by (namespace, pod) (
  max by (namespace, pod, container) (kube_pod_container_resource_requests{resource="nvidia_com_gpu", namespace=~"$namespace"})
)
and on (namespace, pod)
(max by (namespace, pod) (kube_pod_status_phase{phase="Pending", namespace=~"$namespace"}) == 1)`},
		))

	d = d.WithRow(dashboard.NewRowBuilder("Shared GPUs")).
		WithPanel(timeseriesPanel("VRAM by pod on shared GPUs", "Each pod's own framebuffer on time-sliced or MPS GPUs, from per-process accounting (gpu_container_memory_used_bytes on devices with several holders), against the device's total: near the top, every tenant risks running out of memory.", "bytes", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace, pod, uuid) (gpu_container_memory_used_bytes{`+job+`, `+held+`} and on (node, uuid, gpu_instance) `+sharedDevices+`)`, "{{namespace}}/{{pod}} on {{uuid}}"),
			series(`max by (uuid) (gpu_memory_total_bytes{`+job+`, node=~"$node"} and on (node, uuid, gpu_instance) `+sharedDevices+`)`, "total of {{uuid}}"),
			series(`sum by (uuid) (gpu_memory_used_outside_pods_bytes{`+job+`, node=~"$node"} and on (node, uuid, gpu_instance) `+sharedDevices+`)`, "outside pods on {{uuid}}"),
		})).
		WithPanel(timeseriesPanel("Activity by pod on shared GPUs", "Each pod's own SM utilisation on time-sliced or MPS GPUs: its processes' share of the device (gpu_container_utilization_ratio{source=\"processes\"}, NVML per-process accounting). A pod at 0 holds a replica and runs nothing.", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace, pod, uuid) (gpu_container_utilization_ratio{`+job+`, `+held+`, source="processes"})`, "{{namespace}}/{{pod}} on {{uuid}}"),
		}, stacked))

	d = d.WithRow(dashboard.NewRowBuilder("Right-sizing")).
		WithPanel(tablePanel("Right-sizing per pod", "Over the dashboard's time range, per pod: its devices' memory against its peak VRAM, its p95 activity (DCGM SM activity, else NVML; a shared GPU's holder its own processes'), and the device-hours it held, busy (its own activity: on a time-sliced GPU its processes' part of the GPU, so a GPU's holders add up to the GPU's busy time, and one can be busier than its share) and idle (as the exporter judges it). A MIG device counts as one device here; `gpupool recommend` turns this into a shape per workload a node pool serves and `report` into GPU-hours and cost per team and model, with MIG devices at their cost share and the GPU-hours nobody held, adding up to the bill (docs/rightsizing.md). Hours assume the rules' one-minute recordings.", 24, 10,
			[]string{"namespace", "pod"}, "Device-hours held",
			column{"VRAM held", "bytes", `
max by (namespace, pod) (
  allocation:gpu_devices:share{` + held + `}
  * on (node, uuid, gpu_instance, compute_instance) group_left ()
  gpu_memory_total_bytes{` + job + `}
)`},
			column{"Peak VRAM", "bytes", `max by (namespace, pod) (max_over_time(allocation:gpu_memory_used_bytes:max1m{` + held + `}[$__range]))`},
			column{"p95 activity", "percentunit", `max by (namespace, pod) (quantile_over_time(0.95, allocation:gpu_activity_ratio:avg1m{` + held + `}[$__range]))`},
			column{"Device-hours held", "none", `sum by (namespace, pod) (sum_over_time(allocation:gpu_devices:share{` + held + `}[$__range])) / 60`},
			column{"Busy device-hours", "none", `sum by (namespace, pod) (sum_over_time(allocation:gpu_activity_ratio:avg1m{` + held + `}[$__range])) / 60`},
			column{"Idle device-hours", "none", `sum by (namespace, pod) (sum_over_time(allocation:gpu_idle_devices:share{` + held + `}[$__range])) / 60`},
		)).
		WithPanel(timeseriesPanel("Busy and idle devices by namespace", "Devices its holders kept busy (each its own activity) and devices held by holders the exporter judges idle, by namespace: the gap between the two and the devices held is what right-sizing can give back.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (allocation:gpu_activity_ratio:avg1m{`+held+`})`, "{{namespace}} busy"),
			series(`sum by (namespace) (allocation:gpu_idle_devices:share{`+held+`})`, "{{namespace}} idle"),
		})).
		WithPanel(timeseriesPanel("GPUs on the bill and nobody's", "Every GPU of the chosen nodes (the bill: gpu_info, whatever holds it), the GPUs out of MIG mode that no container holds, and of those the ones on a cordoned node or unhealthy; whatever the namespace filter says, these are nobody's. `gpupool report` splits the unallocated GPU-hours by reason over a window (free, unheld time-sliced replicas, free MIG devices, the remainder of a MIG layout, unhealthy or cordoned), at MIG devices' cost shares, so that its rows add up to the bill (docs/rightsizing.md).", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`count(gpu_info{`+job+`, node=~"$node"}) or vector(0)`, "GPUs on the bill"),
			series(`count(`+unheldGPUs+`) or vector(0)`, "whole GPUs nobody holds"),
			series(`count(`+unheldGPUs+` and on (node, uuid) `+unavailableGPUs+`) or vector(0)`, "of them unhealthy or cordoned"),
		}))
	return d
}

// unheldGPUs are the GPUs out of MIG mode of the chosen nodes that no
// container holds.
const unheldGPUs = `group by (node, uuid) (gpu_info{` + job + `, node=~"$node", mig_mode!="enabled"})
  unless on (node, uuid) group by (node, uuid) (gpu_allocation_info{` + job + `, node=~"$node"})`

// unavailableGPUs are the GPUs no pod can be given: on a cordoned node
// (kube-state-metrics), or unhealthy as the exporter judges it (as
// gpupool report reads them).
const unavailableGPUs = `group by (node, uuid) (
    gpu_info{` + job + `, node=~"$node"} and on (node) (kube_node_spec_unschedulable == 1)
  or gpu_up{` + job + `, node=~"$node", gpu_instance=""} == 0
  or gpu_remapped_rows_failed{` + job + `, node=~"$node"} == 1
  or gpu_remapped_rows_pending{` + job + `, node=~"$node"} == 1
  or gpu_retired_pages_pending{` + job + `, node=~"$node"} == 1
  or gpu_recovery_action_code{` + job + `, node=~"$node"} > 0
)`

// sharedDevices are the devices with more than one holder (time-slicing or
// MPS replicas held by several containers).
const sharedDevices = `(count by (node, uuid, gpu_instance) (gpu_allocation_info{` + job + `, node=~"$node"}) > 1)`

// pendingInNamespaces: Pending pods of the chosen namespaces requesting GPUs.
const pendingInNamespaces = `
  max by (namespace, pod) (kube_pod_status_phase{phase="Pending", namespace=~"$namespace"}) == 1
and on (namespace, pod)
  max by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu", namespace=~"$namespace"}) > 0`
