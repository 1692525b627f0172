package collector_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// holders lists gpu_allocation_info as "gpu/gi ns/pod/container" strings.
func holders(p *collector.Page) []string {
	var out []string
	for _, l := range series(p, "gpu_allocation_info") {
		lab := parseLabels(l)
		out = append(out, lab["gpu"]+"/"+lab["gpu_instance"]+" "+lab["namespace"]+"/"+lab["pod"]+"/"+lab["container"])
	}
	sort.Strings(out)
	return out
}

func parseLabels(line string) map[string]string {
	m := map[string]string{}
	i, j := strings.Index(line, "{"), strings.LastIndex(line, "}")
	if i < 0 || j < i {
		return m
	}
	for _, kv := range strings.Split(line[i+1:j], "\",") {
		k, v, _ := strings.Cut(kv, "=\"")
		m[k] = strings.TrimSuffix(v, "\"")
	}
	return m
}

func TestAllocationsOnSimulatedNode(t *testing.T) {
	p := newPodNode(t, nil).step(t, time.Second)
	got := strings.Join(holders(p), "\n")
	want := strings.Join([]string{
		"0/ ml-training/llm-pretrain-0/trainer",
		"1/ ml-training/llm-pretrain-0/trainer",
		"2/ ml-training/llm-pretrain-1/trainer",
		"3/ ml-training/llm-pretrain-1/trainer",
		"4/ research/notebook-alice/jupyter",
		"6/ inference/chat-api-0/server",
		"6/ inference/chat-api-1/server",
		"6/ inference/chat-api-2/server",
		"7/2 ml-training/finetune-small/trainer",
		"7/3 inference/embeddings-0/server",
		"7/9 research/dev-shell-bob/shell",
	}, "\n")
	if got != want {
		t.Errorf("holders:\n%s\nwant:\n%s", got, want)
	}
	for _, c := range []struct {
		name  string
		match []string
		want  string
	}{
		{"gpu_devices", []string{`state="allocated"`}, "9"},
		{"gpu_devices", []string{`state="free"`}, "2"},
		{"gpu_devices", []string{`state="unhealthy"`}, "0"},
		{"gpu_healthy_devices", nil, "11"},
		{"gpu_kubelet_allocatable_healthy_devices", nil, "11"},
		{"gpu_kubelet_allocatable_devices", []string{`resource="nvidia.com/gpu"`}, "6"},
		{"gpu_kubelet_allocatable_devices", []string{`resource="nvidia.com/gpu.shared"`}, "4"},
		{"gpu_kubelet_allocatable_devices", []string{`resource="nvidia.com/mig-1g.10gb"`}, "2"},
		{"gpu_exporter_collector_up", []string{`collector="podmap"`}, "1"},
	} {
		t.Run(fmt.Sprint(c.name, c.match), func(t *testing.T) {
			if v := value(t, p, c.name, c.match...); v != c.want {
				t.Errorf("%s%v = %s, want %s", c.name, c.match, v, c.want)
			}
		})
	}
	// Per-container series only for devices held alone: not the time-sliced GPU 6.
	if s := series(p, "gpu_container_memory_used_bytes", `gpu="6"`); len(s) != 0 {
		t.Errorf("a shared GPU's memory is credited to containers: %v", s)
	}
	if s := series(p, "gpu_container_memory_used_bytes", `pod="finetune-small"`, `gpu_instance="2"`, `mig_profile="3g.40gb"`); len(s) != 1 {
		t.Errorf("MIG holder lacks its memory series: %v", s)
	}
	if s := series(p, "gpu_container_utilization_ratio", `pod="llm-pretrain-0"`); len(s) != 2 {
		t.Errorf("exclusive holder's utilisation series: %v", s)
	}
	// Device series keep identity labels only.
	for _, l := range series(p, "gpu_memory_used_bytes") {
		if strings.Contains(l, "pod=") || strings.Contains(l, "namespace=") {
			t.Errorf("device series carries pod labels: %s", l)
		}
	}
}

