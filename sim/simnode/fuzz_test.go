package simnode

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
)

// fuzzClock is a clock the fuzz target moves; hung NVML calls read it from
// their own goroutines.
type fuzzClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fuzzClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fuzzClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// FuzzParseScenario: ParseScenario never panics, refuses bad input with a
// "scenario NAME..." error, and whatever it accepts builds with New and runs:
// the kubelet view, the XID events and NVML samples taken at several moments
// of the scenario, faults (lost and hanging GPUs) included.
func FuzzParseScenario(f *testing.F) {
	for _, seed := range []string{
		"",
		defaultScenarioYAML,
		"seed: 7\nnode:\n  model: A100-SXM4-80GB\n  count: 4\n  driverVersion: \"550.54.15\"\n  cudaDriverVersion: \"12.4\"\ngpus:\n" +
			"  - index: 0\n    workload:\n      preset: training\n      phases:\n        - after: 2m\n          preset: idle-held\n" +
			"  - index: 1\n    workload:\n      utilization: {mean: 0.5, amplitude: 0.3, period: 5m, noise: 0.05}\n      memory: {mean: 0.4}\n" +
			"  - index: 2\n    mig:\n      - {profile: 3g.40gb, workload: {preset: busy}}\n      - {profile: 1g.10gb}\n",
		"node: {count: 8, flavour: gke, minorNumbers: [7, 6, 5, 4, 3, 2, 1, 0]}\n" +
			"sharing: {timeSlicing: {gpus: [1], replicas: 4}}\n" +
			"gpus: [{index: 0, mig: [{profile: 1g.10gb}, {profile: 2g.20gb}]}]\n" +
			"pods:\n  - {namespace: a, name: p, start: 1s, stop: 5s, containers: [{name: c, devices: [{gpu: 0, mig: 1}, {gpu: 1, replica: 3}]}]}\n" +
			"  - {namespace: a, name: cpu, containers: [{name: c}]}\n",
		"node: {count: 4}\nfaults:\n  - {at: 10s, gpu: 3, xid: 79}\n  - {at: 12s, gpu: 1, xid: 13, count: 2}\n" +
			"  - {at: 1s, until: 40s, gpu: 2, lost: true}\n  - {at: 1s, until: 3s, gpu: 0, hang: true}\n" +
			"  - {at: 0s, gpu: 0, ecc: {corrected: 5, uncorrected: 2}}\n  - {at: 0s, gpu: 1, throttle: [hw_thermal_slowdown]}\n" +
			"  - {at: 0s, gpu: 2, remap: {uncorrectable: 3, pending: true}}\n  - {at: 0s, gpu: 3, recoveryAction: node_reboot}\n" +
			"  - {at: 5s, devicePlugin: {allocatable: 1}}\n",
		"node: {model: B200-SXM5-180GB, count: 2}\ngpus: [{index: 1, mig: [{profile: 7g.180gb}]}]\n",
		"node:\n  model: H100-SXM5-80GB\n  count: 99\n",
		"gpus: [{index: 0, workload: {preset: bsy}}]\n",
		"pods: [{namespace: a, name: b, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}]\n",
		"node: {count: 1}\ngpus: [{index: 0, workload: {utilization: {mean: 2}}}]\n",
		"seed: [\n",
		"node: &a {count: *a}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := ParseScenario("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "scenario ") {
				t.Fatalf("error does not name the scenario: %v", err)
			}
			return
		}
		clk := &fuzzClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		start := clk.now()
		n, err := New(sc, WithClock(clk.now))
		if err != nil {
			t.Fatalf("a scenario that parses does not build: %v\n%s", err, data)
		}
		defer n.Close()
		if got := len(n.Devices()); got != sc.Node.Count {
			t.Fatalf("%d devices for node.count %d", got, sc.Node.Count)
		}
		s, err := nvmlsampler.NewSampler(n, nvmlsampler.SamplerConfig{DeviceTimeout: 20 * time.Millisecond, Log: zerolog.Nop(), Now: clk.now})
		if err != nil {
			t.Fatalf("the sampler refuses a node that builds: %v", err)
		}
		// nvmlInit runs in its own goroutine and may outlast one DeviceTimeout
		// on a loaded machine; until it returns no GPU is known, and the
		// sample must say why.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			first := s.Sample(context.Background())
			if first.NVML.Inits > 0 {
				break
			}
			if len(first.GPUs) != 0 || first.NVML.Down == "" {
				t.Fatalf("before nvmlInit returned: %d GPUs, down reason %q; want none, and a reason", len(first.GPUs), first.NVML.Down)
			}
			if time.Now().After(deadline) {
				t.Fatalf("nvmlInit of the simulated node did not return within a minute: %s", first.NVML.Down)
			}
		}
		// The moments that matter: the start, every fault and pod boundary.
		moments := []time.Duration{0}
		for _, fl := range sc.Faults {
			moments = append(moments, time.Duration(fl.At), time.Duration(fl.Until))
		}
		for _, p := range sc.Pods {
			moments = append(moments, time.Duration(p.Start), time.Duration(p.Stop))
		}
		if len(moments) > 8 {
			moments = moments[:8]
		}
		for _, m := range moments {
			clk.set(start.Add(m))
			for _, pod := range n.KubeletPods() {
				if pod.Name == "" || pod.Namespace == "" {
					t.Fatalf("the kubelet lists a pod without a name: %+v", pod)
				}
			}
			n.KubeletAllocatable()
			n.DevicePluginAllocatable()
			n.XIDsBetween(0, m+time.Nanosecond)
			sample := s.Sample(context.Background())
			if len(sample.GPUs) != sc.Node.Count {
				t.Fatalf("a sample has %d GPUs, want %d", len(sample.GPUs), sc.Node.Count)
			}
		}
	})
}
