package collector_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakehost"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

func within(got, want, rel float64) bool {
	return math.Abs(got-want) <= rel*math.Max(1, math.Abs(want))
}

// Done-when: three pods time-slice GPU 6 of the default node; each has its
// own VRAM and activity, the memory of a process outside any pod is a
// series of its own, and chat-api-2, which runs nothing on its replica,
// goes idle on its own while the GPU is busy.
func TestSharedGPUPerHolder(t *testing.T) {
	pn, r := newProcNode(t, nil)
	p := pn.step(t, time.Second)
	g6 := []string{`gpu="6"`}
	total := num(t, p, "gpu_memory_total_bytes", g6...)
	room := total - 512<<20 // what the simulator spreads over processes
	pod := func(name string) []string { return append([]string{`pod="` + name + `"`}, g6...) }
	mem0 := num(t, p, "gpu_container_memory_used_bytes", pod("chat-api-0")...)
	mem1 := num(t, p, "gpu_container_memory_used_bytes", pod("chat-api-1")...)
	mem2 := num(t, p, "gpu_container_memory_used_bytes", pod("chat-api-2")...)
	outside := num(t, p, "gpu_memory_used_outside_pods_bytes", g6...)
	if !within(mem0, 0.30*room, 0.01) || !within(mem1, 0.17*room, 0.01) || mem2 != 0 || !within(outside, 0.04*room, 0.01) {
		t.Errorf("VRAM: chat-api-0 %.3g, chat-api-1 %.3g, chat-api-2 %.3g, outside pods %.3g; want about %.3g, %.3g, 0, %.3g",
			mem0, mem1, mem2, outside, 0.30*room, 0.17*room, 0.04*room)
	}
	if used := num(t, p, "gpu_memory_used_bytes", g6...); !near(mem0+mem1+mem2+outside+512<<20, used) {
		t.Errorf("per-holder VRAM %v + outside %v + driver reserve do not add up to the device's %v", mem0+mem1+mem2, outside, used)
	}
	act0 := num(t, p, "gpu_container_utilization_ratio", append(pod("chat-api-0"), `source="processes"`)...)
	act2 := num(t, p, "gpu_container_utilization_ratio", append(pod("chat-api-2"), `source="processes"`)...)
	if act0 <= 0.05 || act2 != 0 {
		t.Errorf("activity: chat-api-0 %v (want busy), chat-api-2 %v (want 0)", act0, act2)
	}
	// A GPU held alone keeps the device's figures, with their source.
	if s := series(p, "gpu_container_utilization_ratio", `pod="llm-pretrain-0"`, `gpu="0"`, `source="device"`); len(s) != 1 {
		t.Errorf("exclusive holder: %v", s)
	}
	// Never a PID label; at most 4 gpu_container_* series per holder.
	if strings.Contains(string(p.Plain), "pid=") {
		t.Error("a series carries a PID label")
	}
	for _, name := range []string{"chat-api-0", "chat-api-1", "chat-api-2", "llm-pretrain-0"} {
		n := 0
		for _, m := range []string{"gpu_container_memory_used_bytes", "gpu_container_utilization_ratio", "gpu_container_sm_active_ratio"} {
			n += len(series(p, m, `pod="`+name+`"`, `gpu="`))
		}
		if n == 0 || n > 4*2 { // llm-pretrain-0 holds two GPUs
			t.Errorf("%s: %d gpu_container_* series", name, n)
		}
	}

	for i := 0; i < 18; i++ {
		p = pn.step(t, 5*time.Second)
	}
	if u := num(t, p, "gpu_utilization_ratio", g6...); u < 0.2 {
		t.Fatalf("GPU 6 is not busy (%v): the test would prove nothing", u)
	}
	idle := func(name string) string {
		return value(t, p, "gpu_allocation_idle", pod(name)...)
	}
	if idle("chat-api-2") != "1" || idle("chat-api-0") != "0" || idle("chat-api-1") != "0" {
		t.Errorf("idle after 91s with a 1m window: chat-api-0 %s, chat-api-1 %s, chat-api-2 %s; want 0 0 1", idle("chat-api-0"), idle("chat-api-1"), idle("chat-api-2"))
	}
	if n := num(t, p, "gpu_idle_allocated_devices"); n != 1 {
		t.Errorf("gpu_idle_allocated_devices %v, want 1: GPU 4 (idle-held), not GPU 6, which has busy holders", n)
	}
	// The same on the status page's data.
	n, err := status.Decode(bytes.NewReader(p.StatusJSON))
	if err != nil {
		t.Fatal(err)
	}
	u := n.GPUs[6].Units[0]
	if !u.Shared || len(u.Holders) != 3 || u.OutsidePodsMemoryBytes == nil || u.OutsidePodsProcesses != 1 {
		t.Fatalf("GPU 6 on the status page: %+v", u)
	}
	for _, h := range u.Holders {
		if h.MemoryUsedBytes == nil || h.Activity == nil || h.ActivitySource != "processes" || len(h.Replicas) != 1 {
			t.Errorf("status holder %s: %+v", h.Ref(), h)
		}
		if (h.Pod == "chat-api-2") != h.Idle {
			t.Errorf("status holder %s idle=%v", h.Ref(), h.Idle)
		}
	}
	if reads := r.FileReads(); reads > 2*5 { // stat and cgroup of 4 PIDs, read once
		t.Errorf("process accounting read %d files in 19 samples: the cache does not hold", reads)
	}
}

