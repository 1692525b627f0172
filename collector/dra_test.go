package collector_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// staticSlices is a SliceSource that answers a fixed list.
type staticSlices struct{ devs []podmap.SliceDevice }

func (s *staticSlices) Devices() ([]podmap.SliceDevice, bool, string) { return s.devs, true, "" }

const draScenario = `
seed: 3
steady: true
node: {name: dra-node, model: H100-SXM5-80GB, count: 3, flavour: dra}
sharing: {timeSlicing: {gpus: [1], replicas: 2}}
gpus:
  - index: 2
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
pods:
  - {namespace: ml, name: train-0, containers: [{name: main, devices: [{gpu: 0}]}]}
  - {namespace: ml, name: shared-a, containers: [{name: main, devices: [{gpu: 1, replica: 0}]}]}
  - {namespace: ml, name: shared-b, containers: [{name: main, devices: [{gpu: 1, replica: 1}]}]}
  - {namespace: ml, name: infer-0, containers: [{name: main, devices: [{gpu: 2, mig: 2}]}]}
`

// DRA holders on the dcgm-exporter page with --kubernetes-enable-dra: one
// series per holder of a claim (the shared claim's two pods each), with the
// claim's dra_* labels from the kubelet and, on a MIG device, its profile
// and MIG UUID from NVML; without the flag, one series per device and no
// dra_* label, as before. A NoSchedule taint on a slice's device is on the
// native page and counts the device unhealthy; a None taint counts
// nothing.
func TestDRAHoldersAndTaints(t *testing.T) {
	sc := scenario(t, draScenario)
	for _, dra := range []bool{true, false} {
		slices := &staticSlices{}
		n := newTestExporter(t, withScenario(sc), withKubelet(), withGroups(fullGroups()), withConfig(func(c *collector.Config) {
			c.Compat = &render.CompatConfig{Hostname: "h", DRA: dra}
			c.Slices = slices
		}))
		p := n.step(t, time.Second)
		temp := func(want ...string) []string { return series(p, "DCGM_FI_DEV_GPU_TEMP", want...) }
		if !dra {
			if l := temp(`gpu="1"`); len(l) != 1 || strings.Contains(l[0], "dra_") {
				t.Errorf("without the flag, GPU 1's series: %v; want one, without dra_* labels", l)
			}
			continue
		}
		if l := temp(`gpu="0"`, `pod="train-0"`, `dra_claim_name="train-0-main-gpu-0"`, `dra_claim_namespace="ml"`,
			`dra_driver_name="gpu.nvidia.com"`, `dra_pool_name="dra-node"`, `dra_device_name="gpu-0"`); len(l) != 1 || strings.Contains(l[0], "dra_mig") {
			t.Errorf("GPU 0: %v", temp(`gpu="0"`))
		}
		for _, pod := range []string{"shared-a", "shared-b"} {
			if l := temp(`gpu="1"`, `pod="`+pod+`"`, `dra_claim_name="shared-gpu-1"`, `dra_device_name="gpu-1"`); len(l) != 1 {
				t.Errorf("GPU 1, %s: %v", pod, temp(`gpu="1"`))
			}
		}
		if l := temp(`gpu="1"`); len(l) != 2 {
			t.Errorf("GPU 1 held through one claim by two pods: %v, want a series for each", l)
		}
		st := p.State
		var migUUID, giID string
		for _, m := range st.Sample.GPUs[2].MIG {
			if m.MIGProfile == "1g.10gb" {
				migUUID, giID = m.MIGUUID, strconv.Itoa(m.GPUInstance)
			}
		}
		if l := temp(`gpu="2"`, `GPU_I_ID="`+giID+`"`, `pod="infer-0"`, `dra_mig_profile="1g.10gb"`, `dra_mig_device_uuid="`+migUUID+`"`, `dra_device_name="gpu-2-mig-1g10gb-`); len(l) != 1 {
			t.Errorf("GPU 2's 1g.10gb: %v", temp(`gpu="2"`))
		}

		// Taints: GPU 0 NoSchedule, the 1g.10gb None.
		slices.devs = []podmap.SliceDevice{
			{Driver: "gpu.nvidia.com", Pool: "dra-node", Name: "gpu-0", Type: "gpu", UUID: st.Sample.GPUs[0].UUID,
				Taints: []podmap.SliceTaint{{Key: "gpu.nvidia.com/xid", Value: "48", Effect: "NoSchedule"}}},
			{Driver: "gpu.nvidia.com", Pool: "dra-node", Name: "gpu-2-mig-1g10gb-19-6", Type: "mig", UUID: migUUID,
				Taints: []podmap.SliceTaint{{Key: "gpu.nvidia.com/xid", Value: "13", Effect: "None"}}},
		}
		p = n.step(t, time.Second)
		if l := series(p, "gpu_dra_device_taint", `gpu="0"`, `key="gpu.nvidia.com/xid"`, `value="48"`, `effect="NoSchedule"`, `dra_device="gpu-0"`); len(l) != 1 {
			t.Errorf("GPU 0's taint: %v", series(p, "gpu_dra_device_taint"))
		}
		if l := series(p, "gpu_dra_device_taint", `gpu="2"`, `gpu_instance="`+giID+`"`, `effect="None"`); len(l) != 1 {
			t.Errorf("the 1g.10gb's taint: %v", series(p, "gpu_dra_device_taint"))
		}
		if l := series(p, "gpu_devices", `state="unhealthy"`); len(l) != 1 || !strings.HasSuffix(l[0], " 1") {
			t.Errorf("gpu_devices unhealthy: %v, want 1 (GPU 0)", l)
		}
		if l := series(p, "gpu_exporter_collector_up", `collector="dra_slices"`); len(l) != 1 || !strings.HasSuffix(l[0], " 1") {
			t.Errorf("dra_slices collector: %v", l)
		}
	}
}