func TestGKEFlavourMapsToSamePods(t *testing.T) {
	uuidFlavour := holders(newPodNode(t, nil).step(t, time.Second))
	gke := simnode.DefaultScenario()
	gke.Node.Flavour = "gke"
	gke.Node.MinorNumbers = []int{3, 2, 1, 0, 7, 6, 5, 4} // minor numbers are not indices
	pn := newPodNode(t, gke)
	p := pn.step(t, time.Second)
	if got := holders(p); strings.Join(got, "\n") != strings.Join(uuidFlavour, "\n") {
		t.Errorf("GKE flavour holders:\n%s\nUUID flavour:\n%s", strings.Join(got, "\n"), strings.Join(uuidFlavour, "\n"))
	}
	ids := ""
	for _, pod := range pn.node.KubeletPods() {
		for _, c := range pod.Containers {
			for _, d := range c.Devices {
				ids += strings.Join(d.IDs, ",") + " "
			}
		}
	}
	for _, want := range []string{"nvidia3", "nvidia5/vgpu1", "nvidia4/gi2"} { // GPU 0 is nvidia3, GPU 6 nvidia5, GPU 7 nvidia4
		if !strings.Contains(ids, want) {
			t.Errorf("GKE device IDs %q lack %s", ids, want)
		}
	}
	if s := series(p, "gpu_kubelet_unmatched_device_ids"); len(s) != 0 {
		t.Errorf("unmatched IDs on the GKE flavour: %v", s)
	}
}

func TestPodLeavingListLeavesNextRender(t *testing.T) {
	sc := scenario(t, `
node: {count: 2}
pods:
  - {namespace: a, name: short-job, stop: 30s, containers: [{name: c, devices: [{gpu: 0}]}]}
  - {namespace: a, name: next-job, start: 30s, containers: [{name: c, devices: [{gpu: 0}]}]}
`)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	if got := holders(p); len(got) != 1 || !strings.Contains(got[0], "short-job") {
		t.Fatalf("before: %v", got)
	}
	p = pn.step(t, 40*time.Second)
	if got := holders(p); len(got) != 1 || !strings.Contains(got[0], "next-job") {
		t.Errorf("after the pod left: %v", got)
	}
	if strings.Contains(string(p.Plain), "short-job") {
		t.Error("a series of the gone pod lingers")
	}
}

func TestKubeletGoneKeepsDeviceMetrics(t *testing.T) {
	pn := newPodNode(t, nil)
	pn.step(t, time.Second)
	pn.kube.Stop()
	p := pn.step(t, 5*time.Second)
	if v := value(t, p, "gpu_exporter_collector_up", `collector="podmap"`); v != "0" {
		t.Errorf("podmap up = %s with the kubelet gone", v)
	}
	if n := len(series(p, "gpu_memory_used_bytes")); n != 12 {
		t.Errorf("%d memory series with the kubelet gone, want 12", n)
	}
	rec := httptest.NewRecorder()
	pn.e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Errorf("scrape answered %d", rec.Code)
	}
	if err := pn.kube.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod mapping to recover after the kubelet came back", func() bool {
		p = pn.step(t, time.Second)
		return value(t, p, "gpu_exporter_collector_up", `collector="podmap"`) == "1" && len(holders(p)) == 11
	})
}