// A PID that a new container reuses is credited to the new container; MPS
// clients and MIG instances are read; cgroup v1, cgroupfs and CRI-O paths.
func TestSharedGPUReusedPIDAndMIG(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-80GB, count: 2, cgroupDriver: cgroupfs-v1, runtime: cri-o}
gpus:
  - index: 1
    mig: [{profile: 3g.40gb}, {profile: 3g.40gb}]
sharing: {mps: {gpus: [0], replicas: 2}}
hostProcesses:
  - {gpu: 0, comm: Xorg, memory: {mean: 0.01}}
pods:
  - namespace: batch
    name: job-a
    stop: 1m
    containers:
      - name: main
        devices: [{gpu: 0, replica: 0}]
        processes: [{pid: 4242, mps: true, memory: {mean: 0.2}, utilization: {mean: 0.5}}]
  - namespace: batch
    name: job-b
    start: 1m
    containers:
      - name: main
        devices: [{gpu: 0, replica: 1}]
        processes: [{pid: 4242, mps: true, memory: {mean: 0.1}, utilization: {mean: 0.25}}]
  - namespace: ml
    name: mig-user
    containers:
      - name: c
        devices: [{gpu: 1, mig: 0}]
        processes: [{memory: {mean: 0.5}}]
`)
	pn, _ := newProcNode(t, sc)
	p := pn.step(t, 30*time.Second)
	g0 := `gpu="0"`
	room := num(t, p, "gpu_memory_total_bytes", g0, `gpu_instance=""`) - 512<<20
	if v := num(t, p, "gpu_container_memory_used_bytes", `pod="job-a"`, g0); !within(v, 0.2*room, 0.001) {
		t.Errorf("job-a VRAM %v, want %v", v, 0.2*room)
	}
	if v := num(t, p, "gpu_container_utilization_ratio", `pod="job-a"`, g0, `source="processes"`); v != 0.5 {
		t.Errorf("job-a activity %v, want 0.5 (an MPS client)", v)
	}
	p = pn.step(t, 35*time.Second)
	if s := series(p, "gpu_container_memory_used_bytes", `pod="job-a"`); len(s) != 0 {
		t.Errorf("job-a is gone but has %v", s)
	}
	if v := num(t, p, "gpu_container_memory_used_bytes", `pod="job-b"`, g0); !within(v, 0.1*room, 0.001) {
		t.Errorf("PID 4242 reused by job-b: its VRAM %v, want %v", v, 0.1*room)
	}
	if v := num(t, p, "gpu_memory_used_outside_pods_bytes", g0); !within(v, 0.01*room, 0.001) {
		t.Errorf("outside pods %v, want %v", v, 0.01*room)
	}
	// MIG: process lists are read per instance; one held alone keeps the
	// instance's own figures, and no outside-pods series (a device held
	// alone has its holder's).
	if s := series(p, "gpu_memory_used_outside_pods_bytes", `gpu="1"`); len(s) != 0 {
		t.Errorf("outside pods on MIG instances held alone: %v", s)
	}
	if s := series(p, "gpu_container_memory_used_bytes", `pod="mig-user"`); len(s) != 1 {
		t.Errorf("MIG holder: %v", s)
	}
	n, err := status.Decode(bytes.NewReader(p.StatusJSON))
	if err != nil {
		t.Fatal(err)
	}
	mig := n.GPUs[1].Units[0]
	if len(mig.Holders) != 1 || mig.Holders[0].Processes != 1 || mig.OutsidePodsMemoryBytes == nil || *mig.OutsidePodsMemoryBytes != 0 {
		t.Errorf("MIG instance 0 on the status page: %+v", mig)
	}
}

// Without process accounting a shared GPU's holders have no per-container
// series, rather than each being credited with the whole device.
func TestSharedGPUWithoutProcessAccounting(t *testing.T) {
	pn := newPodNode(t, nil)
	p := pn.step(t, time.Second)
	if s := series(p, "gpu_container_memory_used_bytes", `gpu="6"`); len(s) != 0 {
		t.Errorf("shared GPU without accounting: %v", s)
	}
	if s := series(p, "gpu_memory_used_outside_pods_bytes"); len(s) != 0 {
		t.Errorf("outside pods without accounting: %v", s)
	}
}

// sharedScenario is 8 time-sliced GPUs, 4 pods on each (32 containers), two
// processes per container (64 processes).
func sharedScenario(tb testing.TB) *simnode.Scenario {
	var b strings.Builder
	b.WriteString("node: {model: H100-SXM5-80GB, count: 8}\nsharing: {timeSlicing: {gpus: [0, 1, 2, 3, 4, 5, 6, 7], replicas: 4}}\npods:\n")
	for g := 0; g < 8; g++ {
		for r := 0; r < 4; r++ {
			fmt.Fprintf(&b, "  - namespace: team-%d\n    name: svc-%d-%d\n    containers:\n      - name: main\n        devices: [{gpu: %d, replica: %d}]\n", g, g, r, g, r)
			b.WriteString("        processes:\n          - {memory: {mean: 0.1, noise: 0.01}, utilization: {mean: 0.1, noise: 0.05}}\n          - {memory: {mean: 0.05}, utilization: {mean: 0.05, noise: 0.02}}\n")
		}
	}
	sc, err := simnode.ParseScenario("shared-8x4", []byte(b.String()))
	if err != nil {
		tb.Fatal(err)
	}
	return sc
}

// BenchmarkSampleSharedGPUs: one sample and render of 8 GPUs with 64
// processes in 32 containers, without and with process accounting; the
// difference is what accounting adds per sample (budget: 2 ms).
func BenchmarkSampleSharedGPUs(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "accounting=off"
		if on {
			name = "accounting=on"
		}
		b.Run(name, func(b *testing.B) {
			var pn *podNode
			if on {
				pn, _ = newProcNode(b, sharedScenario(b))
			} else {
				pn = newPodNode(b, sharedScenario(b))
			}
			p := pn.step(b, time.Second)
			if on && len(series(p, "gpu_container_memory_used_bytes")) != 32 {
				b.Fatalf("%d container series, want 32", len(series(p, "gpu_container_memory_used_bytes")))
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				pn.clk.Advance(5 * time.Second)
				pn.e.SampleOnce(context.Background())
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the process's user and system CPU time: what a sample costs on
// a shared machine, where wall time says more about the neighbours.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A proc root that is not the host's (the container's own /proc): no PID
// NVML reports is there. The exporter says so once, and every process
// counts as outside pods rather than being credited to anyone.
func TestProcRootNotTheHosts(t *testing.T) {
	other, err := fakehost.New(t.TempDir()) // PID 1 only
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	pn := newTestExporter(t, withHostDir(), withKubelet(), withProcessResolver(procs.NewResolver(procs.Config{ProcRoot: other.ProcRoot})),
		withLog(zerolog.New(&logs)))
	var p *collector.Page
	for i := 0; i < 3; i++ {
		p = pn.step(t, 5*time.Second)
	}
	if n := strings.Count(logs.String(), "none of the PIDs NVML reports is in the proc root"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
	for _, pod := range []string{"chat-api-0", "chat-api-1"} {
		if v := num(t, p, "gpu_container_memory_used_bytes", `pod="`+pod+`"`); v != 0 {
			t.Errorf("%s credited with %v bytes from processes it cannot be shown to run", pod, v)
		}
	}
	if v := num(t, p, "gpu_memory_used_outside_pods_bytes", `gpu="6"`); v == 0 {
		t.Error("the unattributed processes' memory is not outside pods")
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A proc root that can no longer be read (unmounted, removed, permission
// denied) while running: process accounting is down, with one clear log
// line, and no per-container or outside-pods figure is served rather than
// zeros for the pods and everything outside them. It comes back when the
// root can be read again.
func TestProcRootUnreadable(t *testing.T) {
	clk := newClock()
	node, err := simnode.New(nil, simnode.WithClock(clk.Now), simnode.WithHostDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	root, err := node.HostProc()
	if err != nil {
		t.Fatal(err)
	}
	logDir, _ := node.HostLogDir()
	ld, err := procs.NewLogDir(logDir)
	if err != nil {
		t.Fatal(err)
	}
	// The resolver reads the root through a link, which the test takes away
	// as an unmount would.
	link := filepath.Join(t.TempDir(), "proc")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	pn := newTestExporter(t, withNode(node), withClock(clk), withKubelet(), withLog(zerolog.New(&logs)),
		withProcessResolver(procs.NewResolver(procs.Config{ProcRoot: link, Identities: ld, Now: clk.Now})))
	g6 := []string{`gpu="6"`}
	p := pn.step(t, time.Second)
	if num(t, p, "gpu_container_memory_used_bytes", append(g6, `pod="chat-api-0"`)...) == 0 {
		t.Fatal("chat-api-0 uses no VRAM on GPU 6 while the root is readable: the test would prove nothing")
	}

	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p = pn.step(t, 5*time.Second)
	}
	if v := value(t, p, "gpu_exporter_collector_up", `collector="processes"`); v != "0" {
		t.Errorf(`gpu_exporter_collector_up{collector="processes"} %s with the proc root gone, want 0`, v)
	}
	for _, name := range []string{"gpu_container_memory_used_bytes", "gpu_memory_used_outside_pods_bytes"} {
		if s := series(p, name, g6...); len(s) != 0 {
			t.Errorf("%s served from an unreadable proc root: %v", name, s)
		}
	}
	if n := strings.Count(logs.String(), "process accounting is down: the proc root cannot be read"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "none of the PIDs NVML reports") {
		t.Errorf("an unreadable root is reported as a root without the PIDs:\n%s", logs.String())
	}

	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	p = pn.step(t, 5*time.Second)
	if v := value(t, p, "gpu_exporter_collector_up", `collector="processes"`); v != "1" {
		t.Errorf(`gpu_exporter_collector_up{collector="processes"} %s with the proc root back, want 1`, v)
	}
	if num(t, p, "gpu_container_memory_used_bytes", append(g6, `pod="chat-api-0"`)...) == 0 {
		t.Error("chat-api-0's VRAM did not come back with the proc root")
	}
}

// An MPS-shared GPU: the kubelet hands out <uuid>::<n> replicas on
// nvidia.com/gpu; NVML lists the nvidia-cuda-mps-server (compute list only)
// and each client (compute and MPS lists). Each holder gets its own
// clients' VRAM and activity; the server, run by the device plugin's
// control daemon pod, is neither a holder, a pod using the GPU, nor memory
// outside pods.
func TestMPSSharedGPU(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 2}
sharing: {mps: {gpus: [0], replicas: 4}}
hostProcesses:
  - {gpu: 0, comm: Xorg, memory: {mean: 0.01}}
pods:
  - namespace: inference
    name: llm-0
    containers:
      - name: server
        devices: [{gpu: 0, replica: 0}]
        processes: [{memory: {mean: 0.2}, utilization: {mean: 0.2}}]
  - namespace: inference
    name: llm-1
    containers:
      - name: server
        devices: [{gpu: 0, replica: 1}]
        processes: [{memory: {mean: 0.6}, utilization: {mean: 0.9}}]   # held to its limits: 1/4 of the memory and SMs
  - namespace: inference
    name: llm-2
    containers:
      - name: server
        devices: [{gpu: 0, replica: 2}]
`)
	pn, _ := newProcNode(t, sc)
	p := pn.step(t, 30*time.Second)
	g0 := `gpu="0"`
	total := num(t, p, "gpu_memory_total_bytes", g0, `gpu_instance=""`)
	room := total - 512<<20
	mem0 := num(t, p, "gpu_container_memory_used_bytes", `pod="llm-0"`, g0)
	mem1 := num(t, p, "gpu_container_memory_used_bytes", `pod="llm-1"`, g0)
	mem2 := num(t, p, "gpu_container_memory_used_bytes", `pod="llm-2"`, g0)
	if !within(mem0, 0.2*room, 0.001) || !within(mem1, total/4, 0.001) || mem2 != 0 {
		t.Errorf("VRAM: llm-0 %.4g (want %.4g), llm-1 %.4g (want its pinned limit %.4g), llm-2 %v (want 0)", mem0, 0.2*room, mem1, total/4, mem2)
	}
	if v := num(t, p, "gpu_container_utilization_ratio", `pod="llm-1"`, g0, `source="processes"`); v != 0.25 {
		t.Errorf("llm-1 activity %v, want 0.25 (its active thread percentage)", v)
	}
	outside := num(t, p, "gpu_memory_used_outside_pods_bytes", g0)
	if !within(outside, 0.01*room, 0.001) {
		t.Errorf("outside pods %.4g, want the Xorg client's %.4g and not the MPS server", outside, 0.01*room)
	}
	if s := series(p, "gpu_container_memory_used_bytes", `namespace="nvidia-device-plugin"`); len(s) != 0 {
		t.Errorf("the MPS control daemon pod is shown as using the GPU: %v", s)
	}
	if s := series(p, "gpu_allocation_info", g0); len(s) != 3 {
		t.Errorf("allocation series on the MPS GPU: %v, want one per holder", s)
	}
	used := num(t, p, "gpu_memory_used_bytes", g0, `gpu_instance=""`)
	server := used - (mem0 + mem1 + mem2 + outside + 512<<20)
	if !within(server, 32<<20, 0.01) {
		t.Errorf("used %v less holders, outside pods and driver reserve leaves %v, want the MPS server's 32 MiB", used, server)
	}
	n, err := status.Decode(bytes.NewReader(p.StatusJSON))
	if err != nil {
		t.Fatal(err)
	}
	u := n.GPUs[0].Units[0]
	if !u.Shared || len(u.Holders) != 3 || u.OutsidePodsProcesses != 1 {
		t.Errorf("status of the MPS GPU: shared %v, %d holders, %d processes outside pods; want shared, 3, 1: %+v", u.Shared, len(u.Holders), u.OutsidePodsProcesses, u)
	}
	if u.MPSServerMemoryBytes == nil || !within(*u.MPSServerMemoryBytes, 32<<20, 0.01) {
		t.Errorf("status of the MPS GPU: MPS server memory %v, want 32 MiB", u.MPSServerMemoryBytes)
	}
}

