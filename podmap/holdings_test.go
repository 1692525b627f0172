package podmap

import (
	"errors"
	"reflect"
	"testing"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func TestIsGPUResource(t *testing.T) {
	extra := []string{"example.com/gpu", "acme.io/vgpu-*"}
	for name, want := range map[string]bool{
		"nvidia.com/gpu":                true,
		"nvidia.com/gpu.shared":         true,
		"nvidia.com/mig-1g.10gb":        true,
		"nvidia.com/mig-3g.40gb.shared": true,
		"nvidia.com/mig":                false,
		"nvidia.com/gpux":               false,
		"cpu":                           false,
		"memory":                        false,
		"hugepages-2Mi":                 false,
		"rdma/hca":                      false,
		"example.com/gpu":               true,
		"example.com/gpu2":              false,
		"acme.io/vgpu-a":                true,
		"acme.io/vgpu":                  false,
	} {
		t.Run(name, func(t *testing.T) {
			if got := IsGPUResource(name, extra); got != want {
				t.Errorf("IsGPUResource(%q) = %v, want %v", name, got, want)
			}
		})
	}
	if IsGPUResource("example.com/gpu", nil) {
		t.Error("extra name matched without being configured")
	}
}

func TestHoldingsFromList(t *testing.T) {
	gpu := "GPU-" + uuidA
	share := "s1"
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Name: "b", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			{Name: "main", Devices: []*podresourcesv1.ContainerDevices{
				{ResourceName: "nvidia.com/gpu", DeviceIds: []string{gpu, gpu, "nvidia0"}}, // duplicate ID
				{ResourceName: "rdma/hca", DeviceIds: []string{"mlx5_0"}},                  // not a GPU
				{ResourceName: "nvidia.com/gpu.shared", DeviceIds: []string{"junk"}},       // parse error kept
			}},
		}},
		{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			{Name: "c", DynamicResources: []*podresourcesv1.DynamicResource{
				{ClaimName: "claim", ClaimNamespace: "ns", ClaimResources: []*podresourcesv1.ClaimResource{
					{DriverName: DRADriverNVIDIA, PoolName: "node1", DeviceName: "gpu-1",
						CdiDevices: []*podresourcesv1.CDIDevice{{Name: "k8s.gpu.nvidia.com/device=gpu-1"}}, ShareId: &share},
					{DriverName: "compute-domain.nvidia.com", PoolName: "node1", DeviceName: "channel-0"},
					{DriverName: DRADriverNVIDIA, PoolName: "node1", DeviceName: "gpu-vfio-0"},
				}},
			}},
		}},
	}}
	hs := holdingsFromList(resp, newResourceMatcher(nil, nil))
	if len(hs) != 5 {
		t.Fatalf("got %d holdings, want 5: %+v", len(hs), hs)
	}
	// Sorted: pod a first, DRA entries by device name.
	if hs[0].Pod != "a" || hs[0].DeviceID != "gpu-1" || hs[0].Dynamic == nil || hs[0].Ref.Kind != DRADevice || hs[0].Ref.Minor != 1 {
		t.Errorf("hs[0] = %+v", hs[0])
	}
	wantDyn := &DynamicRef{ClaimName: "claim", ClaimNamespace: "ns", DriverName: DRADriverNVIDIA, PoolName: "node1",
		DeviceName: "gpu-1", CDIDevices: []string{"k8s.gpu.nvidia.com/device=gpu-1"}, ShareID: "s1"}
	if !reflect.DeepEqual(hs[0].Dynamic, wantDyn) {
		t.Errorf("Dynamic = %+v, want %+v", hs[0].Dynamic, wantDyn)
	}
	if hs[1].DeviceID != "gpu-vfio-0" || hs[1].ParseErr == nil {
		t.Errorf("hs[1] = %+v", hs[1])
	}
	if hs[2].Resource != "nvidia.com/gpu" || hs[2].DeviceID != gpu || hs[2].Ref.Kind != GPUUUID || hs[2].Container != "main" {
		t.Errorf("hs[2] = %+v", hs[2])
	}
	if hs[3].DeviceID != "nvidia0" || hs[3].Ref.Kind != GKEMinor {
		t.Errorf("hs[3] = %+v", hs[3])
	}
	if hs[4].DeviceID != "junk" || !errors.Is(hs[4].ParseErr, ErrMalformedDeviceID) {
		t.Errorf("hs[4] = %+v", hs[4])
	}
	// An extra DRA driver is picked up when configured.
	hs = holdingsFromList(resp, newResourceMatcher(nil, []string{"compute-domain.nvidia.com"}))
	if len(hs) != 6 {
		t.Errorf("with extra driver: %d holdings, want 6", len(hs))
	}
}

func TestAllocatableFrom(t *testing.T) {
	resp := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"nvidia1", "nvidia0"}}, // two NUMA entries
		{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"nvidia2", "nvidia0"}},
		{ResourceName: "rdma/hca", DeviceIds: []string{"mlx5_0"}},
	}}
	holdings := []Holding{
		{Resource: "nvidia.com/gpu", DeviceID: "nvidia0"},
		{Resource: "nvidia.com/mig-1g.10gb", DeviceID: "MIG-" + uuidM}, // plugin gone
		{Resource: DRADriverNVIDIA, DeviceID: "gpu-0", Dynamic: &DynamicRef{}},
	}
	counts, ids := allocatableFrom(resp, newResourceMatcher(nil, nil), holdings)
	wantCounts := map[string]int{"nvidia.com/gpu": 3, "nvidia.com/mig-1g.10gb": 0}
	if !reflect.DeepEqual(counts, wantCounts) {
		t.Errorf("counts = %v, want %v", counts, wantCounts)
	}
	if !reflect.DeepEqual(ids["nvidia.com/gpu"], []string{"nvidia0", "nvidia1", "nvidia2"}) {
		t.Errorf("ids = %v", ids)
	}
}
