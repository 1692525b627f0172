package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

func TestDefaultScenario(t *testing.T) {
	s := DefaultScenario()
	if s.Node.Count != 8 || s.Node.Model != "H100-SXM5-80GB" {
		t.Fatalf("default node: %+v", s.Node)
	}
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(n.Devices()[7].MIG()); got != 4 {
		t.Errorf("GPU 7 has %d MIG instances, want 4", got)
	}
}

func TestScenarioErrorsNameFileLineField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field", "node:\n  modle: H100-SXM5-80GB\n", "scenario bad.yaml:2: field modle not found (not a field of NodeSpec"}, //nolint:misspell // the misspelt field is the test
		{"bad model", "node:\n  model: H101\n", "bad.yaml:2: field node.model: unknown GPU model \"H101\""},
		{"count", "node:\n  count: 0\n  model: A30-PCIE-24GB\n", "bad.yaml:2: field node.count: 0 GPUs: a node has 1 to 64 (leave count out"},
		{"count left out", "node:\n  model: A30-PCIE-24GB\n", ""},
		{"second document", "node: {count: 2}\n---\nnode: {count: 4}\n", "bad.yaml:2: a second YAML document"},
		{"document end marker ok", "node: {count: 2}\n...\n", ""},
		{"negative remap", "faults:\n  - gpu: 0\n    remap: {correctable: -2}\n", "bad.yaml:3: field faults[0].remap.correctable: -2 remapped rows"},
		{"negative uncorrectable remap", "faults:\n  - gpu: 0\n    remap:\n      uncorrectable: -1\n", "bad.yaml:4: field faults[0].remap.uncorrectable: -1 remapped rows"},
		{"negative banks", "faults:\n  - gpu: 0\n    remap: {banks: {low: -1}}\n", "field faults[0].remap.banks.low: -1 banks: a count is 0 or more"},
		{"more banks than a GPU has", "faults:\n  - gpu: 0\n    remap: {banks: {none: 641}}\n", "field faults[0].remap.banks: 641 banks out of max availability: a simulated GPU has 640 banks"},
		{"walk too fast", "faults:\n  - gpu: 0\n    remap: {walkEvery: 10ms}\n", "field faults[0].remap.walkEvery: 10ms: a walk steps at most once a second; give 1s or more"},
		{"fault count 0", "faults:\n  - gpu: 0\n    xid: 79\n    count: 0\n", "bad.yaml:4: field faults[0].count: 0: count is 1 to 1000"},
		{"two pods one GPU", "pods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 1}]}]}\n  - {namespace: b, name: q, containers: [{name: c, devices: [{gpu: 1}]}]}\n",
			"bad.yaml:3: field pods[1].containers[0].devices[0]: GPU 1 is already held by a/p/c (pods[0].containers[0].devices[0])"},
		{"two containers one GPU", "pods:\n  - namespace: a\n    name: p\n    containers:\n      - {name: c, devices: [{gpu: 1}]}\n      - {name: d, devices: [{gpu: 1}]}\n",
			"bad.yaml:6: field pods[0].containers[1].devices[0]: GPU 1 is already held by a/p/c"},
		{"one GPU in turn", "pods:\n  - {namespace: a, name: p, stop: 1m, containers: [{name: c, devices: [{gpu: 1}]}]}\n  - {namespace: b, name: q, start: 1m, containers: [{name: c, devices: [{gpu: 1}]}]}\n", ""},
		{"one MIG instance twice", "gpus:\n  - index: 0\n    mig: [{profile: 3g.40gb}, {profile: 3g.40gb}]\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}\n",
			"field pods[1].containers[0].devices[0]: MIG instance 1 of GPU 0 is already held by a/p/c"},
		{"one replica twice", "sharing: {timeSlicing: {gpus: [2], replicas: 4}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 0}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 2, replica: 0}]}]}\n",
			"replica 0 of GPU 2 is already held by a/p/c"},
		{"replicas shared", "sharing: {timeSlicing: {gpus: [2], replicas: 4}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 0}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 2, replica: 1}]}]}\n", ""},
		{"MPS replicas shared", "sharing: {mps: {gpus: [2], replicas: 4}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 0}], processes: [{memory: {mean: 0.1}}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 2, replica: 1}]}]}\n", ""},
		{"MPS replica twice", "sharing: {mps: {gpus: [2], replicas: 2}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 1}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 2, replica: 1}]}]}\n",
			"replica 1 of GPU 2 is already held by a/p/c"},
		{"MPS replica out of range", "sharing: {mps: {gpus: [2], replicas: 2}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 2}]}]}\n",
			"field pods[0].containers[0].devices[0].replica: replica 2 is outside 0..1"},
		{"MPS GPU without replica", "sharing: {mps: {gpus: [2], replicas: 2}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2}]}]}\n",
			"GPU 2 is shared (time-slicing or MPS): name the replica a container holds"},
		{"MPS and time-slicing", "sharing: {mps: {gpus: [2], replicas: 2}, timeSlicing: {gpus: [3], replicas: 2}}\n",
			"field sharing.mps: sharing names both timeSlicing and mps"},
		{"MPS one replica", "sharing: {mps: {gpus: [2], replicas: 1}}\n", "field sharing.mps.replicas: 1 replicas: MPS shares a GPU between 2 and 48 clients"},
		{"MPS on MIG", "gpus:\n  - {index: 2, mig: [{profile: 3g.40gb}]}\nsharing: {mps: {gpus: [2], replicas: 2}}\n",
			"field sharing.mps.gpus[0]: GPU 2 is in MIG mode: the device plugin shares only whole GPUs through MPS"},
		{"MPS client off MPS", "sharing: {timeSlicing: {gpus: [2], replicas: 2}}\npods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 2, replica: 0}], processes: [{mps: true}]}]}\n",
			"field pods[0].containers[0].processes[0].mps: GPU 2 is not shared through MPS: list it in sharing.mps.gpus"},
		{"count too big", "node:\n  count: 65\n", "bad.yaml:2: field node.count: 65 GPUs"},
		{"index", "gpus:\n  - index: 8\n", "bad.yaml:2: field gpus[0].index: GPU index 8 is outside 0..7"},
		{"twice", "gpus:\n  - index: 1\n  - index: 1\n", "bad.yaml:3: field gpus[1].index: GPU 1 is described twice"},
		{"compute instance workloads", "gpus:\n  - index: 0\n    mig: [{profile: 3g.40gb, computeInstances: 2, computeInstanceWorkloads: [{preset: busy}, {preset: idle}]}]\n", ""},
		{"too many compute instance workloads", "gpus:\n  - index: 0\n    mig:\n      - {profile: 3g.40gb, computeInstanceWorkloads: [{preset: busy}, {preset: idle}]}\n",
			"field gpus[0].mig[0].computeInstanceWorkloads: 2 workloads for 1 compute instances"},
		{"compute instance workload preset", "gpus:\n  - index: 0\n    mig:\n      - {profile: 3g.40gb, computeInstances: 2, computeInstanceWorkloads: [{preset: bsy}]}\n",
			"field gpus[0].mig[0].computeInstanceWorkloads[0].preset: unknown preset \"bsy\""},
		{"preset", "gpus:\n  - index: 0\n    workload:\n      preset: bsy\n", "bad.yaml:4: field gpus[0].workload.preset: unknown preset \"bsy\""},
		{"curve", "gpus:\n  - index: 0\n    workload:\n      utilization: {mean: 1.5}\n", "bad.yaml:4: field gpus[0].workload.utilization.mean: 1.5 is outside 0..1"},
		{"period", "gpus:\n  - index: 0\n    workload:\n      utilization: {mean: 0.5, amplitude: 0.2}\n", "field gpus[0].workload.utilization.period: an amplitude needs a period"},
		{"duration", "gpus:\n  - index: 0\n    workload:\n      phases:\n        - after: soon\n", "line 5: \"soon\" is not a duration"},
		{"phase order", "gpus:\n  - index: 0\n    workload:\n      phases:\n        - after: 2m\n        - after: 1m\n", "bad.yaml:6: field gpus[0].workload.phases[1].after: phases must be in increasing order"},
		{"mig profile", "gpus:\n  - index: 0\n    mig:\n      - profile: 9g.99gb\n", "bad.yaml:4: field gpus[0].mig[0].profile: unknown MIG profile \"9g.99gb\""},
		{"mig overflow", "gpus:\n  - index: 0\n    mig:\n      - profile: 4g.40gb\n      - profile: 4g.40gb\n", "bad.yaml:5: field gpus[0].mig[1].profile: 4g.40gb does not fit"},
		{"mig on A30 ok", "node: {model: A30-PCIE-24GB, count: 1}\ngpus:\n  - index: 0\n    mig:\n      - profile: 1g.6gb\n", ""},
		{"no MIG model", "node: {model: A100-PCIE-40GB, count: 1}\ngpus:\n  - index: 0\n    mig:\n      - profile: 1g.5gb\n", ""},
		{"process device", "pods:\n  - namespace: a\n    name: p\n    containers:\n      - name: c\n        devices: [{gpu: 1}]\n        processes: [{device: 1}]\n",
			"bad.yaml:7: field pods[0].containers[0].processes[0].device: device 1: the container holds 1 devices"},
		{"process curve", "pods:\n  - namespace: a\n    name: p\n    containers:\n      - name: c\n        devices: [{gpu: 1}]\n        processes: [{memory: {mean: 2}}]\n",
			"field pods[0].containers[0].processes[0].memory.mean: 2 is outside 0..1"},
		{"PID twice at once", "pods:\n  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 1}], processes: [{pid: 77}]}]}\n  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 2}], processes: [{pid: 77}]}]}\n",
			"field pods[1].containers[0].processes[0].pid: PID 77 is in use by pods[0].containers[0].processes[0] at the same time"},
		{"PID reused in turn", "pods:\n  - {namespace: a, name: p, stop: 1m, containers: [{name: c, devices: [{gpu: 1}], processes: [{pid: 77}]}]}\n  - {namespace: a, name: q, start: 1m, containers: [{name: c, devices: [{gpu: 2}], processes: [{pid: 77}]}]}\n", ""},
		{"host process on MIG GPU", "gpus:\n  - index: 0\n    mig: [{profile: 3g.40gb}]\nhostProcesses:\n  - {gpu: 0}\n", "field hostProcesses[0].mig: GPU 0 is in MIG mode"},
		{"cgroup driver", "node: {cgroupDriver: systemd}\n", "field node.cgroupDriver: unknown cgroup driver \"systemd\"; known: cgroupfs-v1, cgroupfs-v2, systemd-v1, systemd-v2"},
		{"runtime", "node: {runtime: rkt}\n", "field node.runtime: unknown container runtime \"rkt\""},
		{"cuda", "node:\n  cudaDriverVersion: twelve\n", "bad.yaml:2: field node.cudaDriverVersion: \"twelve\" is not a CUDA version"},
		{"yaml syntax", "node: [\n", "bad.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseScenario("bad.yaml", []byte(tc.yaml))
			if tc.want == "" {
				if err != nil && !strings.Contains(tc.name, "no MIG") {
					t.Errorf("%s: unexpected error %v", tc.name, err)
				}
				return
			}
			if err == nil {
				t.Errorf("%s: accepted", tc.name)
				return
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
			}
		})
	}
}

