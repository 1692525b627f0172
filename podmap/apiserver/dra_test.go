package apiserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

var (
	resourceSlicesGVR = schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"}
	resourceClaimsGVR = schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}
	deviceClassesGVR  = schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "deviceclasses"}
)

// NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu,
// cmd/gpu-kubelet-plugin): its driver name, one pool per node named after
// the node, CDI names k8s.gpu.nvidia.com/claim=<claim uid>-<device>.
const (
	draDriver = "gpu.nvidia.com"
	draNode   = "node-a"
)

func str(v string) map[string]any { return map[string]any{"string": v} }

// gpuDevice is a whole GPU as the driver publishes it (deviceinfo.go
// GpuInfo.Attributes), consuming its GPU's counter set where it has one
// (DynamicMIG: the whole GPU takes every counter, so no MIG device fits
// while it is allocated).
func gpuDevice(g *fakenvml.GPU, counters map[string]any) map[string]any {
	d := map[string]any{"name": "gpu-" + strconv.Itoa(g.Minor), "attributes": map[string]any{
		"type": str("gpu"), "uuid": str(g.UUID), "productName": str(g.Name), "brand": str("Nvidia"), "architecture": str("Hopper"),
		"cudaComputeCapability": map[string]any{"version": "9.0.0"}, "driverVersion": map[string]any{"version": "580.65.6"},
		"resource.kubernetes.io/pciBusID": str(strings.ToLower(strings.TrimPrefix(g.PCIBusID, "0000"))),
	}, "capacity": map[string]any{"memory": map[string]any{"value": "80Gi"}}}
	if counters != nil {
		d["consumesCounters"] = []any{map[string]any{"counterSet": counterSet(g), "counters": counters}}
	}
	return d
}

func counterSet(g *fakenvml.GPU) string { return "gpu-" + strconv.Itoa(g.Minor) + "-counter-set" }

// migName is a dynamic MIG device's name in the driver's current releases
// (mig.go): gpu-<minor>-mig-<profile without dots>-<profile id>-<start>.
func migName(g *fakenvml.GPU, p fakenvml.GPUInstanceProfile, start uint32) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", g.Minor, strings.ReplaceAll(p.Name, ".", ""), p.Info.Id, start)
}

// slices are the node's pool as the driver publishes it with DynamicMIG
// on Kubernetes 1.35+ (driver.go generateSplitResourceSlices): one slice
// with the MIG GPU's counter set alone, one with the devices: whole GPUs
// 0 and 1, and GPU 2 whole or as a 1g.10gb at placement 0 (KEP-4815:
// every possible MIG device is advertised, without a UUID, before any
// claim has it). taints go on the named devices.
func slices(gpu0, gpu1, gpu2 *fakenvml.GPU, mig fakenvml.GPUInstanceProfile, taints map[string][]any) []map[string]any {
	all := map[string]any{"memory": map[string]any{"value": "80Gi"}}
	for s := 0; s < 8; s++ {
		all["memory-slice-"+strconv.Itoa(s)] = map[string]any{"value": "1"}
	}
	devices := []any{gpuDevice(gpu0, nil), gpuDevice(gpu1, nil), gpuDevice(gpu2, all)}
	devices = append(devices, map[string]any{"name": migName(gpu2, mig, 0), "attributes": map[string]any{
		"type": str("mig"), "parentUUID": str(gpu2.UUID), "profile": str(mig.Name), "productName": str(gpu2.Name),
	}, "capacity": map[string]any{"memory": map[string]any{"value": "9984Mi"}},
		"consumesCounters": []any{map[string]any{"counterSet": counterSet(gpu2), "counters": map[string]any{
			"memory": map[string]any{"value": "9984Mi"}, "memory-slice-0": map[string]any{"value": "1"}}}}})
	for _, d := range devices {
		m := d.(map[string]any)
		if ts := taints[m["name"].(string)]; ts != nil {
			m["taints"] = ts
		}
	}
	pool := map[string]any{"name": draNode, "generation": 1, "resourceSliceCount": 2}
	return []map[string]any{
		{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": map[string]any{"name": "00000-gpu.nvidia.com-" + draNode + "-counters"},
			"spec": map[string]any{"driver": draDriver, "nodeName": draNode, "pool": pool,
				"sharedCounters": []any{map[string]any{"name": counterSet(gpu2), "counters": all}}}},
		{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": map[string]any{"name": "00001-gpu.nvidia.com-" + draNode + "-devices"},
			"spec": map[string]any{"driver": draDriver, "nodeName": draNode, "pool": pool, "devices": devices}},
	}
}

