package simnode

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
)

// The NVIDIA DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) as the
// dra flavour stands in for it: its driver name, its CDI vendor and class,
// and its device names (cmd/gpu-kubelet-plugin: deviceinfo.go, mig.go,
// cdi.go).
const (
	draDriver   = "gpu.nvidia.com"
	draCDIClaim = "k8s.gpu.nvidia.com/claim="
)

// draGPUName is a whole GPU's device name: gpu-<minor>.
func (d *Device) draGPUName() string { return "gpu-" + strconv.Itoa(d.minor) }

// draName is a MIG device's name in the driver's current releases:
// gpu-<parent minor>-mig-<profile without dots>-<profile id>-<placement
// start>; "1g.10gb+me" is "1g10gb-me".
func (m *MIGDevice) draName() string {
	p := strings.ReplaceAll(m.profile, ".", "")
	p = strings.ReplaceAll(p, "+", "-")
	return fmt.Sprintf("%s-mig-%s-%d-%d", m.parent.draGPUName(), p, m.geo.ID, m.placement.Start)
}

// draDevice is the DRA device a scenario device is (a replica is its
// GPU: pods share a time-sliced GPU through one claim).
func (n *Node) draDevice(d DeviceSpec) string {
	dev := n.devices[d.GPU]
	if d.MIG != nil {
		return dev.migs[*d.MIG].draName()
	}
	return dev.draGPUName()
}

// draClaimName is the ResourceClaim a container's device comes from: one
// per device, or for a shared GPU one its pods share.
func (n *Node) draClaimName(pod, container string, d DeviceSpec) string {
	if d.Replica != nil {
		return "shared-" + n.draDevice(d)
	}
	return pod + "-" + container + "-" + n.draDevice(d)
}

// claimUID is a claim's UID, stable for the seed.
func claimUID(seed int64, ns, name string) string {
	b := sha256.Sum256([]byte(fmt.Sprintf("claim/%d/%s/%s", seed, ns, name)))
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// draResources are a container's devices as the kubelet reports DRA
// claims: one DynamicResource per claim, its device with the CDI name the
// driver hands the runtime.
func (n *Node) draResources(ns, pod string, c ContainerSpec) []fakekubelet.DynamicResource {
	var out []fakekubelet.DynamicResource
	for _, d := range c.Devices {
		claim := n.draClaimName(pod, c.Name, d)
		dev := n.draDevice(d)
		out = append(out, fakekubelet.DynamicResource{ClaimName: claim, ClaimNamespace: ns, ClaimResources: []fakekubelet.ClaimResource{{
			DriverName: draDriver, PoolName: n.Scenario.Node.Name, DeviceName: dev,
			CDIDevices: []string{draCDIClaim + claimUID(n.Scenario.Seed, ns, claim) + "-" + dev},
		}}})
	}
	return out
}

// DRASlices are the node's ResourceSlices as the NVIDIA DRA driver
// publishes them (one pool named after the node, one slice): its whole
// GPUs (not in MIG mode) and existing MIG devices, with their attributes
// and the taints of the scenario's draTaint faults active now. Empty
// unless the flavour is dra.
func (n *Node) DRASlices(nodeName string) []map[string]any {
	if n.Scenario.Node.Flavour != "dra" {
		return nil
	}
	t := n.elapsed()
	taints := map[string][]any{}
	for _, f := range n.Scenario.Faults {
		if f.DRATaint == nil || f.GPU == nil || !active(f, t) {
			continue
		}
		dev := n.devices[*f.GPU]
		name := dev.draGPUName()
		if f.MIG != nil {
			name = dev.migs[*f.MIG].draName()
		}
		tt := map[string]any{"key": f.DRATaint.Key, "effect": f.DRATaint.Effect, "timeAdded": n.start.Add(time.Duration(f.At)).UTC().Format(time.RFC3339)}
		if f.DRATaint.Value != "" {
			tt["value"] = f.DRATaint.Value
		}
		taints[name] = append(taints[name], tt)
	}
	str := func(v string) map[string]any { return map[string]any{"string": v} }
	var devices []any
	seen := map[string]bool{}
	for _, dev := range n.devices {
		common := map[string]any{"productName": str(dev.cfg.Name), "brand": str("Nvidia")}
		if len(dev.migs) == 0 {
			attrs := map[string]any{"type": str("gpu"), "uuid": str(dev.UUID())}
			for k, v := range common {
				attrs[k] = v
			}
			d := map[string]any{"name": dev.draGPUName(), "attributes": attrs}
			if ts := taints[dev.draGPUName()]; ts != nil {
				d["taints"] = ts
			}
			devices = append(devices, d)
			continue
		}
		for _, m := range dev.migs {
			name := m.draName()
			if seen[name] {
				continue // the compute instances of one GPU instance are one DRA device
			}
			seen[name] = true
			attrs := map[string]any{"type": str("mig"), "uuid": str(m.uuid), "parentUUID": str(dev.UUID()), "profile": str(m.profile)}
			for k, v := range common {
				attrs[k] = v
			}
			d := map[string]any{"name": name, "attributes": attrs}
			if ts := taints[name]; ts != nil {
				d["taints"] = ts
			}
			devices = append(devices, d)
		}
	}
	return []map[string]any{{
		"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
		"metadata": map[string]any{"name": "00000-" + draDriver + "-" + nodeName},
		"spec": map[string]any{"driver": draDriver, "nodeName": nodeName,
			"pool": map[string]any{"name": n.Scenario.Node.Name, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
	}}
}
