package rightsizing

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// The simulated fleet: what every exporter and kube-state-metrics served
// over a week, as OpenMetrics samples on a four-minute grid. Every curve
// is a step function of grid time, written so that its p95, peak and sums
// over the window can be worked out by hand (backfill_test.go does, in
// comments beside the expected answers).

// gridStep is the spacing of the fixture's samples and of the rules'
// backfilled evaluations: under Prometheus' five-minute lookback, so that
// every step of a query sees the latest sample.
const gridStep = 4 * time.Minute

const gib = 1 << 30

// The models and their memory as NVML reports it.
const (
	h100       = "NVIDIA H100 80GB HBM3"
	l4         = "NVIDIA L4"
	a100       = "NVIDIA A100-SXM4-80GB"
	t4         = "Tesla T4"
	h100Memory = 85899345920 // 80 GiB
	l4Memory   = 24152899584 // 23034 MiB
	a100Memory = 85899345920 // 81920 MiB
	t4Memory   = 16106127360 // 15360 MiB
)

// The MIG devices of gpu-d, with the memory NVML reports for them on an H100.
const (
	mig3gMemory = 42412802048
	mig2gMemory = 21072183296
	mig1gMemory = 10468982784
)

// curve is a series' value at a grid time; false: no sample.
type curve func(t time.Time) (float64, bool)

func constant(v float64) curve { return func(time.Time) (float64, bool) { return v, true } }

// timeline is the fixture's clock: samples from start to end, on the grid.
type timeline struct {
	start, end time.Time
}

// fleet is the fixture's series by family.
type fleet struct {
	tl       timeline
	families map[string][]series // exporter series
	ksm      map[string][]series // kube-state-metrics series
	// unhealthyFrom: GPUs (by uuid) lost from a time on (gpu_up 0);
	// cordonedFrom: nodes cordoned from a time on.
	unhealthyFrom, cordonedFrom map[string]time.Time
	// holders of each device (by its labels), for their shares
	holders map[string][]holder
}

type series struct {
	labels   string // name="value", ... in this order
	from, to time.Time
	value    curve
}

func labelString(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", kv[i], kv[i+1])
	}
	return b.String()
}

func (f *fleet) add(family string, s series) {
	f.families[family] = append(f.families[family], s)
}

func (f *fleet) addKSM(family string, s series) {
	f.ksm[family] = append(f.ksm[family], s)
}

// lastHour: series the commands only read at the window's end (device
// facts, prices, kube-state-metrics' objects).
func (f *fleet) lastHour() (time.Time, time.Time) { return f.tl.end.Add(-time.Hour), f.tl.end }

// device is one GPU or MIG device of an exporter's node.
type device struct {
	node, gpu, uuid, gi, ci, profile string
}

func (d device) labels(kv ...string) string {
	return labelString(append([]string{"job", "gpu-pool-exporter", "instance", d.node + ":9947", "node", d.node,
		"gpu", d.gpu, "uuid", d.uuid, "gpu_instance", d.gi, "compute_instance", d.ci, "mig_profile", d.profile}, kv...)...)
}

// holder is a container holding a device, and what it did.
type holder struct {
	dev                       device
	namespace, pod, container string
	resource                  string
	from, to                  time.Time
	gap                       [2]time.Time // no sample of it in [gap[0], gap[1])
	activity, memory          curve
	idle                      bool
	// owner declares the pod's kube-state-metrics objects while it runs
	// (a pod gone before the window's end is in them only until then).
	owner func(from, to time.Time)
	// activitySource: "dcgm" (its device's gpu_sm_active_ratio), "device"
	// (NVML busy time of a GPU it holds alone) or "processes" (its own on
	// a shared GPU); the latter two are gpu_container_utilization_ratio.
	activitySource string
}

func (h holder) gapped(c curve) curve {
	return func(t time.Time) (float64, bool) {
		if !t.Before(h.gap[0]) && t.Before(h.gap[1]) {
			return 0, false
		}
		return c(t)
	}
}