func TestNoKubeletCallOnScrapePath(t *testing.T) {
	pn := newPodNode(t, nil)
	pn.step(t, time.Second)
	before := pn.kube.Calls()
	if before == 0 {
		t.Fatal("the fake kubelet counted no calls; the counter is broken")
	}
	srv := httptest.NewServer(pn.e)
	defer srv.Close()
	for i := 0; i < 50; i++ {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if after := pn.kube.Calls(); after != before {
		t.Errorf("50 scrapes made %d kubelet calls; want 0", after-before)
	}
}

func TestDevicePluginCapacityLoss(t *testing.T) {
	sc := simnode.DefaultScenario()
	sc.Faults = append(sc.Faults, simnode.FaultSpec{At: simnode.Duration(20 * time.Second), DevicePlugin: &simnode.DevicePluginFault{Allocatable: 0}})
	pn := newPodNode(t, sc)
	pn.step(t, time.Second)
	p := pn.step(t, 30*time.Second)
	for _, l := range series(p, "gpu_kubelet_allocatable_devices") {
		if !strings.HasSuffix(l, " 0") {
			t.Errorf("allocatable not 0 after the device plugin lost its devices: %s", l)
		}
	}
	if v := value(t, p, "gpu_healthy_devices"); v != "11" {
		t.Errorf("healthy devices %s, want 11", v)
	}
	if v := value(t, p, "gpu_kubelet_allocatable_healthy_devices"); v != "0" {
		t.Errorf("allocatable healthy devices %s after the plugin lost them, want 0", v)
	}
	if n := len(holders(p)); n != 11 {
		t.Errorf("pods keep running: %d holders, want 11", n)
	}
}

func TestPartialDevicePluginLoss(t *testing.T) {
	sc := simnode.DefaultScenario()
	// The plugin keeps only 8 of its 14 device IDs, in resource order: the
	// six of nvidia.com/gpu, two of the four replicas of GPU 6 on
	// nvidia.com/gpu.shared, none of the MIG instances. 8 IDs look close to
	// the 11 healthy devices; in devices it is 6 + 1 = 7, and MIG is gone.
	sc.Faults = append(sc.Faults, simnode.FaultSpec{At: simnode.Duration(20 * time.Second), DevicePlugin: &simnode.DevicePluginFault{Allocatable: 8}})
	pn := newPodNode(t, sc)
	p := pn.step(t, 30*time.Second)
	total := 0.0
	for _, l := range series(p, "gpu_kubelet_allocatable_devices") {
		v, _ := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		total += v
	}
	if total != 8 {
		t.Fatalf("allocatable IDs %v, want 8", total)
	}
	if v := value(t, p, "gpu_kubelet_allocatable_healthy_devices"); v != "7" {
		t.Errorf("allocatable healthy devices %s, want 7", v)
	}
}

// A GPU instance split into two compute instances is two
// MIG devices. Their series must differ (the registry refused the page
// when both had the same labels) and each pod's allocation must resolve to
// its own compute instance.
func TestTwoComputeInstancesInOneGPUInstance(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-40GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.20gb, computeInstances: 2}]
pods:
  - {namespace: a, name: pod-a, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: b, name: pod-b, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
`)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	if ready, why := pn.e.Ready(); !ready {
		t.Fatalf("not ready: %s", why)
	}
	for _, ci := range []string{"0", "1"} {
		if v := value(t, p, "gpu_up", `gpu_instance="`, `compute_instance="`+ci+`"`); v != "1" {
			t.Errorf("compute instance %s: gpu_up %s", ci, v)
		}
	}
	info := series(p, "gpu_allocation_info")
	if len(info) != 2 {
		t.Fatalf("allocations: %v", info)
	}
	for _, l := range info {
		lb := parseLabels(l)
		want := map[string]string{"a": "0", "b": "1"}[lb["namespace"]]
		if lb["compute_instance"] != want {
			t.Errorf("%s holds compute instance %q, want %q", lb["namespace"], lb["compute_instance"], want)
		}
	}
}

// freeDevices is gpu_kubelet_free_devices by resource.
func freeDevices(p *collector.Page) map[string]string {
	out := map[string]string{}
	for _, l := range series(p, "gpu_kubelet_free_devices") {
		i, j := strings.Index(l, `resource="`)+len(`resource="`), strings.LastIndex(l, `"}`)
		out[l[i:j]] = l[strings.LastIndex(l, " ")+1:]
	}
	return out
}

// What the scheduler can still place, per resource (the Pending-pod alerts
// compare requests with it). By hand from the default scenario: GPUs 0-4
// held, 5 free; GPU 6 time-sliced into 4 replicas, 3 held; GPU 7's MIG
// instances 3g (held), 2g (held), 1g (held), 1g (free).
func TestFreeDevicesPerResource(t *testing.T) {
	sc := simnode.DefaultScenario()
	five := 5
	sc.Faults = append(sc.Faults, simnode.FaultSpec{At: simnode.Duration(20 * time.Second), GPU: &five, Lost: true})
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	want := map[string]string{
		"nvidia.com/gpu":         "1",
		"nvidia.com/gpu.shared":  "1", // a free replica is free capacity for gpu.shared pods
		"nvidia.com/mig-1g.10gb": "1",
		"nvidia.com/mig-2g.20gb": "0",
		"nvidia.com/mig-3g.40gb": "0",
	}
	if got := freeDevices(p); !maps.Equal(got, want) {
		t.Errorf("gpu_kubelet_free_devices = %v, want %v", got, want)
	}
	// GPU 5 is lost: the kubelet may still list it, but nothing can run there.
	p = pn.step(t, 30*time.Second)
	if got := freeDevices(p)["nvidia.com/gpu"]; got != "0" {
		t.Errorf("free nvidia.com/gpu with the only free GPU lost = %s, want 0", got)
	}
}