// The compute instances of one GPU instance each report the GPU instance's
// memory: a holder of one of them is credited with its own processes, as on
// a time-sliced GPU, not with its neighbour's use of the GPU instance.
func TestComputeInstanceHolderOwnMemory(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
pods:
  - {namespace: ml, name: ci-0, containers: [{name: c, devices: [{gpu: 0, mig: 0}], processes: [{memory: {mean: 0.6}}]}]}
  - {namespace: ml, name: ci-1, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
  - {namespace: ml, name: alone, containers: [{name: c, devices: [{gpu: 0, mig: 2}]}]}
`)
	pn, _ := newProcNode(t, sc)
	p := pn.step(t, 30*time.Second)
	gi := num(t, p, "gpu_memory_used_bytes", `compute_instance="1"`, `mig_profile="1c.3g.40gb"`)
	if v := num(t, p, "gpu_container_memory_used_bytes", `pod="ci-1"`); v != 0 {
		t.Errorf("ci-1 runs nothing on its compute instance, yet is credited with %v bytes (its GPU instance uses %v)", v, gi)
	}
	if v := num(t, p, "gpu_container_memory_used_bytes", `pod="ci-0"`); v <= 0 || v >= gi {
		t.Errorf("ci-0's own process: %v bytes, want above 0 and below its GPU instance's %v", v, gi)
	}
	if v := num(t, p, "gpu_container_memory_used_bytes", `pod="alone"`); v != num(t, p, "gpu_memory_used_bytes", `mig_profile="1g.10gb"`) {
		t.Errorf("a MIG instance held alone keeps its own figure: %v", v)
	}
}

// Without process accounting a holder of one compute instance has no
// per-container VRAM, rather than its whole GPU instance's.
func TestComputeInstanceHolderWithoutProcessAccounting(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2, workload: {preset: busy}}, {profile: 1g.10gb}]
pods:
  - {namespace: ml, name: ci-0, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: ml, name: alone, containers: [{name: c, devices: [{gpu: 0, mig: 2}]}]}
`)
	pn := newPodNode(t, sc)
	p := pn.step(t, time.Second)
	if s := series(p, "gpu_container_memory_used_bytes", `pod="ci-0"`); len(s) != 0 {
		t.Errorf("a compute instance's holder is credited with its GPU instance's memory: %v", s)
	}
	if s := series(p, "gpu_container_memory_used_bytes", `pod="alone"`); len(s) != 1 {
		t.Errorf("a MIG instance held alone: %v, want its figure", s)
	}
}