func (f *fleet) hold(h holder) {
	if h.from.IsZero() {
		h.from = f.tl.start
	}
	if h.to.IsZero() {
		h.to = f.tl.end
	}
	who := []string{"namespace", h.namespace, "pod", h.pod, "container", h.container}
	idle := 0.0
	if h.idle {
		idle = 1
	}
	f.add("gpu_allocation_info", series{h.dev.labels(append(who, "resource", h.resource)...), h.from, h.to, h.gapped(constant(1))})
	// Its share: 1/n of the device's n holders at the time (read once
	// every holder is declared).
	if f.holders == nil {
		f.holders = map[string][]holder{}
	}
	key := h.dev.labels()
	f.holders[key] = append(f.holders[key], h)
	f.add("gpu_allocation_share_ratio", series{h.dev.labels(append(who, "resource", h.resource)...), h.from, h.to, h.gapped(func(t time.Time) (float64, bool) {
		n := 0
		for _, o := range f.holders[key] {
			if _, ok := o.gapped(constant(1))(t); ok && !t.Before(o.from) && !t.After(o.to) {
				n++
			}
		}
		return 1 / float64(n), n > 0
	})})
	if h.owner != nil {
		h.owner(h.from, h.to)
	}
	f.add("gpu_allocation_idle", series{h.dev.labels(append(who, "resource", h.resource)...), h.from, h.to, h.gapped(constant(idle))})
	f.add("gpu_container_memory_used_bytes", series{h.dev.labels(who...), h.from, h.to, h.gapped(h.memory)})
	// The exporter's pick of the two below (its device's SM activity for
	// a holder alone on it with DCGM, else its own), which the rules read.
	f.add("gpu_allocation_activity_ratio", series{h.dev.labels(who...), h.from, h.to, h.gapped(h.activity)})
	switch h.activitySource {
	case "dcgm":
		f.add("gpu_sm_active_ratio", series{h.dev.labels(), h.from, h.to, h.gapped(h.activity)})
	default:
		f.add("gpu_container_utilization_ratio", series{h.dev.labels(append(who, "source", h.activitySource)...), h.from, h.to, h.gapped(h.activity)})
	}
}

// gpu declares a physical GPU: gpu_info and gpu_up all along (what the
// bill counts, and its health), its memory and price (a negative price:
// none) at the end.
func (f *fleet) gpu(d device, model string, memory float64, price float64, migMode string) {
	f.add("gpu_info", series{d.labels("model", model, "mig_mode", migMode, "device", "nvidia"+d.gpu, "pci_bus_id", "00000000:"+d.gpu+"0:00.0"), f.tl.start, f.tl.end, constant(1)})
	f.add("gpu_up", series{d.labels(), f.tl.start, f.tl.end, func(t time.Time) (float64, bool) {
		if !f.unhealthyFrom[d.uuid].IsZero() && !t.Before(f.unhealthyFrom[d.uuid]) {
			return 0, true
		}
		return 1, true
	}})
	from, to := f.lastHour()
	f.add("gpu_memory_total_bytes", series{d.labels(), from, to, constant(memory)})
	if migMode != "enabled" && price >= 0 {
		f.add("gpu_price_dollars_per_hour", series{d.labels("model", model), from, to, constant(price)})
	}
}

// migDevice declares a MIG device: gpu_mig_info all along, its memory at
// the end.
func (f *fleet) migDevice(d device, memory float64) {
	f.add("gpu_mig_info", series{d.labels("mig_uuid", "MIG-"+d.uuid+"-"+d.gi), f.tl.start, f.tl.end, constant(1)})
	from, to := f.lastHour()
	f.add("gpu_memory_total_bytes", series{d.labels(), from, to, constant(memory)})
}