// podMapGauges are the gauges that say what is free or idle: they need to
// know who holds what.
var podMapGauges = []string{
	`gpu_devices{state="free"}`, `gpu_devices{state="allocated"}`,
	"gpu_memory_stranded_bytes", "gpu_free_devices_largest_group",
	"gpu_fragmentation_gpus", "gpu_fragmentation_weighted_gpus", "gpu_fitting_jobs",
	"gpu_unallocated_capacity_gpus", "gpu_idle_allocated_devices",
	"gpu_kubelet_free_devices",
	// The default node has a time-sliced GPU (6) and a GPU nobody holds (5).
	"gpu_shared_device_holders", "gpu_shared_device_memory_used_bytes", "gpu_shared_device_memory_total_bytes",
	"gpu_unallocated_info",
}

// present lists which of podMapGauges the page has.
func present(p *collector.Page) []string {
	var out []string
	for _, g := range podMapGauges {
		name, sel, _ := strings.Cut(g, "{")
		var want []string
		if sel != "" {
			want = append(want, strings.TrimSuffix(sel, "}"))
		}
		if len(series(p, name, want...)) > 0 {
			out = append(out, g)
		}
	}
	return out
}

// While the pod map is unknown, a node must not look empty: no free
// devices, no stranded VRAM of 0, no fragmentation saying all is free. What
// does not depend on it stays: unhealthy devices, MIG slices.
func TestPodMapUnknownLeavesOutCapacityGauges(t *testing.T) {
	// No kubelet at all (no pod source: socket missing, bare metal).
	e, _ := newExporter(t, nil, newClock(), nil)
	e.SampleOnce(context.Background())
	p := e.Page()
	if got := present(p); len(got) != 0 {
		t.Errorf("without a pod map the page has %v", got)
	}
	for _, keep := range []string{`gpu_devices{state="unhealthy"}`, "gpu_mig_free_slices", "gpu_healthy_devices"} {
		name, sel, _ := strings.Cut(keep, "{")
		var want []string
		if sel != "" {
			want = append(want, strings.TrimSuffix(sel, "}"))
		}
		if len(series(p, name, want...)) == 0 {
			t.Errorf("%s is gone without a pod map; it does not depend on it", keep)
		}
	}

	// A kubelet that answered, then went away for longer than five minutes.
	pn := newPodNode(t, nil)
	p = pn.step(t, time.Second)
	if got := present(p); len(got) != len(podMapGauges) {
		t.Fatalf("with a kubelet the page has only %v of %v", got, podMapGauges)
	}
	pn.kube.Stop()
	p = pn.step(t, 4*time.Minute) // down, last answer 4 minutes old: still known
	if got := present(p); len(got) != len(podMapGauges) {
		t.Errorf("kubelet down for 4m: the page has only %v", got)
	}
	p = pn.step(t, 2*time.Minute)
	if got := present(p); len(got) != 0 {
		t.Errorf("kubelet down for 6m: the page still has %v", got)
	}
}

// "Unhealthy" is what cannot take new work, not only what NVML lost: a GPU
// whose row remapping failed (the alerts say replace it) or that waits for a
// reset is never free capacity. Default scenario: GPU 5 (free) fails row
// remapping, GPU 4 (held) has rows pending remap, GPU 3 (held) asks for a
// GPU reset (NVML recovery action).
func TestUnhealthyIncludesRemapFailureAndPendingReset(t *testing.T) {
	sc := simnode.DefaultScenario()
	three, four, five := 3, 4, 5
	sc.Faults = append(sc.Faults,
		simnode.FaultSpec{At: simnode.Duration(10 * time.Second), GPU: &five, Remap: &simnode.RemapFault{Uncorrectable: 1, Failed: true}},
		simnode.FaultSpec{At: simnode.Duration(10 * time.Second), GPU: &four, Remap: &simnode.RemapFault{Uncorrectable: 1, Pending: true}},
		simnode.FaultSpec{At: simnode.Duration(10 * time.Second), GPU: &three, RecoveryAction: "gpu_reset"},
	)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	if v := value(t, p, "gpu_devices", `state="unhealthy"`); v != "0" {
		t.Fatalf("unhealthy before the faults: %s", v)
	}
	p = pn.step(t, 30*time.Second)
	for state, want := range map[string]string{"unhealthy": "3", "free": "1", "allocated": "7"} {
		t.Run(state, func(t *testing.T) {
			if v := value(t, p, "gpu_devices", `state="`+state+`"`); v != want {
				t.Errorf("gpu_devices{state=%q} = %s, want %s", state, v, want)
			}
		})
	}
	if v := value(t, p, "gpu_healthy_devices"); v != "8" {
		t.Errorf("gpu_healthy_devices = %s, want 8", v)
	}
	if got := freeDevices(p)["nvidia.com/gpu"]; got != "0" {
		t.Errorf("free nvidia.com/gpu = %s with the only free GPU's remapping failed, want 0", got)
	}
}

