package simnode

import (
	"maps"
	"sort"
	"strconv"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
)

// Device plugin resource names.
const (
	resourceGPU       = "nvidia.com/gpu"
	resourceGPUShared = "nvidia.com/gpu.shared"
)

// deviceID is what the scenario's device plugin calls a simulated device.
func (n *Node) deviceID(d DeviceSpec) (resource, id string) {
	dev := n.devices[d.GPU]
	gke := n.Scenario.Node.Flavour == "gke"
	switch {
	case d.MIG != nil:
		m := dev.migs[*d.MIG]
		if gke {
			return resourceGPU, "nvidia" + strconv.Itoa(dev.minor) + "/gi" + strconv.Itoa(m.gi)
		}
		return "nvidia.com/mig-" + m.profile, m.uuid
	case d.Replica != nil:
		if gke {
			return resourceGPU, "nvidia" + strconv.Itoa(dev.minor) + "/vgpu" + strconv.Itoa(*d.Replica)
		}
		// The device plugin names a replica <uuid>::<n>, for time-slicing
		// and MPS alike; time-sliced replicas are renamed here, MPS ones
		// where the scenario asks (renameByDefault).
		if mps := n.Scenario.Sharing.MPS; mps != nil && n.Scenario.mpsGPU(d.GPU) && !mps.RenameByDefault {
			return resourceGPU, dev.UUID() + "::" + strconv.Itoa(*d.Replica)
		}
		return resourceGPUShared, dev.UUID() + "::" + strconv.Itoa(*d.Replica)
	default:
		if gke {
			return resourceGPU, "nvidia" + strconv.Itoa(dev.minor)
		}
		return resourceGPU, dev.UUID()
	}
}

// KubeletPods is what the kubelet lists now: the scenario's pods that exist
// at the node's elapsed time, with device IDs in the scenario's flavour.
func (n *Node) KubeletPods() []fakekubelet.Pod {
	return n.kubeletPodsAt(n.elapsed())
}

func (n *Node) kubeletPodsAt(t time.Duration) []fakekubelet.Pod {
	var pods []fakekubelet.Pod
	for _, p := range n.Scenario.Pods {
		if t < time.Duration(p.Start) || (p.Stop != 0 && t >= time.Duration(p.Stop)) {
			continue
		}
		pod := fakekubelet.Pod{Namespace: p.Namespace, Name: p.Name}
		for _, c := range p.Containers {
			if n.Scenario.Node.Flavour == "dra" {
				pod.Containers = append(pod.Containers, fakekubelet.Container{Name: c.Name, Dynamic: n.draResources(p.Namespace, p.Name, c)})
				continue
			}
			byRes := map[string][]string{}
			var order []string
			for _, d := range c.Devices {
				r, id := n.deviceID(d)
				if _, ok := byRes[r]; !ok {
					order = append(order, r)
				}
				byRes[r] = append(byRes[r], id)
			}
			fc := fakekubelet.Container{Name: c.Name}
			for _, r := range order {
				fc.Devices = append(fc.Devices, fakekubelet.Devices{Resource: r, IDs: byRes[r]})
			}
			pod.Containers = append(pod.Containers, fc)
		}
		pods = append(pods, pod)
	}
	return pods
}

// KubeletAllocatable is what GetAllocatableResources answers now: every
// device the device plugin advertises, unless a devicePlugin fault cuts it.
func (n *Node) KubeletAllocatable() map[string][]string {
	out := map[string][]string{}
	if n.Scenario.Node.Flavour == "dra" {
		// DRA devices are published in ResourceSlices, not allocatable
		// through a device plugin.
		return out
	}
	for i, dev := range n.devices {
		switch {
		case len(dev.migs) > 0:
			for j := range dev.migs {
				r, id := n.deviceID(DeviceSpec{GPU: i, MIG: &j})
				out[r] = append(out[r], id)
			}
		case n.Scenario.sharedGPU(i):
			for k := 0; k < n.Scenario.replicas(i); k++ {
				r, id := n.deviceID(DeviceSpec{GPU: i, Replica: &k})
				out[r] = append(out[r], id)
			}
		default:
			r, id := n.deviceID(DeviceSpec{GPU: i})
			out[r] = append(out[r], id)
		}
	}
	if limit, cut := n.DevicePluginAllocatable(); cut {
		// The plugin lost its devices: keep only the first limit IDs.
		var res []string
		for r := range out {
			res = append(res, r)
		}
		sort.Strings(res)
		for _, r := range res {
			if len(out[r]) > limit {
				out[r] = out[r][:limit]
			}
			limit -= len(out[r])
		}
	}
	return out
}

// APIPod is a pod as the API server knows it: what the metadata API
// serves of it.
type APIPod struct {
	Namespace, Name, UID string
	Labels               map[string]string
}

// APIPods are the pods that exist now: name, namespace, UID (the one in
// their containers' cgroup paths) and labels.
func (n *Node) APIPods() []APIPod {
	t := n.elapsed()
	var out []APIPod
	for _, p := range n.Scenario.Pods {
		if t < time.Duration(p.Start) || (p.Stop != 0 && t >= time.Duration(p.Stop)) {
			continue
		}
		out = append(out, APIPod{Namespace: p.Namespace, Name: p.Name, UID: podUID(n.Scenario.Seed, p.Namespace, p.Name), Labels: maps.Clone(p.Labels)})
	}
	return out
}
