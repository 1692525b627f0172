package boards

import (
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// pool filters node-pool recording rules by the $nodepool variable.
const pool = `nodepool=~"$nodepool"`

// onNodes filters exporter series by the $node variable.
const onNodes = job + `, node=~"$node"`

// pendingGPUPods: pods Pending that request GPUs (kube-state-metrics).
const pendingGPUPods = `
  max by (namespace, pod) (kube_pod_status_phase{phase="Pending"}) == 1
and on (namespace, pod)
  max by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"}) > 0`

func overview() *dashboard.DashboardBuilder {
	d := newDashboard("gpu-pool-overview", "GPU pools / Overview",
		"GPU capacity, allocation, idle allocations and their cost, fragmentation, stranded VRAM and health events per node pool (gpu-pool-exporter).").
		WithVariable(datasourceVar()).
		WithVariable(nodepoolVar()).
		WithVariable(nodeVar(true)).
		WithVariable(namespaceVar())

	// Capacity and allocation.
	d = d.WithRow(dashboard.NewRowBuilder("Capacity and allocation")).
		WithPanel(statPanel("GPUs", "Schedulable GPU units (whole GPUs and MIG instances) in the chosen node pools.", "none", 3, 4, nil,
			series(`sum(nodepool:gpu_devices:sum{`+pool+`}) or vector(0)`, "GPUs"))).
		WithPanel(statPanel("Allocated", "Units held by pods (the kubelet's view).", "none", 3, 4, nil,
			series(`sum(nodepool:gpu_devices:sum{`+pool+`, state="allocated"}) or vector(0)`, "allocated"))).
		WithPanel(statPanel("Free", "Healthy units no pod holds.", "none", 3, 4, thresholds("blue"),
			series(`sum(nodepool:gpu_devices:sum{`+pool+`, state="free"}) or vector(0)`, "free"))).
		WithPanel(statPanel("Unhealthy", "Units the exporter or the device plugin reports unhealthy.", "none", 3, 4, thresholds("green", step{1, "red"}),
			series(`sum(nodepool:gpu_devices:sum{`+pool+`, state="unhealthy"}) or vector(0)`, "unhealthy"))).
		WithPanel(statPanel("Allocated but idle", "Allocated units whose holder has not used them for the exporter's idle window.", "none", 3, 4, thresholds("green", step{1, "orange"}),
			series(`sum(nodepool:gpu_idle_allocated_devices:sum{`+pool+`}) or vector(0)`, "idle"))).
		WithPanel(statPanel("Idle cost", "What idle allocations cost per hour (where a GPU price is configured).", "currencyUSD", 3, 4, thresholds("green", step{1, "orange"}),
			series(`sum(nodepool:gpu_allocation_idle_cost_dollars_per_hour:sum{`+pool+`}) or vector(0)`, "$/h"))).
		WithPanel(statPanel("Capacity lost to device plugins", "Healthy units the kubelet does not advertise as allocatable (a dead device plugin: capacity 0 while pods still run). See GPUDevicePluginCapacityLoss.", "none", 3, 4, thresholds("green", step{1, "red"}),
			series(`sum(clamp_min(sum by (node) (gpu_healthy_devices{`+onNodes+`}) - sum by (node) (gpu_kubelet_allocatable_healthy_devices{`+onNodes+`}), 0)) or vector(0)`, "lost"))).
		WithPanel(statPanel("Pending GPU pods", "Pods Pending that request nvidia.com/gpu (kube-state-metrics), cluster-wide.", "none", 3, 4, thresholds("green", step{1, "orange"}),
			series(`count(`+pendingGPUPods+`) or vector(0)`, "pending"))).
		WithPanel(timeseriesPanel("GPUs by state", "Schedulable units by state, summed over the chosen node pools: quarantined are those of the nodes a remediator holds (GKE's XidCriticalError, NVSentinel's quarantine: alerts/remediators.yml), in no other state.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (state) (nodepool:gpu_devices:sum{`+pool+`})`, "{{state}}"),
		}, stacked)).
		WithPanel(timeseriesPanel("kubelet allocatable vs healthy, by pool", "What the kubelets advertise against the healthy units: allocatable below healthy means a device plugin lost capacity; above it means time-slicing replicas.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`nodepool:gpu_kubelet_allocatable_devices:sum{`+pool+`}`, "{{nodepool}} allocatable"),
			series(`nodepool:gpu_healthy_devices:sum{`+pool+`}`, "{{nodepool}} healthy"),
		})).
		WithPanel(tablePanel("Node pools", "Per node pool now.", 24, 7, []string{"nodepool"}, "Allocated",
			column{"Free", "none", `sum by (nodepool) (nodepool:gpu_devices:sum{` + pool + `, state="free"})`},
			column{"Allocated", "none", `sum by (nodepool) (nodepool:gpu_devices:sum{` + pool + `, state="allocated"})`},
			column{"Unhealthy", "none", `sum by (nodepool) (nodepool:gpu_devices:sum{` + pool + `, state="unhealthy"})`},
			column{"Quarantined", "none", `sum by (nodepool) (nodepool:gpu_devices:sum{` + pool + `, state="quarantined"}) or 0 * sum by (nodepool) (nodepool:gpu_devices:sum{` + pool + `})`},
			column{"Idle allocated", "none", `nodepool:gpu_idle_allocated_devices:sum{` + pool + `}`},
			column{"Avg utilisation", "percentunit", `nodepool:gpu_utilization_ratio:avg{` + pool + `}`},
			column{"VRAM used", "percentunit", `nodepool:gpu_memory_used_bytes:sum{` + pool + `} / nodepool:gpu_memory_total_bytes:sum{` + pool + `}`},
			column{"Stranded VRAM", "bytes", `nodepool:gpu_memory_stranded_bytes:sum{` + pool + `}`},
			column{"Fragmented GPUs F(M)", "none", `nodepool:gpu_fragmentation_weighted_gpus:sum{` + pool + `}`},
			column{"Idle cost $/h", "currencyUSD", `nodepool:gpu_allocation_idle_cost_dollars_per_hour:sum{` + pool + `}`},
		))

	// Where the next job fits: GPU node pools are zonal and GPUs scarce per
	// zone. Cordoned nodes, and nodes a remediator holds, add no free
	// capacity; the latter show as quarantined.
	d = d.WithRow(dashboard.NewRowBuilder("Capacity per zone")).
		WithPanel(timeseriesPanel("Free GPUs by zone and accelerator", "Free schedulable units (whole GPUs and MIG instances) on schedulable nodes, per zone (topology.kubernetes.io/zone) and accelerator.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (zone, accelerator) (nodepool_zone:gpu_free_devices:sum{`+pool+`})`, "{{zone}} {{accelerator}}"),
		}, stacked)).
		WithPanel(tablePanel("Jobs that fit now, per zone and task shape", "How many more jobs of each task shape (--fragmentation.shapes: GPUs per pod, or a MIG profile) fit on the schedulable nodes of each zone, each shape on its own.", 12, 8,
			[]string{"zone", "accelerator", "shape"}, "Jobs that fit",
			column{"Jobs that fit", "none", `sum by (zone, accelerator, shape) (nodepool_zone:gpu_fitting_jobs:sum{` + pool + `})`},
		)).
		WithPanel(tablePanel("Capacity per pool and zone", "Per node pool, zone and accelerator now: free units, the largest free group of whole GPUs in one NVLink domain on one node, allocated units whose holders are all idle, and the units of nodes a remediator holds (quarantined: in none of the others).", 24, 7,
			[]string{"nodepool", "zone", "accelerator"}, "Free",
			column{"Free", "none", `nodepool_zone:gpu_free_devices:sum{` + pool + `}`},
			column{"Largest free NVLink group", "none", `nodepool_zone:gpu_free_devices_largest_group:max{` + pool + `, domain="nvlink"}`},
			column{"Idle allocated", "none", `nodepool_zone:gpu_idle_allocated_devices:sum{` + pool + `}`},
			column{"Quarantined", "none", `sum by (nodepool, zone, accelerator) (nodepool_zone:gpu_quarantined_devices:sum{` + pool + `}) or 0 * sum by (nodepool, zone, accelerator) (nodepool_zone:gpu_free_devices:sum{` + pool + `})`},
		)).
		WithPanel(timeseriesPanel("Quarantined GPUs by remediator", "Units of the nodes a remediator holds (alerts/remediators.yml: GKE's XidCriticalError, NVSentinel's conditions, taint and label, node-problem-detector conditions), by remediator and zone: out of service, not free, not idle (a line none at 0 while nobody holds any). A GPU a DRA driver tainted counts as unhealthy instead.", "none", 24, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (remediator, zone) (nodepool_zone:gpu_quarantined_devices:sum{`+pool+`}) or label_replace(0 * sum by (zone) (nodepool_zone:gpu_free_devices:sum{`+pool+`}), "remediator", "none", "", "")`, "{{remediator}} {{zone}}"),
		}, stacked))

	// Utilisation.
	d = d.WithRow(dashboard.NewRowBuilder("Utilisation")).
		WithPanel(timeseriesPanel("GPU utilisation by pool", "Average NVML busy time of whole GPUs (MIG instances have none).", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`nodepool:gpu_utilization_ratio:avg{`+pool+`}`, "{{nodepool}}"),
		}, ratio)).
		WithPanel(timeseriesPanel("VRAM in use by pool", "Framebuffer used over total, whole GPUs.", "percentunit", 12, 8, []*prometheus.DataqueryBuilder{
			series(`nodepool:gpu_memory_used_bytes:sum{`+pool+`} / nodepool:gpu_memory_total_bytes:sum{`+pool+`}`, "{{nodepool}}"),
		}, ratio))

	// Idle allocations and their cost.
	d = d.WithRow(dashboard.NewRowBuilder("Idle allocations and cost")).
		WithPanel(timeseriesPanel("Idle allocated GPUs by pool", "Allocated units whose holder has not used them for the exporter's idle window.", "none", 8, 8, []*prometheus.DataqueryBuilder{
			series(`nodepool:gpu_idle_allocated_devices:sum{`+pool+`}`, "{{nodepool}}"),
		}, stacked)).
		WithPanel(timeseriesPanel("Idle cost by namespace", "Cost per hour of idle allocations on the chosen nodes, by namespace (time-shared GPUs split between their holders).", "currencyUSD", 8, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (allocation:gpu_idle_cost_dollars_per_hour:share{node=~"$node", namespace=~"$namespace"})`, "{{namespace}}"),
		}, stacked)).
		WithPanel(timeseriesPanel("Allocation cost by namespace", "Cost per hour of every allocation on the chosen nodes, by namespace.", "currencyUSD", 8, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (namespace) (allocation:gpu_cost_dollars_per_hour:share{node=~"$node", namespace=~"$namespace"})`, "{{namespace}}"),
		}, stacked)).
		WithPanel(tablePanel("Idle allocations now", "Holders idle now: idle time within the last 24 hours and what their share of the GPU costs per hour.", 24, 8,
			[]string{"namespace", "pod", "container", "node", "gpu", "mig_profile"}, "Idle in last 24h",
			column{"Idle in last 24h", "s", `
max by (namespace, pod, container, node, gpu, mig_profile) (
  increase(gpu_allocation_idle_seconds_total{` + onNodes + `, namespace=~"$namespace"}[24h])
  and on (node, uuid, gpu_instance, namespace, pod, container)
  (gpu_allocation_idle{` + onNodes + `, namespace=~"$namespace"} == 1)
)`},
			column{"Cost $/h", "currencyUSD", `
max by (namespace, pod, container, node, gpu, mig_profile) (
  allocation:gpu_idle_cost_dollars_per_hour:share{node=~"$node", namespace=~"$namespace"}
)`},
		))

	// Fragmentation and stranded capacity.
	d = d.WithRow(dashboard.NewRowBuilder("Fragmentation and stranded VRAM")).
		WithPanel(statPanel("Fragmented GPUs F(M)", "Weng et al. (ATC'23): unallocated GPU capacity that typical tasks cannot use, weighted by the popularity of task shapes, summed over nodes.", "none", 4, 4, thresholds("green", step{1, "orange"}),
			series(`sum(nodepool:gpu_fragmentation_weighted_gpus:sum{`+pool+`}) or vector(0)`, "F(M)"))).
		WithPanel(statPanel("Unallocated capacity", "Sum of each GPU's unallocated fraction.", "none", 4, 4, nil,
			series(`sum(nodepool:gpu_unallocated_capacity_gpus:sum{`+pool+`}) or vector(0)`, "GPUs"))).
		WithPanel(statPanel("Stranded VRAM", "Free VRAM on allocated GPUs: no other pod can use it under whole-GPU scheduling (MIG or time-sharing could).", "bytes", 4, 4, nil,
			series(`sum(nodepool:gpu_memory_stranded_bytes:sum{`+pool+`}) or vector(0)`, "stranded"))).
		WithPanel(barGaugePanel("Largest free GPU group per pool", "The most free GPUs inside one NVLink (or NUMA) domain on any node of the pool: the biggest multi-GPU pod that still fits.", "none", 12, 4,
			series(`nodepool:gpu_free_devices_largest_group:max{`+pool+`}`, "{{nodepool}} ({{domain}})").Instant())).
		WithPanel(timeseriesPanel("Fragmentation by task shape", "F(m) per task shape (GPUs per pod, or MIG profile), summed over the chosen pools.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (shape) (nodepool:gpu_fragmentation_gpus:sum{`+pool+`})`, "{{shape}}"),
		})).
		WithPanel(timeseriesPanel("Stranded VRAM by pool", "Free VRAM on allocated GPUs.", "bytes", 12, 8, []*prometheus.DataqueryBuilder{
			series(`nodepool:gpu_memory_stranded_bytes:sum{`+pool+`}`, "{{nodepool}}"),
		}, stacked)).
		WithPanel(tablePanel("Nodes", "Per node now: where free GPUs are, and how fragmented.", 24, 8, []string{"node"}, "Free",
			column{"Free", "none", `sum by (node) (gpu_devices{` + onNodes + `, state="free"})`},
			column{"Allocated", "none", `sum by (node) (gpu_devices{` + onNodes + `, state="allocated"})`},
			column{"Largest free NVLink group", "none", `max by (node) (gpu_free_devices_largest_group{` + onNodes + `, domain="nvlink"})`},
			column{"Free MIG slices", "none", `sum by (node) (gpu_mig_free_slices{` + onNodes + `})`},
			column{"Fragmented GPUs F(M)", "none", `sum by (node) (gpu_fragmentation_weighted_gpus{` + onNodes + `})`},
			column{"Stranded VRAM", "bytes", `sum by (node) (gpu_memory_stranded_bytes{` + onNodes + `})`},
			column{"Idle allocated", "none", `sum by (node) (gpu_idle_allocated_devices{` + onNodes + `})`},
		))

	// Health.
	d = d.WithRow(dashboard.NewRowBuilder("Health events")).
		WithPanel(statPanel("GPUs not answering", "GPUs whose last NVML sample failed (lost, hanging).", "none", 8, 4, thresholds("green", step{1, "red"}),
			series(`count(gpu_up{`+onNodes+`, gpu_instance=""} == 0) or vector(0)`, "down"))).
		WithPanel(statPanel("XID errors in the last hour", "XID errors in the chosen node pools, all actions.", "none", 8, 4, thresholds("green", step{1, "orange"}),
			series(`sum(nodepool:gpu_xid_errors:increase1h{`+pool+`}) or vector(0)`, "XIDs"))).
		WithPanel(statPanel("GPU alerts firing", "Alerts of gpu-pool-exporter's rules firing now.", "none", 8, 4, thresholds("green", step{1, "red"}),
			series(`count(ALERTS{alertstate="firing", alertname=~"GPU.*"}) or vector(0)`, "alerts"))).
		WithPanel(timeseriesPanel("XID errors by recommended action", "XID errors in the last hour (sliding window), by the catalog's recommended action: reset_gpu and reboot_node need an operator.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (action) (nodepool:gpu_xid_errors:increase1h{`+pool+`})`, "{{action}}"),
		})).
		WithPanel(tablePanel("XID errors per GPU", "XID errors in the last hour, per GPU and XID code.", 12, 8, []string{"node", "gpu", "xid", "category", "action"}, "Count",
			column{"Count", "none", `sum by (node, gpu, xid, category, action) (gpu_xid:gpu_xid_errors:increase1h{node=~"$node"}) > 0`},
		)).
		WithPanel(timeseriesPanel("Uncorrectable ECC errors, lost and throttled GPUs", "Uncorrectable ECC errors counted per interval, GPUs not answering, GPUs throttled by heat or power.", "none", 12, 8, []*prometheus.DataqueryBuilder{
			series(`sum by (node) (increase(gpu_ecc_errors_total{`+onNodes+`, error="uncorrected", scope="volatile"}[$__rate_interval]))`, "{{node}} uncorrectable ECC"),
			series(`count by (node) (gpu_up{`+onNodes+`, gpu_instance=""} == 0)`, "{{node}} GPUs down"),
			series(`count by (node) (gpu_clock_event_active{`+onNodes+`, reason=~"hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown|hw_slowdown|all"} == 1)`, "{{node}} GPUs throttled"),
		})).
		WithPanel(tablePanel("Firing GPU alerts", "gpu-pool-exporter alerts firing now.", 12, 8, []string{"alertname", "severity", "node", "gpu", "namespace", "pod"}, "",
			column{"Firing", "none", `ALERTS{alertstate="firing", alertname=~"GPU.*"}`},
		)).
		WithPanel(tablePanel("Driver versions by pool", "Nodes per NVIDIA driver version: more than one version in a pool is skew (GPUDriverVersionSkew).", 24, 6, []string{"nodepool", "driver_version", "cuda_driver_version"}, "",
			column{"Nodes", "none", `nodepool:gpu_driver_info:count{` + pool + `}`},
		))
	return d
}
