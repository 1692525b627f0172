package collector_test

import (
	"context"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// flapScenario: eight GPUs, one time-sliced by two pods, one in MIG mode,
// fourteen faults over four minutes (hangs, a GPU lost and back, XIDs,
// throttling, ECC, row remapping, a reset, a dead device plugin), a pod
// that comes and goes on the shared GPU (first by namespace, so it would
// take the series' labels if the holder were picked afresh each sample) and,
// from compatFlaps, a kubelet that does not answer for 40s.
const flapScenario = `
seed: 5
node: {model: H100-SXM5-80GB, count: 8}
gpus:
  - {index: 0, workload: {preset: training}}
  - {index: 1, workload: {preset: busy}}
  - {index: 2, workload: {preset: idle-held}}
  - {index: 3, workload: {preset: training}}
  - {index: 4, workload: {preset: inference}}
  - {index: 5, workload: {preset: busy}}
  - {index: 6, workload: {preset: free}}
  - index: 7
    mig:
      - {profile: 3g.40gb, workload: {preset: busy}}
      - {profile: 1g.10gb, workload: {preset: inference}}
pods:
  - {namespace: ml, name: train-0, containers: [{name: c, devices: [{gpu: 0}, {gpu: 1}]}]}
  - {namespace: research, name: nb-0, containers: [{name: c, devices: [{gpu: 2}]}]}
  - {namespace: ml, name: train-1, containers: [{name: c, devices: [{gpu: 3}]}]}
  - {namespace: inference, name: api-0, containers: [{name: c, devices: [{gpu: 4}]}]}
  - {namespace: inference, name: shared-0, containers: [{name: c, devices: [{gpu: 5, replica: 0}]}]}
  - {namespace: batch, name: shared-1, containers: [{name: c, devices: [{gpu: 5, replica: 1}]}]}
  - {namespace: aaa, name: late, start: 60s, stop: 150s, containers: [{name: c, devices: [{gpu: 5, replica: 2}]}]}
  - {namespace: inference, name: small-0, containers: [{name: c, devices: [{gpu: 7, mig: 0}]}]}
sharing:
  timeSlicing: {gpus: [5], replicas: 4}
faults:
  - {at: 10s, gpu: 0, xid: 13, count: 2}
  - {at: 20s, until: 45s, gpu: 1, hang: true}
  - {at: 30s, until: 70s, gpu: 3, lost: true}
  - {at: 40s, until: 90s, gpu: 4, throttle: [hw_thermal_slowdown]}
  - {at: 50s, gpu: 2, ecc: {corrected: 5}}
  - {at: 60s, gpu: 0, remap: {correctable: 1, pending: true}}
  - {at: 70s, gpu: 0, xid: 48}
  - {at: 80s, until: 100s, gpu: 5, hang: true}
  - {at: 95s, gpu: 2, reset: true}
  - {at: 110s, until: 140s, devicePlugin: {allocatable: 0}}
  - {at: 120s, gpu: 7, xid: 94, mig: 0}
  - {at: 130s, until: 160s, gpu: 6, lost: true}
  - {at: 170s, gpu: 1, recoveryAction: gpu_reset}
  - {at: 180s, until: 200s, gpu: 2, hang: true}
`

// flapNode is the simulated node with DCGM, its kubelet and the
// compatibility families, on a clock that moves only when told.
type flapNode struct {
	clk    *fixedClock
	node   *simnode.Node
	kube   *fakekubelet.Server
	client *podmap.Client
	dcgm   *dcgm.Sampler
	e      *collector.Exporter
	// kubeDown: the kubelet does not answer; the exporter keeps the last
	// holders it heard of.
	kubeDown bool
}

func newFlapNode(t *testing.T, sc *simnode.Scenario, cc render.CompatConfig) *flapNode {
	t.Helper()
	clk := newClock()
	// DCGM samples every 20ms of wall time; its values carry the simulated
	// clock's timestamps, so each exporter step sees one new DCGM sample.
	// MaxMissed keeps a value of the last step fresh for a step of wall time.
	tn := newTestExporter(t, withScenario(sc), withClock(clk), withKubelet(), withPodMapOnWallClock(),
		withDCGM(nil), withDCGMConfig(func(c *dcgm.Config) { c.MaxMissed = 500 }),
		withSamplerConfig(func(c *nvmlsampler.SamplerConfig) { c.DeviceTimeout = 500 * time.Millisecond }),
		withGroups(fullGroups()), withConfig(func(c *collector.Config) { c.Compat = &cc }))
	return &flapNode{clk: clk, node: tn.node, kube: tn.kube, client: tn.client, dcgm: tn.ds, e: tn.e}
}

// step moves the clock by d, refreshes the pods, waits (bounded) until DCGM
// has sampled at the new time, takes a sample and scrapes it.
func (fn *flapNode) step(t *testing.T, d time.Duration) map[string]*dto.MetricFamily {
	t.Helper()
	fn.clk.Advance(d)
	fn.kube.SetPods(fn.node.KubeletPods())
	fn.kube.SetAllocatable(fn.node.KubeletAllocatable())
	if err := fn.client.Refresh(context.Background()); (err != nil) != fn.kubeDown {
		t.Fatalf("kubelet refresh with the kubelet down %v: %v", fn.kubeDown, err)
	}
	since := time.Now()
	deadline := since.Add(10 * time.Second)
	for {
		if snap := fn.dcgm.Snapshot(); snap.Up && snap.Time.After(since) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no DCGM sample within 10s: %s", fn.dcgm.Snapshot().Reason)
		}
		time.Sleep(2 * time.Millisecond)
	}
	fn.e.SampleOnce(context.Background())
	rec := httptest.NewRecorder()
	fn.e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape answered %d", rec.Code)
	}
	return fltParse(t, rec.Body.Bytes())
}