// claim creates a ResourceClaim for device and allocates it as the
// scheduler would (status.allocation, reservedFor the pods); it returns
// the claim's UID.
func claim(t *testing.T, c *cluster, ns, name, device string, pods ...string) string {
	t.Helper()
	admin := c.client(t, adminToken)
	got := apply(t, admin, resourceClaimsGVR, map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{"devices": map[string]any{"requests": []any{map[string]any{"name": "gpu",
			"exactly": map[string]any{"deviceClassName": draDriver}}}}}})
	var reserved []any
	for _, p := range pods {
		pod, err := admin.Resource(podsGVR).Namespace(ns).Get(context.Background(), p, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reserved = append(reserved, map[string]any{"resource": "pods", "name": p, "uid": string(pod.GetUID())})
	}
	got.Object["status"] = map[string]any{"allocation": map[string]any{
		"devices": map[string]any{"results": []any{map[string]any{"request": "gpu", "driver": draDriver, "pool": draNode, "device": device}}},
		"nodeSelector": map[string]any{"nodeSelectorTerms": []any{map[string]any{"matchFields": []any{
			map[string]any{"key": "metadata.name", "operator": "In", "values": []any{draNode}}}}}},
	}, "reservedFor": reserved}
	if _, err := admin.Resource(resourceClaimsGVR).Namespace(ns).UpdateStatus(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocating claim %s/%s: %v", ns, name, err)
	}
	return string(got.GetUID())
}

// holding is a container's DRA device as the kubelet reports it.
func holding(ns, pod, claimName, claimUID, device string) fakekubelet.Pod {
	return fakekubelet.Pod{Namespace: ns, Name: pod, Containers: []fakekubelet.Container{{Name: "main", Dynamic: []fakekubelet.DynamicResource{{
		ClaimName: claimName, ClaimNamespace: ns, ClaimResources: []fakekubelet.ClaimResource{{
			DriverName: draDriver, PoolName: draNode, DeviceName: device,
			CDIDevices: []string{"k8s.gpu.nvidia.com/claim=" + claimUID + "-" + device},
		}},
	}}}}}
}

