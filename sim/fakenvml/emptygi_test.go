package fakenvml_test

import (
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// A GPU instance created without a compute instance (nvidia-smi mig -cgi
// without -C) holds its slices: NVML lists it among the GPU instances
// (nvmlDeviceGetGpuInstances) while no MIG device stands for it. On an A100
// a 4g.40gb alone at slices 0-3 leaves 3 slices free, no room for another
// 4g (one per GPU) nor a 7g, and a 3g still fits at {4,4}; the page shows
// no MIG device for it.
func TestRealBinaryCountsAGPUInstanceWithoutComputeInstances(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
	if _, err := node.GPUs[0].AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0); err != nil {
		t.Fatal(err)
	}
	if n := len(node.GPUs[0].MIG.Devices); n != 0 {
		t.Fatalf("the fake lists %d MIG devices for a GPU instance without compute instances", n)
	}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	gpu0 := map[string]string{"gpu": "0"}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_mig_free_slices"] != nil }, "gpu_mig_free_slices")
	if v := value(f, "gpu_mig_free_slices", gpu0); v != 3 {
		t.Errorf("gpu_mig_free_slices = %v, want 3: the 4g.40gb GPU instance covers slices 0-3", v)
	}
	for profile, want := range map[string]float64{"4g.40gb": 0, "7g.80gb": 0, "3g.40gb": 1, "1g.10gb": 3} {
		if v, ok := sample(f, "gpu_mig_placeable_instances", map[string]string{"gpu": "0", "mig_profile": profile}); !ok || v != want {
			t.Errorf("gpu_mig_placeable_instances{mig_profile=%q} = %v (present %v), want %v", profile, v, ok, want)
		}
	}
	if v := value(f, "gpu_mig_largest_placeable_slices", gpu0); v != 3 {
		t.Errorf("gpu_mig_largest_placeable_slices = %v, want 3 (a 3g.40gb at {4,4})", v)
	}
	if mf := f["gpu_mig_info"]; mf != nil && len(mf.GetMetric()) > 0 {
		t.Errorf("gpu_mig_info serves %d MIG devices; a GPU instance without compute instances has none", len(mf.GetMetric()))
	}
	if v, ok := sample(f, "gpu_up", map[string]string{"gpu": "0", "gpu_instance": ""}); !ok || v != 1 {
		t.Errorf("gpu_up of the GPU = %v (present %v), want 1", v, ok)
	}
}