// node declares an exporter's node: up, and its kube-state-metrics node
// object (pool, accelerator and other labels, GPU capacity at the end,
// and whether it is cordoned, all along).
func (f *fleet) node(name, pool, accelerator string, capacity float64, extraLabels ...string) {
	from, to := f.lastHour()
	f.add("up", series{labelString("job", "gpu-pool-exporter", "instance", name+":9947", "node", name), from, to, constant(1)})
	f.addKSM("kube_node_labels", series{labelString(append([]string{"job", "kube-state-metrics", "node", name,
		"label_cloud_google_com_gke_nodepool", pool, "label_cloud_google_com_gke_accelerator", accelerator}, extraLabels...)...), from, to, constant(1)})
	f.addKSM("kube_node_status_capacity", series{labelString("job", "kube-state-metrics", "node", name, "resource", "nvidia_com_gpu", "unit", "integer"), from, to, constant(capacity)})
	f.addKSM("kube_node_spec_unschedulable", series{labelString("job", "kube-state-metrics", "node", name), f.tl.start, f.tl.end, func(t time.Time) (float64, bool) {
		if !f.cordonedFrom[name].IsZero() && !t.Before(f.cordonedFrom[name]) {
			return 1, true
		}
		return 0, true
	}})
}

// owner declares a pod's controller and its team label at the window's end.
func (f *fleet) owner(namespace, pod, kind, name, team string) {
	from, to := f.lastHour()
	f.ownerDuring(from, to, namespace, pod, kind, name, team)
}

// ownerDuring declares a pod's controller and its team label while it runs.
func (f *fleet) ownerDuring(from, to time.Time, namespace, pod, kind, name, team string) {
	controller := "true"
	if kind == "<none>" {
		controller = "<none>"
	}
	f.addKSM("kube_pod_owner", series{labelString("job", "kube-state-metrics", "namespace", namespace, "pod", pod, "uid", "uid-"+pod,
		"owner_kind", kind, "owner_name", name, "owner_is_controller", controller), from, to, constant(1)})
	f.addKSM("kube_pod_labels", series{labelString("job", "kube-state-metrics", "namespace", namespace, "pod", pod, "uid", "uid-"+pod, "label_team", team), from, to, constant(1)})
}

func (f *fleet) replicaSet(namespace, rs, deployment string) {
	from, to := f.lastHour()
	f.addKSM("kube_replicaset_owner", series{labelString("job", "kube-state-metrics", "namespace", namespace, "replicaset", rs,
		"owner_kind", "Deployment", "owner_name", deployment, "owner_is_controller", "true"), from, to, constant(1)})
}

func (f *fleet) job(namespace, job, kind, name string) {
	from, to := f.lastHour()
	f.jobDuring(from, to, namespace, job, kind, name)
}

func (f *fleet) jobDuring(from, to time.Time, namespace, job, kind, name string) {
	f.addKSM("kube_job_owner", series{labelString("job", "kube-state-metrics", "namespace", namespace, "job_name", job,
		"owner_kind", kind, "owner_name", name, "owner_is_controller", "true"), from, to, constant(1)})
}

// writeOpenMetrics writes the samples of families in [from, to) as
// OpenMetrics: one family at a time, each series' samples in time order,
// timestamps in seconds to the millisecond.
func writeOpenMetrics(path string, tl timeline, from, to time.Time, families map[string][]series) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "# TYPE %s gauge\n", name)
		for _, s := range families[name] {
			writeSeries(w, name, tl, from, to, s)
		}
	}
	fmt.Fprintln(w, "# EOF")
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func writeSeries(w io.Writer, name string, tl timeline, from, to time.Time, s series) {
	for t := tl.start; !t.After(tl.end); t = t.Add(gridStep) {
		if t.Before(s.from) || t.After(s.to) || t.Before(from) || !t.Before(to) {
			continue
		}
		v, ok := s.value(t)
		if !ok {
			continue
		}
		ms := t.UnixMilli()
		fmt.Fprintf(w, "%s{%s} %g %d.%03d\n", name, s.labels, v, ms/1000, ms%1000)
	}
}