// The namespace figures are what the rules computed from the page's own
// series: each holder's share (1 over the holders of its device, counted
// on (uuid, gpu_instance, compute_instance) as gpu_allocation_info lists
// them) summed per namespace, and weighted by the device's
// gpu_utilization_ratio where it has one.
func TestNamespaceDevicesOnSimulatedNode(t *testing.T) {
	p := newPodNode(t, nil).step(t, time.Second)
	type unit struct{ uuid, gi, ci string }
	holdersOf := map[unit]int{}
	for _, l := range series(p, "gpu_allocation_info") {
		lab := parseLabels(l)
		holdersOf[unit{lab["uuid"], lab["gpu_instance"], lab["compute_instance"]}]++
	}
	util := map[unit]float64{}
	for _, l := range series(p, "gpu_utilization_ratio") {
		lab := parseLabels(l)
		v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		util[unit{lab["uuid"], lab["gpu_instance"], lab["compute_instance"]}] = v
	}
	alloc, busy, measured := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, l := range series(p, "gpu_allocation_info") {
		lab := parseLabels(l)
		u := unit{lab["uuid"], lab["gpu_instance"], lab["compute_instance"]}
		share := 1 / float64(holdersOf[u])
		alloc[lab["namespace"]] += share
		if v, ok := util[u]; ok {
			busy[lab["namespace"]] += share * v
			measured[lab["namespace"]] += share
		}
	}
	// Each holder's share as the exporter serves it: 1/n of a device n
	// containers hold, one series per gpu_allocation_info series.
	shares := map[string]float64{}
	for _, l := range series(p, "gpu_allocation_share_ratio") {
		v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		shares[l[strings.Index(l, "{"):strings.LastIndex(l, " ")]] = v
	}
	infos := series(p, "gpu_allocation_info")
	if len(shares) != len(infos) {
		t.Errorf("%d gpu_allocation_share_ratio series for %d gpu_allocation_info series", len(shares), len(infos))
	}
	third := false
	for _, l := range infos {
		lab := parseLabels(l)
		want := 1 / float64(holdersOf[unit{lab["uuid"], lab["gpu_instance"], lab["compute_instance"]}])
		third = third || near(want, 1.0/3)
		if v, ok := shares[l[strings.Index(l, "{"):strings.LastIndex(l, " ")]]; !ok || !near(v, want) {
			t.Errorf("share of %s/%s/%s on GPU %s: %v (served: %v), want %v", lab["namespace"], lab["pod"], lab["container"], lab["gpu"], v, ok, want)
		}
	}
	if !third {
		t.Error("no device held three ways: the simulated node no longer covers a shared device")
	}
	// GPUs 0-3 and a 3g.40gb; GPU 6 split three ways and a 2g.20gb; GPU 4
	// and a 1g.10gb. MIG devices have no busy ratio.
	for ns, want := range map[string][2]float64{"ml-training": {5, 4}, "inference": {2, 1}, "research": {2, 1}} {
		if !near(alloc[ns], want[0]) || !near(measured[ns], want[1]) {
			t.Fatalf("%s from the page's series: %v allocated, %v measured; want %v (has the simulated node changed?)", ns, alloc[ns], measured[ns], want)
		}
	}
	for name, want := range map[string]map[string]float64{
		"gpu_namespace_allocated_devices":            alloc,
		"gpu_namespace_busy_devices":                 busy,
		"gpu_namespace_utilization_measured_devices": measured,
	} {
		if got := len(series(p, name)); got != len(want) {
			t.Errorf("%s: %d series, want %d (one per namespace): %v", name, got, len(want), series(p, name))
		}
		for ns, w := range want {
			if v := num(t, p, name, `namespace="`+ns+`"`); !near(v, w) {
				t.Errorf("%s{namespace=%q} = %v, want %v", name, ns, v, w)
			}
		}
	}
}

