package podmap

import (
	"cmp"
	"slices"
	"strings"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Device plugin resource names that hold NVIDIA GPUs.
const (
	ResourceGPU       = "nvidia.com/gpu"        // NVIDIA and GKE device plugins
	ResourceGPUShared = "nvidia.com/gpu.shared" // NVIDIA plugin, time-slicing/MPS with renameByDefault
	ResourceMIGPrefix = "nvidia.com/mig-"       // NVIDIA plugin, mixed MIG strategy: nvidia.com/mig-<g>g.<mem>gb[.shared]
)

// Holding is one device held by one container: a device plugin device ID, or
// a DRA device (Dynamic != nil).
type Holding struct {
	Namespace string
	Pod       string
	Container string
	// Resource is the device plugin resource name (e.g. "nvidia.com/gpu"),
	// or for DRA the driver name (e.g. "gpu.nvidia.com").
	Resource string
	// DeviceID is the device plugin's device ID, or for DRA the device name
	// (the first CDI name if the kubelet gave no device name).
	DeviceID string
	Ref      DeviceRef
	ParseErr error       // why DeviceID did not parse; Ref.Kind is InvalidKind then
	Dynamic  *DynamicRef // DRA only
}

// resourceMatcher decides which resources and DRA drivers hold GPUs.
type resourceMatcher struct {
	exact    map[string]bool
	prefixes []string
	drivers  map[string]bool
}

func newResourceMatcher(extraResources, extraDrivers []string) *resourceMatcher {
	m := &resourceMatcher{
		exact:    map[string]bool{ResourceGPU: true, ResourceGPUShared: true},
		prefixes: []string{ResourceMIGPrefix},
		drivers:  map[string]bool{DRADriverNVIDIA: true, DRADriverNVIDIALegacy: true},
	}
	for _, r := range extraResources {
		if p, ok := strings.CutSuffix(r, "*"); ok {
			m.prefixes = append(m.prefixes, p)
		} else {
			m.exact[r] = true
		}
	}
	for _, d := range extraDrivers {
		m.drivers[d] = true
	}
	return m
}

// resource reports whether a device plugin resource holds GPUs.
func (m *resourceMatcher) resource(name string) bool {
	if m.exact[name] {
		return true
	}
	for _, p := range m.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// IsGPUResource reports whether a device plugin resource name holds NVIDIA
// GPUs: nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*, or one of
// extra (an entry ending in '*' matches by prefix).
func IsGPUResource(name string, extra []string) bool {
	return newResourceMatcher(extra, nil).resource(name)
}

// holdingsFromList turns a List answer into holdings, one per (container,
// resource, device ID), sorted by namespace, pod, container, resource, ID.
// Resources and DRA drivers that hold no GPU are left out.
func holdingsFromList(resp *podresourcesv1.ListPodResourcesResponse, m *resourceMatcher) []Holding {
	var out []Holding
	type holdingKey struct{ ns, pod, container, resource, pool, id string }
	seen := make(map[holdingKey]struct{})
	add := func(h Holding, pool string) {
		key := holdingKey{h.Namespace, h.Pod, h.Container, h.Resource, pool, h.DeviceID}
		if _, dup := seen[key]; dup {
			return
		}
		seen[key] = struct{}{}
		out = append(out, h)
	}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, dev := range c.GetDevices() {
				res := dev.GetResourceName()
				if !m.resource(res) {
					continue
				}
				for _, id := range dev.GetDeviceIds() {
					ref, err := ParseDeviceID(id)
					add(Holding{
						Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName(),
						Resource: res, DeviceID: id, Ref: ref, ParseErr: err,
					}, "")
				}
			}
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if !m.drivers[cr.GetDriverName()] {
						continue
					}
					var cdi []string
					for _, d := range cr.GetCdiDevices() {
						cdi = append(cdi, d.GetName())
					}
					ref, err := ParseDRADevice(cr.GetDeviceName(), cdi)
					id := cr.GetDeviceName()
					if id == "" && len(cdi) > 0 {
						id = cdi[0]
					}
					add(Holding{
						Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: c.GetName(),
						Resource: cr.GetDriverName(), DeviceID: id, Ref: ref, ParseErr: err,
						Dynamic: &DynamicRef{
							ClaimName:      dr.GetClaimName(),
							ClaimNamespace: dr.GetClaimNamespace(),
							DriverName:     cr.GetDriverName(),
							PoolName:       cr.GetPoolName(),
							DeviceName:     cr.GetDeviceName(),
							CDIDevices:     cdi,
							ShareID:        cr.GetShareId(),
						},
					}, cr.GetPoolName())
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Holding) int {
		return cmp.Or(
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Pod, b.Pod),
			cmp.Compare(a.Container, b.Container),
			cmp.Compare(a.Resource, b.Resource),
			cmp.Compare(a.DeviceID, b.DeviceID),
		)
	})
	return out
}

// allocatableFrom counts the distinct device IDs per GPU resource in a
// GetAllocatableResources answer. A GPU resource that holdings use but the
// kubelet no longer lists as allocatable (a dead or deregistered device
// plugin, with pods still running) is reported with 0.
func allocatableFrom(resp *podresourcesv1.AllocatableResourcesResponse, m *resourceMatcher, holdings []Holding) (map[string]int, map[string][]string) {
	ids := make(map[string][]string)
	for _, dev := range resp.GetDevices() {
		res := dev.GetResourceName()
		if !m.resource(res) {
			continue
		}
		ids[res] = append(ids[res], dev.GetDeviceIds()...)
	}
	for _, h := range holdings {
		if h.Dynamic != nil {
			continue
		}
		if _, ok := ids[h.Resource]; !ok {
			ids[h.Resource] = nil
		}
	}
	counts := make(map[string]int, len(ids))
	for res, l := range ids {
		slices.Sort(l)
		l = slices.Compact(l)
		ids[res] = l
		counts[res] = len(l)
	}
	return counts, ids
}
