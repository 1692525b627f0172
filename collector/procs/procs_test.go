package procs_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakehost"
)

const (
	idA    = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	idB    = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	podUID = "5f1c2d3e-aaaa-4bbb-8ccc-0123456789ab"
)

func TestParseCgroup(t *testing.T) {
	cases := []struct {
		name, text string
		want       procs.CgroupRef
	}{
		{"v2 systemd containerd burstable", fakehost.PodCgroup(fakehost.SystemdV2, fakehost.Containerd, "burstable", podUID, idA),
			procs.CgroupRef{ContainerID: idA, Runtime: "containerd", PodUID: podUID}},
		{"v2 systemd containerd guaranteed", fakehost.PodCgroup(fakehost.SystemdV2, fakehost.Containerd, "", podUID, idA),
			procs.CgroupRef{ContainerID: idA, Runtime: "containerd", PodUID: podUID}},
		{"v2 systemd cri-o besteffort", fakehost.PodCgroup(fakehost.SystemdV2, fakehost.CRIO, "besteffort", podUID, idA),
			procs.CgroupRef{ContainerID: idA, Runtime: "cri-o", PodUID: podUID}},
		{"v1 systemd docker", fakehost.PodCgroup(fakehost.SystemdV1, fakehost.Docker, "burstable", podUID, idB),
			procs.CgroupRef{ContainerID: idB, Runtime: "docker", PodUID: podUID}},
		{"v2 cgroupfs", fakehost.PodCgroup(fakehost.CgroupfsV2, fakehost.Containerd, "besteffort", podUID, idA),
			procs.CgroupRef{ContainerID: idA, PodUID: podUID}},
		{"v1 cgroupfs guaranteed", fakehost.PodCgroup(fakehost.CgroupfsV1, fakehost.Containerd, "", podUID, idB),
			procs.CgroupRef{ContainerID: idB, PodUID: podUID}},
		{"plain docker", fakehost.DockerCgroup(idA), procs.CgroupRef{ContainerID: idA, Runtime: "docker"}},
		{"plain cgroupfs docker", "0::/docker/" + idB + "\n", procs.CgroupRef{ContainerID: idB}},
		{"host process", fakehost.HostCgroup(), procs.CgroupRef{}},
		{"root", "0::/\n", procs.CgroupRef{}},
		{"empty", "", procs.CgroupRef{}},
		{"cri-o conmon is not the container", "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/crio-conmon-" + idA + ".scope\n",
			procs.CgroupRef{PodUID: podUID}},
		{"sub-cgroup inside the container", "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + idA + ".scope/init.scope\n",
			procs.CgroupRef{ContainerID: idA, Runtime: "containerd", PodUID: podUID}},
		{"short id is not an id", "0::/docker/abc123\n", procs.CgroupRef{}},
		{"upper-case hex is not an id", "0::/docker/" + strings.ToUpper(idA) + "\n", procs.CgroupRef{}},
		{"garbage", "not a cgroup file\n::\n", procs.CgroupRef{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := procs.ParseCgroup(c.text); got != c.want {
				t.Errorf("ParseCgroup(%q) = %+v, want %+v", c.text, got, c.want)
			}
		})
	}
}

func TestParseLogName(t *testing.T) {
	cases := []struct {
		name   string
		id     string
		ident  procs.Identity
		wantOK bool
	}{
		{fakehost.LogName("inference", "chat-api-0", "server", idA), idA, procs.Identity{Namespace: "inference", Pod: "chat-api-0", Container: "server"}, true},
		{fakehost.LogName("kube-system", "nvidia-device-plugin-x7k2p", "nvidia-device-plugin-ctr", idB), idB,
			procs.Identity{Namespace: "kube-system", Pod: "nvidia-device-plugin-x7k2p", Container: "nvidia-device-plugin-ctr"}, true},
		{"chat-api-0_inference_server-" + idA, "", procs.Identity{}, false},  // no .log
		{"chat-api-0_inference_server-abc.log", "", procs.Identity{}, false}, // short ID
		{"chat-api-0-inference-server-" + idA + ".log", "", procs.Identity{}, false},
		{"_inference_server-" + idA + ".log", "", procs.Identity{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, ident, ok := procs.ParseLogName(c.name)
			if ok != c.wantOK || id != c.id || ident != c.ident {
				t.Errorf("ParseLogName(%q) = %q %+v %v, want %q %+v %v", c.name, id, ident, ok, c.id, c.ident, c.wantOK)
			}
		})
	}
}

