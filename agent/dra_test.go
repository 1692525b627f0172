package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The simulated node with NVIDIA's DRA driver (flavour dra), its API server
// the simulation's own: the ResourceSlice's taint is on the page and counts
// the GPU unhealthy, the claims' holders carry the dra_* labels on the
// dcgm-exporter page, and the node condition turns True with the XID 79 the
// scenario raises, as its log says.
func TestSimulatedDRANodeAndCondition(t *testing.T) {
	sc := filepath.Join(t.TempDir(), "dra.yaml")
	if err := os.WriteFile(sc, []byte(`
seed: 7
steady: true
node: {name: dra-node-1, model: H100-SXM5-80GB, count: 3, flavour: dra}
gpus:
  - {index: 2, mig: [{profile: 1g.10gb}, {profile: 1g.10gb}]}
pods:
  - {namespace: ml, name: train-0, containers: [{name: main, devices: [{gpu: 0}]}]}
  - {namespace: ml, name: infer-0, containers: [{name: main, devices: [{gpu: 2, mig: 1}]}]}
faults:
  - {at: 1s, gpu: 1, draTaint: {key: gpu.nvidia.com/xid, value: "48", effect: NoSchedule}}
  - {at: 3s, gpu: 0, xid: 79}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--simulate.scenario=" + sc, "--web.listen-address=" + addr, "--collect-interval=1s",
			"--kubernetes.resource-slices", "--node-condition", "--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-dra"}, logs, logs)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "http://"+addr+"/readyz", 200)
	// The log's condition and the page come from different rounds: the page
	// is read again until it shows the round that lost GPU 0 too.
	const twoUnhealthy = `gpu_devices{state="unhealthy"} 2`
	var page string
	if !pollUntil(2*waitTimeout, func() bool {
		page = getBody(t, "http://"+addr+"/metrics")
		return strings.Contains(page, `gpu_dra_device_taint{`) && strings.Contains(page, twoUnhealthy) &&
			strings.Contains(logs.String(), `"reason":"GPU0Xid79`)
	}) {
		t.Fatalf("within %s: taint on the page %v, %q on the page %v, True condition in the log %v; log:\n%s",
			2*waitTimeout, strings.Contains(page, `gpu_dra_device_taint{`), twoUnhealthy, strings.Contains(page, twoUnhealthy),
			strings.Contains(logs.String(), `"reason":"GPU0Xid79`), logs.String())
	}
	for _, want := range []string{
		`gpu_dra_device_taint{compute_instance="",dra_device="gpu-1",dra_driver="gpu.nvidia.com",dra_pool="dra-node-1",effect="NoSchedule",gpu="1",gpu_instance="",key="gpu.nvidia.com/xid",mig_profile="",`,
		`gpu_exporter_collector_up{collector="dra_slices"} 1`,
		`gpu_exporter_collector_up{collector="node_condition"} 1`,
		`dra_claim_name="infer-0-main-gpu-2-mig-1g10gb-19-1",dra_claim_namespace="ml",dra_device_name="gpu-2-mig-1g10gb-19-1",dra_driver_name="gpu.nvidia.com",dra_mig_device_uuid="MIG-`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
}