// DRA on a real API server, shaped as NVIDIA's DRA driver publishes it: a
// claim for a whole GPU, one shared by two pods, and one for a MIG device
// created (dynamic MIG) while the exporter runs each map to their holders
// on the native page and on the dcgm-exporter page with its dra_* labels;
// a device taint put on the slice is on the page and counts the device
// unhealthy; the exporter's identity has only the RBAC the chart grants
// for the ResourceSlice watch.
func TestDRAOnARealAPIServer(t *testing.T) {
	c := startCluster(t)
	admin := c.client(t, adminToken)
	grant(t, admin, "gpu-pool-exporter-resourceslices", []any{map[string]any{"apiGroups": []any{"resource.k8s.io"},
		"resources": []any{"resourceslices"}, "verbs": []any{"get", "list", "watch"}}})

	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 3, fakenvml.Full)
	gpu0, gpu1, gpu2 := &node.GPUs[0], &node.GPUs[1], &node.GPUs[2]
	gpu2.MIG.Enabled = true // MIG on, no instance yet: the driver creates one for a claim
	mig := gpu2.MIG.Profiles[nvml.GPU_INSTANCE_PROFILE_1_SLICE]
	nodePath := filepath.Join(c.dir, "node.conf")
	writeNode(t, node, nodePath)

	apply(t, admin, deviceClassesGVR, map[string]any{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
		"metadata": map[string]any{"name": draDriver}, "spec": map[string]any{"selectors": []any{map[string]any{"cel": map[string]any{
			"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}}}})
	for _, s := range slices(gpu0, gpu1, gpu2, mig, nil) {
		apply(t, admin, resourceSlicesGVR, s)
	}
	// Another node's slice: never this node's.
	other := slices(gpu0, gpu1, gpu2, mig, map[string][]any{"gpu-0": {map[string]any{"key": "elsewhere", "effect": "NoSchedule"}}})[1]
	other["metadata"] = map[string]any{"name": "00001-gpu.nvidia.com-node-b"}
	other["spec"].(map[string]any)["nodeName"] = "node-b"
	other["spec"].(map[string]any)["pool"] = map[string]any{"name": "node-b", "generation": 1, "resourceSliceCount": 1}
	apply(t, admin, resourceSlicesGVR, other)

	for _, p := range []string{"train-0", "shared-a", "shared-b", "infer-0"} {
		createPod(t, admin, "ml", p, draNode, nil)
	}
	trainUID := claim(t, c, "ml", "train-0-gpu-x7k2p", "gpu-0", "train-0")
	sharedUID := claim(t, c, "ml", "shared-gpu", "gpu-1", "shared-a", "shared-b")
	kubelet := fakekubelet.New(filepath.Join(c.dir, "kubelet.sock"))
	pods := []fakekubelet.Pod{
		holding("ml", "train-0", "train-0-gpu-x7k2p", trainUID, "gpu-0"),
		holding("ml", "shared-a", "shared-gpu", sharedUID, "gpu-1"),
		holding("ml", "shared-b", "shared-gpu", sharedUID, "gpu-1"),
	}
	kubelet.SetPods(pods)
	if err := kubelet.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)

	a := startAgent(t, c.dir, nodePath, "--node-name="+draNode, "--kubelet.pod-resources-socket="+kubelet.Socket(), "--kubelet.refresh-interval=1s",
		"--kubernetes.kubeconfig="+c.kubeconfig(t, exporterToken), "--kubernetes.resource-slices",
		"--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-dra")

	holders := func(p page, gpu string) map[string]bool {
		out := map[string]bool{}
		for _, l := range p.find("gpu_allocation_info", map[string]string{"gpu": gpu, "resource": draDriver}) {
			out[l["namespace"]+"/"+l["pod"]] = true
		}
		return out
	}
	// compat are the holders on the dcgm-exporter page, with their dra_*
	// labels, of a device (gpu, GPU_I_ID).
	compat := func(p page, gpu, gi string) map[string]map[string]string {
		out := map[string]map[string]string{}
		for _, l := range p.find("DCGM_FI_DEV_GPU_TEMP", map[string]string{"gpu": gpu}) {
			if l["GPU_I_ID"] == gi && l["pod"] != "" {
				out[l["pod"]] = l
			}
		}
		return out
	}
	p := a.waitPage("the holders of GPUs 0 and 1", func(p page) bool { return len(holders(p, "0")) == 1 && len(holders(p, "1")) == 2 })
	if h := holders(p, "0"); !h["ml/train-0"] {
		t.Errorf("GPU 0's holders %v, want ml/train-0", h)
	}
	if h := holders(p, "1"); !h["ml/shared-a"] || !h["ml/shared-b"] {
		t.Errorf("GPU 1's holders %v, want ml/shared-a and ml/shared-b (one claim, two pods)", h)
	}
	wantDRA := func(where string, l map[string]string, claimName, device string) {
		t.Helper()
		for k, v := range map[string]string{"dra_claim_name": claimName, "dra_claim_namespace": "ml", "dra_driver_name": draDriver,
			"dra_pool_name": draNode, "dra_device_name": device, "namespace": "ml", "container": "main"} {
			if l[k] != v {
				t.Errorf("%s: %s=%q, want %q (series %v)", where, k, l[k], v, l)
			}
		}
	}
	if s := compat(p, "0", ""); len(s) != 1 || s["train-0"] == nil {
		t.Errorf("dcgm-exporter page, GPU 0: series of %v, want train-0's", s)
	} else {
		wantDRA("GPU 0", s["train-0"], "train-0-gpu-x7k2p", "gpu-0")
		if _, ok := s["train-0"]["dra_mig_profile"]; ok {
			t.Errorf("a whole GPU's series has dra_mig_profile: %v", s["train-0"])
		}
	}
	if s := compat(p, "1", ""); len(s) != 2 || s["shared-a"] == nil || s["shared-b"] == nil {
		t.Errorf("dcgm-exporter page, GPU 1: series of %v, want one for each of shared-a and shared-b", s)
	} else {
		wantDRA("GPU 1 shared-a", s["shared-a"], "shared-gpu", "gpu-1")
		wantDRA("GPU 1 shared-b", s["shared-b"], "shared-gpu", "gpu-1")
	}

	// A claim for a 1g.10gb on GPU 2: the driver creates the MIG device
	// as the claim's pod starts, while the exporter runs.
	gi, err := gpu2.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1)
	if err != nil {
		t.Fatal(err)
	}
	if gi.Placement.Start != 0 {
		t.Fatalf("the fake placed the 1g.10gb at %d; the slice advertises placement 0", gi.Placement.Start)
	}
	writeNode(t, node, nodePath)
	migDev := migName(gpu2, mig, 0)
	inferUID := claim(t, c, "ml", "infer-0-mig-q8w3z", migDev, "infer-0")
	kubelet.SetPods(append(pods, holding("ml", "infer-0", "infer-0-mig-q8w3z", inferUID, migDev)))
	var migUUID string
	for _, d := range gpu2.MIG.Devices {
		if d.GPUInstance == gi.ID {
			migUUID = d.UUID
		}
	}
	giID := strconv.Itoa(gi.ID)
	p = a.waitPage("the MIG device's holder", func(p page) bool {
		return len(p.find("gpu_allocation_info", map[string]string{"gpu": "2", "gpu_instance": giID, "pod": "infer-0"})) == 1 && len(compat(p, "2", giID)) == 1
	})
	if s := compat(p, "2", giID)["infer-0"]; s == nil {
		t.Errorf("dcgm-exporter page: no series of infer-0 on GPU 2's GPU instance %s", giID)
	} else {
		wantDRA("GPU 2 MIG", s, "infer-0-mig-q8w3z", migDev)
		if s["dra_mig_profile"] != "1g.10gb" || s["dra_mig_device_uuid"] != migUUID {
			t.Errorf("GPU 2's MIG device: dra_mig_profile=%q dra_mig_device_uuid=%q, want 1g.10gb and %s (the slice has no UUID for a dynamic MIG device: NVML names it)",
				s["dra_mig_profile"], s["dra_mig_device_uuid"], migUUID)
		}
	}
	if v, _ := p.value("gpu_devices", map[string]string{"state": "unhealthy"}); v != 0 {
		t.Errorf("gpu_devices{state=unhealthy} = %v before any taint, want 0 (the other node's tainted slice is not this node's)", v)
	}
	if ts := p.find("gpu_dra_device_taint", nil); len(ts) != 0 {
		t.Errorf("taints on the page before any: %v", ts)
	}

	// The driver's health check taints GPU 1 (an XID 48) and, with None,
	// the MIG device (an application XID): the first counts GPU 1
	// unhealthy, the second is on the page only.
	taints := map[string][]any{
		"gpu-1": {map[string]any{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}},
		migDev:  {map[string]any{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}},
	}
	for _, s := range slices(gpu0, gpu1, gpu2, mig, taints) {
		apply(t, admin, resourceSlicesGVR, s)
	}
	p = a.waitPage("the taints", func(p page) bool { return len(p.find("gpu_dra_device_taint", nil)) == 2 })
	if ts := p.find("gpu_dra_device_taint", map[string]string{"gpu": "1", "gpu_instance": "", "dra_device": "gpu-1", "dra_driver": draDriver, "dra_pool": draNode,
		"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule", "uuid": gpu1.UUID}); len(ts) != 1 {
		t.Errorf("GPU 1's taint: %v", p.find("gpu_dra_device_taint", nil))
	}
	if ts := p.find("gpu_dra_device_taint", map[string]string{"gpu": "2", "gpu_instance": giID, "dra_device": migDev, "effect": "None"}); len(ts) != 1 {
		t.Errorf("the MIG device's taint: %v", p.find("gpu_dra_device_taint", nil))
	}
	if v, _ := p.value("gpu_devices", map[string]string{"state": "unhealthy"}); v != 1 {
		t.Errorf("gpu_devices{state=unhealthy} = %v with GPU 1 tainted NoSchedule, want 1 (a None taint counts nothing)", v)
	}
	if v, ok := p.value("gpu_exporter_collector_up", map[string]string{"collector": "dra_slices"}); !ok || v != 1 {
		t.Errorf("gpu_exporter_collector_up{collector=dra_slices} = %v (present %v), want 1", v, ok)
	}

	// The taint lifted: the device is healthy again.
	for _, s := range slices(gpu0, gpu1, gpu2, mig, nil) {
		apply(t, admin, resourceSlicesGVR, s)
	}
	a.waitPage("no taint", func(p page) bool {
		v, _ := p.value("gpu_devices", map[string]string{"state": "unhealthy"})
		return len(p.find("gpu_dra_device_taint", nil)) == 0 && v == 0
	})
}