func TestParseStartTime(t *testing.T) {
	v, err := procs.ParseStartTime("42 (python3 (worker) x) S 1 42 42 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 8 0 987654 1000000 100\n")
	if err != nil || v != 987654 {
		t.Fatalf("got %d, %v; want 987654", v, err)
	}
	for _, bad := range []string{"", "42 python", "42 (x) S 1 2"} {
		if _, err := procs.ParseStartTime(bad); err == nil {
			t.Errorf("ParseStartTime(%q): want an error", bad)
		}
	}
}

// node builds a host with a pod container, a plain Docker container and a host process.
func node(t *testing.T) (*fakehost.Host, *procs.LogDir) {
	t.Helper()
	h, err := fakehost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	must(t, h.StartProcess(100, 5000, "python3", fakehost.PodCgroup(fakehost.SystemdV2, fakehost.Containerd, "burstable", podUID, idA)))
	must(t, h.AddContainerLog("inference", "chat-api-0", "server", idA))
	must(t, h.StartProcess(200, 6000, "ollama", fakehost.DockerCgroup(idB)))
	must(t, h.StartProcess(300, 7000, "Xorg", fakehost.HostCgroup()))
	ld, err := procs.NewLogDir(h.LogDir)
	if err != nil {
		t.Fatal(err)
	}
	return h, ld
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestResolverOwners(t *testing.T) {
	h, ld := node(t)
	r := procs.NewResolver(procs.Config{ProcRoot: h.ProcRoot, Identities: ld, MinRefresh: time.Nanosecond})
	got := r.Resolve(context.Background(), []uint32{100, 200, 300, 999})
	if o := got[100]; !o.Found || o.Identity != (procs.Identity{Namespace: "inference", Pod: "chat-api-0", Container: "server"}) || o.Cgroup.PodUID != podUID {
		t.Errorf("pod process: %+v", o)
	}
	if o := got[200]; !o.Found || o.InPod() || o.Cgroup.ContainerID != idB {
		t.Errorf("docker process: %+v (want a container outside any pod)", o)
	}
	if o := got[300]; !o.Found || o.InPod() || o.Cgroup.ContainerID != "" {
		t.Errorf("host process: %+v", o)
	}
	if o := got[999]; o.Found {
		t.Errorf("missing PID: %+v", o)
	}
}

// A PID seen before costs no file read; a reused PID is told apart by its
// start time and mapped to its new container.
func TestResolverCacheAndReusedPID(t *testing.T) {
	h, ld := node(t)
	r := procs.NewResolver(procs.Config{ProcRoot: h.ProcRoot, Identities: ld, MinRefresh: time.Nanosecond})
	ctx := context.Background()
	pids := []uint32{100, 200, 300}
	r.Resolve(ctx, pids)
	reads := r.FileReads()
	if reads != 6 { // stat and cgroup of three processes
		t.Fatalf("first sample read %d files, want 6", reads)
	}
	lists := ld.Lists()
	for i := 0; i < 5; i++ {
		r.Resolve(ctx, pids)
	}
	if r.FileReads() != reads {
		t.Fatalf("PIDs seen before cost %d more file reads, want 0", r.FileReads()-reads)
	}
	// The plain Docker container is never in the log directory: it may
	// re-list only as often as MinRefresh allows, never per PID.
	if ld.Lists()-lists > 5 {
		t.Errorf("log directory listed %d times in 5 samples", ld.Lists()-lists)
	}

	// PID 100 exits; a new container of another pod gets PID 100.
	must(t, h.StartProcess(100, 9000, "python3", fakehost.PodCgroup(fakehost.CgroupfsV1, fakehost.CRIO, "besteffort", "11111111-2222-4333-8444-555555555555", idB[:60]+"0000")))
	must(t, h.AddContainerLog("batch", "trainer-7", "main", idB[:60]+"0000"))
	got := r.Resolve(ctx, pids)
	want := procs.Identity{Namespace: "batch", Pod: "trainer-7", Container: "main"}
	if got[100].Identity != want {
		t.Fatalf("reused PID 100 resolves to %+v, want %+v", got[100].Identity, want)
	}
	if d := r.FileReads() - reads; d != 2 {
		t.Errorf("reused PID cost %d reads, want 2 (stat, cgroup)", d)
	}
}

// The CRI source: one ContainerStatus per new container, labels to identity.
type fakeCRI struct {
	criv1.UnimplementedRuntimeServiceServer
	labels map[string]map[string]string
}

func (f *fakeCRI) ContainerStatus(_ context.Context, req *criv1.ContainerStatusRequest) (*criv1.ContainerStatusResponse, error) {
	l, ok := f.labels[req.ContainerId]
	if !ok {
		return nil, status.Error(codes.NotFound, "no such container")
	}
	return &criv1.ContainerStatusResponse{Status: &criv1.ContainerStatus{Id: req.ContainerId, Labels: l}}, nil
}

func TestCRIIdentities(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	criv1.RegisterRuntimeServiceServer(srv, &fakeCRI{labels: map[string]map[string]string{
		idA: {"io.kubernetes.pod.name": "chat-api-0", "io.kubernetes.pod.namespace": "inference", "io.kubernetes.container.name": "server"},
	}})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	c, err := procs.NewCRI(sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, _ := node(t)
	r := procs.NewResolver(procs.Config{ProcRoot: h.ProcRoot, Identities: c, MinRefresh: time.Hour})
	for i := 0; i < 3; i++ {
		got := r.Resolve(context.Background(), []uint32{100, 200})
		if got[100].Identity != (procs.Identity{Namespace: "inference", Pod: "chat-api-0", Container: "server"}) {
			t.Fatalf("CRI identity: %+v", got[100])
		}
		if got[200].InPod() {
			t.Fatalf("a container the CRI does not know is in no pod: %+v", got[200])
		}
	}
	if n := c.Calls(); n != 2 {
		t.Errorf("%d ContainerStatus calls for two containers over three samples, want 2", n)
	}
}

func TestCRIErrors(t *testing.T) {
	if _, err := procs.NewCRI("", time.Second); err == nil || !strings.Contains(err.Error(), "containerd.sock") {
		t.Errorf("empty socket: %v", err)
	}
	if err := procs.CheckProcRoot(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--procs.proc-root") {
		t.Errorf("CheckProcRoot on an empty dir: %v", err)
	}
	if _, err := procs.NewLogDir(filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("missing log dir: %v", err)
	}
}

func TestAttribute(t *testing.T) {
	a := procs.Identity{Namespace: "inference", Pod: "chat-api-0", Container: "server"}
	b := procs.Identity{Namespace: "inference", Pod: "chat-api-1", Container: "server"}
	owners := map[uint32]procs.Owner{
		10: {Found: true, Identity: a, Cgroup: procs.CgroupRef{PodUID: "uid-a"}}, 11: {Found: true, Identity: a, Cgroup: procs.CgroupRef{PodUID: "uid-a"}},
		20: {Found: true, Identity: b},
		30: {Found: true}, // host process
	}
	d := &sample.DeviceProcesses{Known: true, SMKnown: true, Processes: []sample.GPUProcess{
		// Not whole MiB: each process's whole MiB are summed (3072), as
		// DCGM counts, not the sum's (3073).
		{PID: 10, MemoryBytes: 1<<30 + 512<<10, MemoryKnown: true, SM: 0.25},
		{PID: 11, MemoryBytes: 2<<30 + 768<<10, MemoryKnown: true, SM: 0.5},
		{PID: 20, MemoryBytes: 4 << 30, MemoryKnown: true, SM: 0.1},
		{PID: 30, MemoryBytes: 512 << 20, MemoryKnown: true},
		{PID: 40, MemoryBytes: 256 << 20, MemoryKnown: true}, // exited before it was looked up
	}}
	u := procs.Attribute(d, owners)
	if got := *u.ByContainer[a]; got != (procs.Use{Processes: 2, MemoryBytes: 3<<30 + 1280<<10, MemoryMiB: 3072, MemoryKnown: true, SM: 0.75, SMKnown: true, PodUID: "uid-a"}) {
		t.Errorf("container a: %+v", got)
	}
	if got := *u.ByContainer[b]; got.MemoryBytes != 4<<30 || got.SM != 0.1 {
		t.Errorf("container b: %+v", got)
	}
	if got := u.OutsidePods; got.Processes != 2 || got.MemoryBytes != 768<<20 {
		t.Errorf("outside pods: %+v", got)
	}
	// Memory NVML cannot report makes the sum unknown, not smaller.
	d.Processes[1].MemoryKnown = false
	if u := procs.Attribute(d, owners); u.ByContainer[a].MemoryKnown {
		t.Errorf("a sum with an unknown part is known: %+v", u.ByContainer[a])
	}
	// Time slices add up to at most the whole device.
	d.Processes[0].SM, d.Processes[1].SM = 0.7, 0.6
	if u := procs.Attribute(d, owners); u.ByContainer[a].SM != 1 {
		t.Errorf("SM over 1: %v", u.ByContainer[a].SM)
	}
}

func TestParseComm(t *testing.T) {
	for _, c := range []struct{ stat, want string }{
		{"4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 3 0 8640000", "nvidia-cuda-mps"},
		{"77 (a (b) c) R 1", "a (b) c"},
		{"77 no name", ""},
	} {
		if got := procs.ParseComm(c.stat); got != c.want {
			t.Errorf("ParseComm(%q) = %q, want %q", c.stat, got, c.want)
		}
	}
}

// An MPS server, in a pod that holds no GPU (the device plugin's control
// daemon) or on the host, is counted apart: in no container, not outside pods.
func TestAttributeMPSServer(t *testing.T) {
	daemon := procs.Identity{Namespace: "nvidia-device-plugin", Pod: "mps-control-daemon-x", Container: "mps-control-daemon"}
	client := procs.Identity{Namespace: "inference", Pod: "llm-0", Container: "server"}
	owners := map[uint32]procs.Owner{
		10: {Found: true, Identity: daemon, MPSServer: true},
		11: {Found: true, MPSServer: true}, // a server started on the host
		20: {Found: true, Identity: client},
	}
	d := &sample.DeviceProcesses{Known: true, Processes: []sample.GPUProcess{
		{PID: 10, MemoryBytes: 32 << 20, MemoryKnown: true},
		{PID: 11, MemoryBytes: 30 << 20, MemoryKnown: true},
		{PID: 20, MemoryBytes: 1 << 30, MemoryKnown: true},
	}}
	u := procs.Attribute(d, owners)
	if _, ok := u.ByContainer[daemon]; ok || len(u.ByContainer) != 1 {
		t.Errorf("containers: %v, want the client only", u.ByContainer)
	}
	if u.OutsidePods.Processes != 0 || u.MPSServer.Processes != 2 || u.MPSServer.MemoryBytes != 62<<20 {
		t.Errorf("outside pods %+v, MPS servers %+v; want none outside, both servers apart", u.OutsidePods, u.MPSServer)
	}
}