// A namespace that holds MIG devices only (no busy ratio) has its
// allocated devices and no busy or measured series: 0 of 0 is no
// utilization, not 0%. Two compute instances of one GPU instance, held by
// two pods, are a device each.
func TestNamespaceDevicesMIGOnly(t *testing.T) {
	sc, err := simnode.ParseScenario("ns.yaml", []byte(`
node: {model: A100-SXM4-80GB, count: 2}
gpus:
  - {index: 0, mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 4g.40gb}]}
pods:
  - {namespace: mig-only, name: p0, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: mig-only, name: p1, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
  - {namespace: whole, name: w, containers: [{name: c, devices: [{gpu: 1}]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	tn := newTestExporter(t, withScenario(sc), withRealTime(), withKubelet())
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	tn.e.SampleOnce(context.Background())
	p := tn.e.Page()
	if v := num(t, p, "gpu_namespace_allocated_devices", `namespace="mig-only"`); v != 2 {
		t.Errorf("mig-only allocated %v, want 2 (a device per compute instance)", v)
	}
	if v := num(t, p, "gpu_namespace_allocated_devices", `namespace="whole"`); v != 1 {
		t.Errorf("whole allocated %v, want 1", v)
	}
	for _, name := range []string{"gpu_namespace_busy_devices", "gpu_namespace_utilization_measured_devices"} {
		if s := series(p, name, `namespace="mig-only"`); len(s) != 0 {
			t.Errorf("%s for a namespace with MIG devices only: %v", name, s)
		}
	}
	if v := num(t, p, "gpu_namespace_utilization_measured_devices", `namespace="whole"`); v != 1 {
		t.Errorf("whole measured %v, want 1", v)
	}
	if b, u := num(t, p, "gpu_namespace_busy_devices", `namespace="whole"`), num(t, p, "gpu_utilization_ratio", `gpu="1"`); !near(b, u) {
		t.Errorf("whole busy %v, want GPU 1's busy ratio %v", b, u)
	}
}

// The holder's activity the exporter serves is what the rules computed
// from the page's own series before it did: the device's SM activity
// (gpu_sm_active_ratio) where the holder holds its device alone, else the
// holder's gpu_container_utilization_ratio, else none. Checked on the
// simulated node without DCGM (busy ratios only), with DCGM (SM activity,
// MIG devices included) and with per-process accounting (the time-sliced
// GPU's holders' own activity); each branch must be taken somewhere.
func TestAllocationActivityIsThePagesOwn(t *testing.T) {
	type unit struct{ uuid, gi, ci string }
	taken := map[string]int{}
	check := func(t *testing.T, p *collector.Page) {
		t.Helper()
		value := func(l string) float64 {
			v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		unitOf := func(lab map[string]string) unit {
			return unit{lab["uuid"], lab["gpu_instance"], lab["compute_instance"]}
		}
		holdersOf := map[unit]int{}
		for _, l := range series(p, "gpu_allocation_info") {
			holdersOf[unitOf(parseLabels(l))]++
		}
		sm := map[unit]float64{}
		for _, l := range series(p, "gpu_sm_active_ratio") {
			sm[unitOf(parseLabels(l))] = value(l)
		}
		type holder struct {
			u             unit
			ns, pod, cont string
		}
		holderOf := func(lab map[string]string) holder {
			return holder{unitOf(lab), lab["namespace"], lab["pod"], lab["container"]}
		}
		own := map[holder]float64{}
		source := map[holder]string{}
		for _, l := range series(p, "gpu_container_utilization_ratio") {
			lab := parseLabels(l)
			own[holderOf(lab)] = value(l)
			source[holderOf(lab)] = lab["source"]
		}
		want := map[holder]float64{}
		for _, l := range series(p, "gpu_allocation_info") {
			h := holderOf(parseLabels(l))
			if v, ok := sm[h.u]; ok && holdersOf[h.u] == 1 {
				want[h] = v
				taken["dcgm"]++
			} else if v, ok := own[h]; ok {
				want[h] = v
				taken[source[h]]++
			}
		}
		got := map[holder]float64{}
		for _, l := range series(p, "gpu_allocation_activity_ratio") {
			h := holderOf(parseLabels(l))
			if _, dup := got[h]; dup {
				t.Errorf("two activity series for one holder: %v", series(p, "gpu_allocation_activity_ratio", `pod="`+h.pod+`"`))
			}
			got[h] = value(l)
		}
		if len(got) != len(want) {
			t.Errorf("%d activity series, want %d (one per holder with a measure):\ngot  %v\nwant %v", len(got), len(want), got, want)
		}
		for h, w := range want {
			if v, ok := got[h]; !ok || !near(v, w) {
				t.Errorf("activity of %s/%s/%s on %v = %v (served: %v), want %v", h.ns, h.pod, h.cont, h.u, v, ok, w)
			}
		}
	}
	t.Run("nvml", func(t *testing.T) { check(t, newPodNodeWithDCGM(t, false)()) })
	t.Run("dcgm", func(t *testing.T) { check(t, newPodNodeWithDCGM(t, true)()) })
	t.Run("processes", func(t *testing.T) {
		pn, _ := newProcNode(t, nil)
		check(t, pn.step(t, time.Second))
	})
	for _, src := range []string{"dcgm", "device", "processes"} {
		if taken[src] == 0 {
			t.Errorf("no holder's activity came from %s: the simulated node no longer covers that case", src)
		}
	}
}

// A holder that leaves a time-sliced GPU while the exporter runs changes
// the others' share at the next render: two holders of a half each, then
// the one left holds it whole.
func TestShareFollowsHoldersMidRun(t *testing.T) {
	sc := scenario(t, `
node: {count: 1}
sharing:
  timeSlicing: {gpus: [0], replicas: 2}
pods:
  - {namespace: a, name: short-job, stop: 30s, containers: [{name: c, devices: [{gpu: 0, replica: 0}]}]}
  - {namespace: a, name: long-job, containers: [{name: c, devices: [{gpu: 0, replica: 1}]}]}
`)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	for _, pod := range []string{"short-job", "long-job"} {
		if v := num(t, p, "gpu_allocation_share_ratio", `pod="`+pod+`"`); !near(v, 0.5) {
			t.Errorf("before: %s's share %v, want 0.5", pod, v)
		}
	}
	p = pn.step(t, 40*time.Second)
	if s := series(p, "gpu_allocation_share_ratio", `pod="short-job"`); len(s) != 0 {
		t.Errorf("after short-job left: its share lingers: %v", s)
	}
	if v := num(t, p, "gpu_allocation_share_ratio", `pod="long-job"`); !near(v, 1) {
		t.Errorf("after short-job left: long-job's share %v, want 1", v)
	}
}

// The compute instances of one GPU instance, each held by a container
// of its own: each holds its device whole (share 1), and its activity is
// what the page's own series give (TestAllocationActivityIsThePagesOwn's
// rule), with DCGM and without.
func TestComputeInstanceShareAndActivity(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-40GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.20gb, computeInstances: 2, workload: {preset: training}}]
pods:
  - {namespace: a, name: pod-a, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: b, name: pod-b, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
`)
	for _, dcgmOn := range []bool{false, true} {
		opts := []exporterOption{withScenario(sc), withRealTime(), withKubelet()}
		if dcgmOn {
			opts = append(opts, withDCGM(nil))
		}
		tn := newTestExporter(t, opts...)
		if err := tn.client.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		p := tn.until(t, "both holders and, with DCGM, its values", func(p *collector.Page) bool {
			return len(series(p, "gpu_allocation_info")) == 2 && (!dcgmOn || num(t, p, "gpu_sm_active_ratio", `compute_instance="1"`) > 0)
		})
		for _, pod := range []string{"pod-a", "pod-b"} {
			if v := num(t, p, "gpu_allocation_share_ratio", `pod="`+pod+`"`); !near(v, 1) {
				t.Errorf("dcgm %v: %s's share %v, want 1 (a compute instance is a device of its own)", dcgmOn, pod, v)
			}
			act := series(p, "gpu_allocation_activity_ratio", `pod="`+pod+`"`)
			sm := series(p, "gpu_sm_active_ratio", `compute_instance="`+map[string]string{"pod-a": "0", "pod-b": "1"}[pod]+`"`)
			switch {
			case len(sm) == 0 && len(act) != 0:
				t.Errorf("dcgm %v: %s has activity %v without its device's SM activity", dcgmOn, pod, act)
			case len(sm) == 1 && (len(act) != 1 || act[0][strings.LastIndex(act[0], " "):] != sm[0][strings.LastIndex(sm[0], " "):]):
				t.Errorf("dcgm %v: %s's activity %v, want its device's SM activity %v", dcgmOn, pod, act, sm)
			}
		}
		if dcgmOn && len(series(p, "gpu_allocation_activity_ratio")) != 2 {
			t.Errorf("with DCGM both holders have an activity: %v", series(p, "gpu_allocation_activity_ratio"))
		}
	}
}

// The sparse facts the rules read instead of every holder's and every
// device's series: a device several containers hold (a time-sliced GPU,
// a GPU instance whose compute instances two pods hold) has its holders
// and its memory; a device with one holder has none; a GPU nobody holds
// has gpu_unallocated_info, and gets it the sample after its last holder
// leaves.
func TestSharedDevicesAndUnheldGPUs(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-40GB, count: 4}
gpus:
  - index: 1
    mig: [{profile: 3g.20gb, computeInstances: 2}, {profile: 3g.20gb}]
sharing:
  timeSlicing: {gpus: [0], replicas: 3}
pods:
  - {namespace: a, name: ts-0, containers: [{name: c, devices: [{gpu: 0, replica: 0}]}]}
  - {namespace: a, name: ts-1, containers: [{name: c, devices: [{gpu: 0, replica: 1}]}]}
  - {namespace: b, name: ts-2, containers: [{name: c, devices: [{gpu: 0, replica: 2}]}]}
  - {namespace: a, name: ci-a, containers: [{name: c, devices: [{gpu: 1, mig: 0}]}]}
  - {namespace: b, name: ci-b, containers: [{name: c, devices: [{gpu: 1, mig: 1}]}]}
  - {namespace: b, name: gi-alone, containers: [{name: c, devices: [{gpu: 1, mig: 2}]}]}
  - {namespace: a, name: whole, stop: 30s, containers: [{name: c, devices: [{gpu: 2}]}]}
`)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	if got := series(p, "gpu_allocation_info", `gpu="1"`); len(got) != 3 {
		t.Fatalf("GPU 1's holders %v, want the two compute instances' and the second GPU instance's", got)
	}
	gi := map[string]bool{}
	for _, s := range series(p, "gpu_allocation_info", `pod="ci-a"`) {
		gi[seriesLabel(t, s, "gpu_instance")] = true
	}
	for _, s := range series(p, "gpu_allocation_info", `pod="ci-b"`) {
		gi[seriesLabel(t, s, "gpu_instance")] = true
	}
	if len(gi) != 1 {
		t.Fatalf("ci-a and ci-b hold compute instances of GPU instances %v, want one", gi)
	}
	var shared string
	for k := range gi {
		shared = k
	}
	holders := series(p, "gpu_shared_device_holders")
	if len(holders) != 2 {
		t.Errorf("gpu_shared_device_holders %v, want GPU 0 and GPU 1's GPU instance %s only", holders, shared)
	}
	for _, dev := range []struct {
		gpu, gi string
		n       float64
	}{{"0", "", 3}, {"1", shared, 2}} {
		m := []string{`gpu="` + dev.gpu + `"`, `gpu_instance="` + dev.gi + `"`}
		if v := num(t, p, "gpu_shared_device_holders", m...); v != dev.n {
			t.Errorf("GPU %s instance %q: %v holders, want %v", dev.gpu, dev.gi, v, dev.n)
		}
		// The device's memory; a GPU instance's, which each of its
		// compute instances reports.
		for _, f := range []string{"used", "total"} {
			want := 0.0
			for _, s := range series(p, "gpu_memory_"+f+"_bytes", m...) {
				v, err := strconv.ParseFloat(s[strings.LastIndex(s, " ")+1:], 64)
				if err != nil {
					t.Fatal(err)
				}
				want = math.Max(want, v)
			}
			if got := num(t, p, "gpu_shared_device_memory_"+f+"_bytes", m...); want == 0 || got != want {
				t.Errorf("GPU %s instance %q: memory %s %v, want the device's %v", dev.gpu, dev.gi, f, got, want)
			}
		}
	}
	if got := series(p, "gpu_unallocated_info"); len(got) != 1 || seriesLabel(t, got[0], "gpu") != "3" {
		t.Errorf("gpu_unallocated_info %v, want GPU 3 only", got)
	}

	// The holder of GPU 2 stops: the GPU is unallocated from the next render.
	p = pn.step(t, 40*time.Second)
	if got := series(p, "gpu_unallocated_info"); len(got) != 2 || len(series(p, "gpu_unallocated_info", `gpu="2"`)) != 1 {
		t.Errorf("after GPU 2's holder left: gpu_unallocated_info %v, want GPUs 2 and 3", got)
	}
	// Without a pod map (no kubelet, or one gone for longer than five
	// minutes) there is none of them: TestPodMapUnknownLeavesOutCapacityGauges.
}

// seriesLabel is the value of label name in a series line of the page.
func seriesLabel(t *testing.T, s, name string) string {
	t.Helper()
	m := regexp.MustCompile(`[{,]` + name + `="([^"]*)"`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("%s has no label %s", s, name)
	}
	return m[1]
}