// flapDevice names a device of a compatibility series: its UUID and GPU
// instance (empty for a whole GPU).
type flapDevice struct{ uuid, gi string }

// flapRecord tracks one family on one device over the steps.
type flapRecord struct {
	present bool
	labels  string // the holder labels of its series when present
	dev     flapDevice
	missing bool // absent while its device is up
	gaps    int  // times it went absent while its device was up
	churns  int  // times its label set changed while its device was up and its old holder still held it
}

// compatFlaps steps the node through the scenario and counts, per family
// and device, how often a series that was served before went missing while
// its device is up (gpu_up 1), and how often it changed its label set while
// its device stayed up and the holder it named still held the device.
func compatFlaps(t *testing.T, fn *flapNode, steps int, every time.Duration) map[string]*flapRecord {
	t.Helper()
	recs := map[string]*flapRecord{}
	wasUp := map[flapDevice]bool{}
	for i := 0; i < steps; i++ {
		switch i {
		case steps / 3: // a kubelet restart that takes 40s
			fn.kube.Stop()
			fn.kubeDown = true
		case steps/3 + 8:
			if err := fn.kube.Restart(); err != nil {
				t.Fatal(err)
			}
			fn.kubeDown = false
		}
		mfs := fn.step(t, every)
		up := map[flapDevice]bool{}
		for _, m := range fltFind(mfs, "gpu_up", nil) {
			l := fltLabels(m)
			if fltValue(m) == 1 {
				up[flapDevice{l["uuid"], l["gpu_instance"]}] = true
			}
		}
		// Who holds what: namespace/pod/container per device.
		holds := map[flapDevice]map[string]bool{}
		for _, m := range fltFind(mfs, "gpu_allocation_info", nil) {
			l := fltLabels(m)
			d := flapDevice{l["uuid"], l["gpu_instance"]}
			if holds[d] == nil {
				holds[d] = map[string]bool{}
			}
			holds[d][l["namespace"]+"/"+l["pod"]+"/"+l["container"]] = true
		}
		// The rates are DCGM's own, as it reports them.
		snap := fn.dcgm.Snapshot()
		for _, m := range fltFind(mfs, "DCGM_FI_PROF_PCIE_TX_BYTES", nil) {
			l := fltLabels(m)
			dv, ok := snap.Find(l["UUID"], -1)
			if r, rok := dv.Rate(dcgm.PCIeTxBytes); !ok || !rok || r != fltValue(m) {
				t.Errorf("%v: DCGM_FI_PROF_PCIE_TX_BYTES{gpu=%s} = %v, DCGM's rate %v (present %v)", time.Duration(i+1)*every, l["gpu"], fltValue(m), r, rok)
			}
		}
		now := map[string]string{}
		devOf := map[string]flapDevice{}
		for _, name := range render.CompatFamilyNames() {
			for _, m := range fltFind(mfs, name, nil) {
				l := fltLabels(m)
				d := flapDevice{l["UUID"], l["GPU_I_ID"]}
				k := name + " " + d.uuid + "/" + d.gi
				now[k] = l["namespace"] + "/" + l["pod"] + "/" + l["container"]
				devOf[k] = d
			}
		}
		for k, r := range recs {
			d := r.dev
			if !up[d] {
				r.missing = false // a device that is down has no values
				continue
			}
			lv, ok := now[k]
			switch {
			case !ok && !r.missing:
				r.missing = true
				r.gaps++
				t.Logf("%v: %s missing while its device is up", time.Duration(i+1)*every, k)
			case ok && wasUp[d] && r.present && lv != r.labels && holds[d][r.labels]:
				r.churns++
				t.Logf("%v: %s changed holder %s -> %s while %s still holds it", time.Duration(i+1)*every, k, r.labels, lv, r.labels)
			}
		}
		for k, r := range recs {
			_, r.present = now[k]
		}
		for k, lv := range now {
			r := recs[k]
			if r == nil {
				r = &flapRecord{dev: devOf[k]}
				recs[k] = r
			}
			r.present, r.missing, r.labels = true, false, lv
		}
		wasUp = up
	}
	return recs
}

func TestCompatSeriesDoNotFlapDuringFaults(t *testing.T) {
	sc, err := simnode.ParseScenario("flap.yaml", []byte(flapScenario))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cc   render.CompatConfig
	}{
		{"one series per device", render.CompatConfig{Hostname: "n", NvidiaResourceNames: sharedResource}},
		{"kubernetes-virtual-gpus", render.CompatConfig{Hostname: "n", VirtualGPUs: true, NvidiaResourceNames: sharedResource}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fn := newFlapNode(t, sc, tc.cc)
			recs := compatFlaps(t, fn, 48, 5*time.Second) // four minutes
			var bad []string
			families := map[string]bool{}
			for k, r := range recs {
				families[strings.Fields(k)[0]] = true
				if r.gaps+r.churns > 0 {
					bad = append(bad, k)
				}
			}
			sort.Strings(bad)
			for _, k := range bad {
				t.Errorf("%s: missing %d times and relabelled %d times while its device was up", k, recs[k].gaps, recs[k].churns)
			}
			// The test watches every family: a family never served would
			// never flap.
			for _, name := range render.CompatFamilyNames() {
				if name != "DCGM_FI_DEV_FB_RESERVED" && !families[name] {
					t.Errorf("%s never served", name)
				}
			}
		})
	}
}