func TestLoadScenarioRefusesHugeFiles(t *testing.T) {
	f := filepath.Join(t.TempDir(), "huge.yaml")
	// Valid YAML all the way (a comment), so only the size can refuse it.
	if err := os.WriteFile(f, append([]byte("node: {count: 2}\n#"), make([]byte, MaxScenarioBytes)...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadScenario(f)
	if err == nil || !strings.Contains(err.Error(), "the limit is 4194304 bytes (4 MiB)") {
		t.Fatalf("a %d-byte scenario: %v", MaxScenarioBytes+18, err)
	}
	// Exactly at the limit still loads.
	at := append([]byte("node: {count: 2}\n#"), make([]byte, MaxScenarioBytes-18)...)
	for i := 18; i < len(at); i++ {
		at[i] = 'x'
	}
	if err := os.WriteFile(f, at, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadScenario(f); err != nil {
		t.Fatalf("a scenario of exactly the limit: %v", err)
	}
}

func TestLoadScenarioFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(f, []byte("seed: 3\nnode: {model: A100-SXM4-80GB, count: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := LoadScenario(f)
	if err != nil {
		t.Fatal(err)
	}
	if s.Seed != 3 || s.Node.Count != 2 {
		t.Errorf("loaded %+v", s)
	}
	if _, err := LoadScenario(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file error: %v", err)
	}
}

func TestTelemetryDeterministicAndMoving(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := base
	clock := func() time.Time { return now }
	a, _ := New(nil, WithClock(clock))
	b, _ := New(nil, WithClock(clock))
	now = base.Add(42 * time.Second)
	ua, _ := a.Devices()[2].GetUtilizationRates()
	ub, _ := b.Devices()[2].GetUtilizationRates()
	if ua != ub {
		t.Errorf("same seed and time, different telemetry: %v vs %v", ua, ub)
	}
	if a.Devices()[0].UUID() != b.Devices()[0].UUID() {
		t.Error("UUIDs differ for the same seed")
	}
	seen := map[uint32]bool{}
	for i := 0; i < 20; i++ {
		now = base.Add(time.Duration(i) * 13 * time.Second)
		u, _ := a.Devices()[2].GetUtilizationRates()
		seen[u.Gpu] = true
	}
	if len(seen) < 5 {
		t.Errorf("training GPU telemetry barely moves: %v", seen)
	}
	// Busy GPUs are busy, idle ones idle, the free one has its memory free.
	busy, _ := a.Devices()[0].GetUtilizationRates()
	idle, _ := a.Devices()[4].GetUtilizationRates()
	free, _ := a.Devices()[5].GetMemoryInfo()
	if busy.Gpu < 80 || idle.Gpu > 2 || float64(free.Used)/float64(free.Total) > 0.05 {
		t.Errorf("presets off: busy %d%%, idle %d%%, free GPU uses %d of %d bytes", busy.Gpu, idle.Gpu, free.Used, free.Total)
	}
	c, _ := New(&Scenario{Seed: 9, Node: a.Scenario.Node}, WithClock(clock))
	if c.Devices()[0].UUID() == a.Devices()[0].UUID() {
		t.Error("another seed gives the same UUIDs")
	}
}

func TestEnergyOnlyGrows(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n, _ := New(nil, WithClock(func() time.Time { return now }))
	var last uint64
	for i := 0; i < 10; i++ {
		now = now.Add(5 * time.Second)
		e, _ := n.Devices()[1].GetTotalEnergyConsumption()
		if e <= last {
			t.Fatalf("energy went from %d to %d", last, e)
		}
		last = e
	}
}

// The generated host tree follows the scenario: a reused PID gets a new
// /proc entry with the new container's cgroup, log links follow the pods.
func TestHostTreeFollowsProcesses(t *testing.T) {
	sc, err := ParseScenario("t.yaml", []byte(`
node: {count: 1, runtime: cri-o}
sharing: {timeSlicing: {gpus: [0], replicas: 2}}
pods:
  - {namespace: a, name: p, stop: 1m, containers: [{name: c, devices: [{gpu: 0, replica: 0}], processes: [{pid: 77, memory: {mean: 0.5}}]}]}
  - {namespace: a, name: q, start: 1m, containers: [{name: c, devices: [{gpu: 0, replica: 1}], processes: [{pid: 77, memory: {mean: 0.25}}]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	n, err := New(sc, WithClock(func() time.Time { return now }), WithHostDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	root, _ := n.HostProc()
	logs, _ := n.HostLogDir()
	read := func() (string, []string) {
		b, _ := os.ReadFile(filepath.Join(root, "77", "cgroup"))
		ents, _ := os.ReadDir(logs)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return string(b), names
	}
	ps, ret := n.Devices()[0].GetComputeRunningProcesses()
	cg1, logs1 := read()
	now = now.Add(90 * time.Second)
	ps2, _ := n.Devices()[0].GetComputeRunningProcesses()
	cg2, logs2 := read()
	if ret != 0 || len(ps) != 1 || len(ps2) != 1 || ps[0].Pid != 77 || ps2[0].UsedGpuMemory >= ps[0].UsedGpuMemory {
		t.Fatalf("process lists %+v then %+v", ps, ps2)
	}
	if cg1 == cg2 || !strings.Contains(cg1, "crio-") || len(logs1) != 1 || len(logs2) != 1 || logs1[0] == logs2[0] ||
		!strings.HasPrefix(logs1[0], "p_a_c-") || !strings.HasPrefix(logs2[0], "q_a_c-") {
		t.Errorf("host tree did not follow: cgroup %q -> %q, logs %v -> %v", cg1, cg2, logs1, logs2)
	}
}

func TestResetAndECCFaultChecks(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"faults:\n  - {gpu: 0, at: 1m, reset: true}\n", ""},
		{"faults:\n  - {gpu: 0, at: 1m, until: 2m, reset: true}\n", "field faults[0].until: a reset happens at one moment"},
		{"faults:\n  - {gpu: 0, reset: true, lost: true}\n", "exactly one of"},
		{"faults:\n  - {gpu: 0, ecc: {corrected: 18000000000000000000}}\n", "field faults[0].ecc.corrected: 18000000000000000000 errors: at most 1000000000000"},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			_, err := ParseScenario("f.yaml", []byte(tc.yaml))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%q: %v", tc.yaml, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
			}
		})
	}
}

func TestSteadyScenarioHoldsEveryCurveAtItsMean(t *testing.T) {
	sc, err := ParseScenario("steady.yaml", []byte(`
steady: true
node: {model: H100-SXM5-80GB, count: 3}
gpus:
  - index: 0
    workload: {preset: training}
  - index: 1
    workload:
      utilization: {mean: 0.5, amplitude: 0.3, period: 5m, noise: 0.05}
      memory: {mean: 0.4, noise: 0.01}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := base
	n, err := New(sc, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	type reading struct {
		util, mem uint64
		temp      uint32
	}
	read := func(i int) reading {
		d := n.Devices()[i]
		u, _ := d.GetUtilizationRates()
		m, _ := d.GetMemoryInfo()
		tc, _ := d.GetTemperature(nvml.TEMPERATURE_GPU)
		return reading{uint64(u.Gpu), m.Used, tc}
	}
	for i := range 2 {
		t.Run(fmt.Sprintf("gpu%d", i), func(t *testing.T) {
			now = base.Add(7 * time.Second)
			first := read(i)
			for s := 1; s < 40; s++ {
				now = base.Add(time.Duration(s) * 11 * time.Second)
				if r := read(i); r != first {
					t.Fatalf("steady scenario, GPU %d moves: %+v at 7s, %+v at %ds", i, first, r, s*11)
				}
			}
		})
	}
	if u, _ := n.Devices()[1].GetUtilizationRates(); u.Gpu != 50 {
		t.Errorf("steady GPU 1 at %d%% busy, want its mean, 50%%", u.Gpu)
	}
}

// MPS as the driver and the device plugin show it: replicas <uuid>::<n> on
// nvidia.com/gpu (nvidia.com/gpu.shared with renameByDefault); the
// nvidia-cuda-mps-server in the compute list only, from the first client
// on, in the control daemon pod's cgroup; each client in the compute and
// MPS lists, held to 1/replicas of the memory and the SMs.
func TestMPSSharing(t *testing.T) {
	for _, rename := range []bool{false, true} {
		t.Run(fmt.Sprintf("renameByDefault=%v", rename), func(t *testing.T) {
			sc, err := ParseScenario("t.yaml", []byte(fmt.Sprintf(`
node: {count: 2}
sharing: {mps: {gpus: [0], replicas: 4, renameByDefault: %v}}
pods:
  - {namespace: a, name: p, start: 10s, containers: [{name: c, devices: [{gpu: 0, replica: 0}], processes: [{pid: 77, memory: {mean: 0.9}, utilization: {mean: 0.8}}]}]}
  - {namespace: a, name: q, containers: [{name: c, devices: [{gpu: 0, replica: 3}]}]}
`, rename)))
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1000, 0)
			n, err := New(sc, WithClock(func() time.Time { return now }), WithHostDir(t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			res, ids := "nvidia.com/gpu", 5 // the replicas and GPU 1
			if rename {
				res, ids = "nvidia.com/gpu.shared", 4
			}
			uuid := n.Devices()[0].UUID()
			alloc := n.KubeletAllocatable()
			if got := alloc[res]; len(got) != ids || got[0] != uuid+"::0" || got[3] != uuid+"::3" {
				t.Errorf("allocatable %s: %v, want %s::0..3 (and GPU 1 unless renamed)", res, got, uuid)
			}
			d := n.Devices()[0]
			if ps, _ := d.GetComputeRunningProcesses(); len(ps) != 0 {
				t.Errorf("before the first client: %+v, want no process (no MPS server yet)", ps)
			}
			now = now.Add(20 * time.Second)
			compute, _ := d.GetComputeRunningProcesses()
			mps, _ := d.GetMPSComputeRunningProcesses()
			if len(compute) != 2 || len(mps) != 1 || mps[0].Pid != 77 {
				t.Fatalf("compute %+v, MPS %+v: want the server and client 77, and client 77", compute, mps)
			}
			server := compute[0]
			if server.Pid == 77 {
				server = compute[1]
			}
			if server.UsedGpuMemory != 32<<20 {
				t.Errorf("MPS server memory %d, want 32 MiB", server.UsedGpuMemory)
			}
			total := d.cfg.MemoryMB << 20
			if mps[0].UsedGpuMemory != total/4 {
				t.Errorf("client memory %d, want its pinned limit %d", mps[0].UsedGpuMemory, total/4)
			}
			if u, _ := d.GetProcessUtilization(0); len(u) != 1 || u[0].SmUtil != 25 {
				t.Errorf("process utilization %+v, want client 77 at 25%% (its active thread percentage)", u)
			}
			root, _ := n.HostProc()
			stat, _ := os.ReadFile(filepath.Join(root, fmt.Sprint(server.Pid), "stat"))
			cg, _ := os.ReadFile(filepath.Join(root, fmt.Sprint(server.Pid), "cgroup"))
			if !strings.Contains(string(stat), "(nvidia-cuda-mps)") || !strings.Contains(string(cg), containerID(sc.Seed, mpsDaemonNamespace, mpsDaemonPod, mpsDaemonContainer)) {
				t.Errorf("MPS server in /proc: stat %q, cgroup %q", stat, cg)
			}
		})
	}
}

// TestEveryGeometryModelSimulates: every board of the MIG geometry table
// can be named in a scenario and reports what the table records for it:
// the name NVML gives it, its framebuffer and PCI device ID, and its MIG
// instances' memory.
func TestEveryGeometryModelSimulates(t *testing.T) {
	for _, m := range miggeometry.All() {
		t.Run(m.Model, func(t *testing.T) {
			p := m.Profiles[0]
			sc, err := ParseScenario("m.yaml", []byte(fmt.Sprintf("node: {model: %s, count: 1}\ngpus: [{index: 0, mig: [{profile: %q}]}]\n", m.Model, p.Name)))
			if err != nil {
				t.Fatal(err)
			}
			n, err := New(sc)
			if err != nil {
				t.Fatal(err)
			}
			d := n.Devices()[0]
			if name, _ := d.GetName(); !slices.Contains(m.NVMLNames, name) {
				t.Errorf("name %q; table: %v", name, m.NVMLNames)
			}
			if mem, _ := d.GetMemoryInfo(); mem.Total != m.MemoryMiB<<20 {
				t.Errorf("memory %d MiB; table: %d MiB", mem.Total>>20, m.MemoryMiB)
			}
			if pci, _ := d.GetPciInfo(); pci.PciDeviceId != m.PCIDeviceID {
				t.Errorf("PCI device ID %#x; table: %#x", pci.PciDeviceId, m.PCIDeviceID)
			}
			migs := d.MIG()
			if len(migs) != 1 {
				t.Fatalf("%d MIG devices, want 1", len(migs))
			}
			if mem, _ := migs[0].GetMemoryInfo(); mem.Total != p.MemoryMiB<<20 {
				t.Errorf("%s: %d MiB; table: %d MiB", p.Name, mem.Total>>20, p.MemoryMiB)
			}
		})
	}
}
