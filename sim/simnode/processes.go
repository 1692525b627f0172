package simnode

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakehost"
)

// ProcessSpec is a process a pod's container runs on one of its devices.
type ProcessSpec struct {
	// Device is the index, in the container's devices list, of the device
	// the process runs on (default 0).
	Device int `yaml:"device"`
	// PID pins the host PID (default: derived from the seed). Two processes
	// may have one PID only one after the other: a reused PID.
	PID uint32 `yaml:"pid"`
	// Start and Stop bound the process's life, from the node's start
	// (default: its pod's).
	Start Duration `yaml:"start"`
	Stop  Duration `yaml:"stop"`
	// Memory is the fraction of the device's memory the process uses.
	Memory *Curve `yaml:"memory"`
	// Utilization is the process's share of the device's SM time.
	Utilization *Curve `yaml:"utilization"`
	// MPS: the process is an MPS client. Every process on a GPU listed in
	// sharing.mps is one; setting it elsewhere is an error (a client needs
	// the device plugin's MPS control daemon).
	MPS  bool   `yaml:"mps"`
	Comm string `yaml:"comm"`
}

// HostProcessSpec is a process outside any pod: a host service, or a
// container another runtime started.
type HostProcessSpec struct {
	ProcessSpec `yaml:",inline"`
	GPU         int  `yaml:"gpu"`
	MIG         *int `yaml:"mig"`
	// Docker: a plain Docker container rather than a host service.
	Docker bool `yaml:"docker"`
}

// simProcess is a resolved process of the scenario.
type simProcess struct {
	pid         uint32
	gpu, mig    int // mig -1 on a whole GPU
	start, stop time.Duration
	mem, util   *Curve
	mps         bool
	comm, key   string
	startTicks  uint64
	// Owner: a pod container, or none (a host process or a Docker container).
	namespace, pod, container string
	containerID, podUID       string
	docker                    bool
	// mpsServer: the GPU's nvidia-cuda-mps-server, run by the device
	// plugin's MPS control daemon pod (which holds no GPU).
	mpsServer bool
}

// mpsServerMemory is what an MPS server holds on its GPU for the shared
// context, apart from its clients' allocations.
const mpsServerMemory = 32 << 20

func (p *simProcess) liveAt(t time.Duration) bool {
	return t >= p.start && (p.stop == 0 || t < p.stop)
}

// clockTicks: the simulated host booted a day before the node started; USER_HZ is 100.
func clockTicks(start time.Duration) uint64 { return uint64((86400 + start.Seconds()) * 100) }

func hexID(parts ...any) string {
	b := sha256.Sum256([]byte(fmt.Sprint(parts...)))
	return hex.EncodeToString(b[:])
}

// containerID is a pod container's runtime ID.
func containerID(seed int64, ns, pod, container string) string {
	return hexID("container", seed, ns, pod, container)
}

func podUID(seed int64, ns, pod string) string {
	b := sha256.Sum256([]byte(fmt.Sprintf("pod/%d/%s/%s", seed, ns, pod)))
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// resolveProcesses lays out the scenario's processes; the scenario was validated.
func (n *Node) resolveProcesses() {
	sc := n.Scenario
	used := map[uint32]bool{}
	for _, p := range sc.Pods {
		for _, c := range p.Containers {
			for _, ps := range c.Processes {
				if ps.PID != 0 {
					used[ps.PID] = true
				}
			}
		}
	}
	for _, hp := range sc.HostProcesses {
		if hp.PID != 0 {
			used[hp.PID] = true
		}
	}
	pick := func(key string) uint32 {
		h := sha256.Sum256([]byte(fmt.Sprintf("pid/%d/%s", sc.Seed, key)))
		pid := 1000 + (uint32(h[0])<<16|uint32(h[1])<<8|uint32(h[2]))%400000
		for used[pid] {
			pid++
		}
		used[pid] = true
		return pid
	}
	life := func(ps ProcessSpec, start, stop Duration) (time.Duration, time.Duration) {
		s, e := time.Duration(start), time.Duration(stop)
		if ps.Start > start {
			s = time.Duration(ps.Start)
		}
		if ps.Stop != 0 && (e == 0 || time.Duration(ps.Stop) < e) {
			e = time.Duration(ps.Stop)
		}
		return s, e
	}
	for _, p := range sc.Pods {
		for _, c := range p.Containers {
			cid := containerID(sc.Seed, p.Namespace, p.Name, c.Name)
			for i, ps := range c.Processes {
				d := c.Devices[ps.Device]
				sp := &simProcess{gpu: d.GPU, mig: -1, mem: ps.Memory, util: ps.Utilization, mps: ps.MPS || sc.mpsGPU(d.GPU), comm: ps.Comm,
					namespace: p.Namespace, pod: p.Name, container: c.Name, containerID: cid, podUID: podUID(sc.Seed, p.Namespace, p.Name)}
				if d.MIG != nil {
					sp.mig = *d.MIG
				}
				sp.key = fmt.Sprintf("proc/%s/%s/%s/%d", p.Namespace, p.Name, c.Name, i)
				sp.start, sp.stop = life(ps, p.Start, p.Stop)
				sp.pid = ps.PID
				if sp.pid == 0 {
					sp.pid = pick(sp.key)
				}
				n.procs = append(n.procs, sp)
			}
		}
	}
	for i, hp := range sc.HostProcesses {
		sp := &simProcess{gpu: hp.GPU, mig: -1, mem: hp.Memory, util: hp.Utilization, mps: hp.MPS || sc.mpsGPU(hp.GPU), comm: hp.Comm, docker: hp.Docker}
		if hp.MIG != nil {
			sp.mig = *hp.MIG
		}
		sp.key = fmt.Sprintf("host/%d", i)
		if hp.Docker {
			sp.containerID = hexID("docker", sc.Seed, i)
		}
		sp.start, sp.stop = life(hp.ProcessSpec, 0, 0)
		sp.pid = hp.PID
		if sp.pid == 0 {
			sp.pid = pick(sp.key)
		}
		n.procs = append(n.procs, sp)
	}
	n.addMPSServers(pick)
	var bounds []time.Duration
	for _, p := range sc.Pods {
		bounds = append(bounds, time.Duration(p.Start), time.Duration(p.Stop))
	}
	for _, sp := range n.procs {
		bounds = append(bounds, sp.start, sp.stop)
	}
	sort.Slice(bounds, func(i, j int) bool { return bounds[i] < bounds[j] })
	n.host.bounds = bounds
	for _, sp := range n.procs {
		if sp.comm == "" {
			sp.comm = "python3"
		}
		sp.startTicks = clockTicks(sp.start)
		n.devices[sp.gpu].hasProcs = true
	}
}

// addMPSServers starts an nvidia-cuda-mps-server on each MPS GPU with the
// first client: the control daemon launches it on a client's request and
// keeps it for later clients. It runs in the control daemon's container.
func (n *Node) addMPSServers(pick func(string) uint32) {
	sc := n.Scenario
	if sc.Sharing.MPS == nil {
		return
	}
	for _, gpu := range sc.Sharing.MPS.GPUs {
		first := time.Duration(-1)
		for _, p := range n.procs {
			if p.gpu == gpu && p.mps && (first < 0 || p.start < first) {
				first = p.start
			}
		}
		if first < 0 {
			continue // no client ever: no server
		}
		sp := &simProcess{gpu: gpu, mig: -1, start: first, comm: mpsServerComm, mpsServer: true,
			namespace: mpsDaemonNamespace, pod: mpsDaemonPod, container: mpsDaemonContainer,
			containerID: containerID(sc.Seed, mpsDaemonNamespace, mpsDaemonPod, mpsDaemonContainer),
			podUID:      podUID(sc.Seed, mpsDaemonNamespace, mpsDaemonPod)}
		sp.key = fmt.Sprintf("mps-server/%d", gpu)
		sp.pid = pick(sp.key)
		n.procs = append(n.procs, sp)
	}
}

// processMemory is a process's framebuffer use on its device at t. An MPS
// client stops at its pinned memory limit, 1/replicas of the GPU's memory
// (an allocation past it fails).
func (n *Node) processMemory(p *simProcess, t time.Duration) uint64 {
	if p.mpsServer {
		return mpsServerMemory
	}
	d := n.devices[p.gpu]
	total := d.cfg.MemoryMB << 20
	if p.mig >= 0 {
		total = d.migs[p.mig].geo.MemoryMiB << 20
	}
	f := p.mem.at(n.Scenario, p.key+"/mem", t)
	used := uint64(f * float64(total-(512<<20)))
	if r := n.Scenario.replicas(p.gpu); p.mps && n.Scenario.mpsGPU(p.gpu) {
		used = min(used, total/uint64(r))
	}
	return used
}

// processUtil is a process's share of its device's SM time at t. An MPS
// client runs on at most its active thread percentage of the SMs,
// 1/replicas; the server issues no kernels of its own.
func (n *Node) processUtil(p *simProcess, t time.Duration) float64 {
	if p.mpsServer {
		return 0
	}
	u := p.util.at(n.Scenario, p.key+"/util", t)
	if p.mps && n.Scenario.mpsGPU(p.gpu) {
		u = math.Min(u, 1/float64(n.Scenario.replicas(p.gpu)))
	}
	return u
}

// processesOn lists the processes live on a GPU (mig -1) or MIG instance.
func (n *Node) processesOn(gpu, mig int, t time.Duration) []*simProcess {
	var out []*simProcess
	for _, p := range n.procs {
		if p.gpu == gpu && p.mig == mig && p.liveAt(t) {
			out = append(out, p)
		}
	}
	return out
}

// procMemUsed and procUtil are a process-driven device's memory and busy
// ratio: what its processes use, plus the driver's reserve.
func (d *Device) procMemUsed(t time.Duration) uint64 {
	used := uint64(512 << 20)
	for _, p := range d.node.processesOn(d.index, -1, t) {
		used += d.node.processMemory(p, t)
	}
	return min(used, d.cfg.MemoryMB<<20)
}

func (d *Device) procUtil(t time.Duration) float64 {
	var u float64
	for _, p := range d.node.processesOn(d.index, -1, t) {
		u += d.node.processUtil(p, t)
	}
	return math.Min(1, u)
}

// host is the node's generated host tree (/proc and /var/log/containers).
type host struct {
	mu      sync.Mutex
	dir     string
	owned   bool // made by the node, removed by Close
	h       *fakehost.Host
	running map[uint32]*simProcess
	logs    map[string]bool
	err     error
	// bounds are the times at which a process or pod starts or stops; the
	// tree is rewritten only when t crosses one.
	bounds  []time.Duration
	lastSeg int
}

// WithHostDir puts the generated host /proc and container log directory
// under dir (default: a temporary directory removed by Close).
func WithHostDir(dir string) Option { return func(n *Node) { n.host.dir = dir } }

// HostProc is the simulated host's /proc; HostLogDir its
// /var/log/containers. They follow the scenario's processes and pods.
func (n *Node) HostProc() (string, error) {
	if err := n.syncHost(n.elapsed()); err != nil {
		return "", err
	}
	return n.host.h.ProcRoot, nil
}

// HostLogDir is the simulated /var/log/containers.
func (n *Node) HostLogDir() (string, error) {
	if err := n.syncHost(n.elapsed()); err != nil {
		return "", err
	}
	return n.host.h.LogDir, nil
}

func (n *Node) closeHost() {
	n.host.mu.Lock()
	defer n.host.mu.Unlock()
	if n.host.owned && n.host.dir != "" {
		os.RemoveAll(n.host.dir)
	}
}

// syncHost makes the host tree show what runs at t: a /proc entry per live
// process (a reused PID gets a new entry), a log link per container of a
// pod that exists.
func (n *Node) syncHost(t time.Duration) error {
	hs := &n.host
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.err != nil {
		return hs.err
	}
	seg := sort.Search(len(hs.bounds), func(i int) bool { return hs.bounds[i] > t })
	if hs.h != nil && seg == hs.lastSeg {
		return nil // nothing started or stopped since the last call
	}
	if hs.h == nil {
		if hs.dir == "" {
			d, err := os.MkdirTemp("", "gpe-simhost-")
			if err != nil {
				hs.err = fmt.Errorf("simulated host tree: %w", err)
				return hs.err
			}
			hs.dir, hs.owned = d, true
		}
		h, err := fakehost.New(hs.dir)
		if err != nil {
			hs.err = fmt.Errorf("simulated host tree: %w", err)
			return hs.err
		}
		hs.h, hs.running, hs.logs = h, map[uint32]*simProcess{}, map[string]bool{}
	}
	hs.lastSeg = seg
	want := map[uint32]*simProcess{}
	for _, p := range n.procs {
		if p.liveAt(t) {
			want[p.pid] = p
		}
	}
	pids := make([]uint32, 0, len(want))
	for pid := range want {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	for _, pid := range pids {
		p := want[pid]
		if hs.running[pid] == p {
			continue
		}
		if err := hs.h.StartProcess(pid, p.startTicks, p.comm, n.cgroupOf(p)); err != nil {
			return err
		}
		hs.running[pid] = p
	}
	for pid := range hs.running {
		if want[pid] == nil {
			if err := hs.h.StopProcess(pid); err != nil {
				return err
			}
			delete(hs.running, pid)
		}
	}
	logs := map[string][4]string{}
	for _, p := range n.Scenario.Pods {
		if t < time.Duration(p.Start) || (p.Stop != 0 && t >= time.Duration(p.Stop)) {
			continue
		}
		for _, c := range p.Containers {
			cid := containerID(n.Scenario.Seed, p.Namespace, p.Name, c.Name)
			logs[fakehost.LogName(p.Namespace, p.Name, c.Name, cid)] = [4]string{p.Namespace, p.Name, c.Name, cid}
		}
	}
	for _, p := range want {
		if p.mpsServer { // the MPS control daemon pod runs while its servers do
			logs[fakehost.LogName(p.namespace, p.pod, p.container, p.containerID)] = [4]string{p.namespace, p.pod, p.container, p.containerID}
		}
	}
	for name, l := range logs {
		if !hs.logs[name] {
			if err := hs.h.AddContainerLog(l[0], l[1], l[2], l[3]); err != nil {
				return err
			}
			hs.logs[name] = true
		}
	}
	for name := range hs.logs {
		if _, ok := logs[name]; !ok {
			os.Remove(hs.h.LogDir + "/" + name)
			delete(hs.logs, name)
		}
	}
	return nil
}

// cgroupDrivers and runtimes name the scenario's node.cgroupDriver and node.runtime.
var cgroupDrivers = map[string]fakehost.Driver{
	"systemd-v2": fakehost.SystemdV2, "cgroupfs-v2": fakehost.CgroupfsV2,
	"systemd-v1": fakehost.SystemdV1, "cgroupfs-v1": fakehost.CgroupfsV1,
}

var runtimes = map[string]fakehost.Runtime{
	"containerd": fakehost.Containerd, "cri-o": fakehost.CRIO, "docker": fakehost.Docker,
}

func (n *Node) cgroupOf(p *simProcess) string {
	switch {
	case p.pod != "":
		return fakehost.PodCgroup(cgroupDrivers[n.Scenario.Node.CgroupDriver], runtimes[n.Scenario.Node.Runtime], "burstable", p.podUID, p.containerID)
	case p.docker:
		return fakehost.DockerCgroup(p.containerID)
	default:
		return fakehost.HostCgroup()
	}
}

// processInfos are NVML's process list entries for processes.
func (n *Node) processInfos(ps []*simProcess, t time.Duration, gi, ci uint32) []nvml.ProcessInfo {
	out := make([]nvml.ProcessInfo, 0, len(ps))
	for _, p := range ps {
		out = append(out, nvml.ProcessInfo{Pid: p.pid, UsedGpuMemory: n.processMemory(p, t), GpuInstanceId: gi, ComputeInstanceId: ci})
	}
	return out
}

// listFor lists a device's processes of one kind, keeping the host tree in step.
func (n *Node) listFor(gpu, mig int, mps bool, gi, ci uint32) ([]nvml.ProcessInfo, nvml.Return) {
	t := n.elapsed()
	if err := n.syncHost(t); err != nil {
		return nil, nvml.ERROR_UNKNOWN
	}
	var ps []*simProcess
	for _, p := range n.processesOn(gpu, mig, t) {
		// The compute list holds every process with a CUDA context: the
		// MPS server and, since Volta, each MPS client (nvidia-smi's
		// "M+C"); the MPS list only the clients, never the server.
		if !mps || (p.mps && !p.mpsServer) {
			ps = append(ps, p)
		}
	}
	return n.processInfos(ps, t, gi, ci), nvml.SUCCESS
}

// noInstance is what NVML puts in a process's GPU and compute instance IDs
// on a GPU without MIG: 0xFFFFFFFF.
const noInstance = math.MaxUint32

// GetComputeRunningProcesses implements the sampler's Device: every
// process with a compute context, MPS server and clients included. On a
// MIG GPU's parent handle, the processes of every instance.
func (d *Device) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.list(false)
}

// GetMPSComputeRunningProcesses implements the sampler's Device: MPS clients.
func (d *Device) GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.list(true)
}

func (d *Device) list(mps bool) ([]nvml.ProcessInfo, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if len(d.migs) == 0 {
		return d.node.listFor(d.index, -1, mps, noInstance, noInstance)
	}
	var all []nvml.ProcessInfo
	for _, m := range d.migs {
		l, ret := d.node.listFor(d.index, m.slot, mps, uint32(m.gi), uint32(m.ci))
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		all = append(all, l...)
	}
	return all, nvml.SUCCESS
}

// GetGraphicsRunningProcesses implements the sampler's Device: a compute
// node runs no graphics.
func (d *Device) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nil, ret
	}
	return []nvml.ProcessInfo{}, nvml.SUCCESS
}

// GetProcessUtilization implements the sampler's Device: one sample per
// process that ran kernels since lastSeen (microseconds), NOT_FOUND when
// none did; not supported on MIG GPUs (nvml.h).
func (d *Device) GetProcessUtilization(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if len(d.migs) > 0 {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	now := d.node.now()
	ts := uint64(now.UnixMicro())
	if ts <= lastSeen {
		return nil, nvml.ERROR_NOT_FOUND
	}
	t := d.node.elapsed()
	var out []nvml.ProcessUtilizationSample
	for _, p := range d.node.processesOn(d.index, -1, t) {
		u := d.node.processUtil(p, t)
		if sm := uint32(math.Round(u * 100)); sm > 0 {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.pid, TimeStamp: ts, SmUtil: sm, MemUtil: uint32(math.Round(u * 55))})
		}
	}
	if len(out) == 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return out, nvml.SUCCESS
}

// GetComputeRunningProcesses implements the sampler's Device for a MIG instance.
func (m *MIGDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	m.count()
	return m.parent.node.listFor(m.parent.index, m.slot, false, uint32(m.gi), uint32(m.ci))
}

// GetMPSComputeRunningProcesses implements the sampler's Device for a MIG instance.
func (m *MIGDevice) GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	m.count()
	return m.parent.node.listFor(m.parent.index, m.slot, true, uint32(m.gi), uint32(m.ci))
}

// GetGraphicsRunningProcesses implements the sampler's Device: no graphics on MIG.
func (m *MIGDevice) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	m.count()
	return nil, nvml.ERROR_NOT_SUPPORTED
}

// GetProcessUtilization implements the sampler's Device: not on MIG (nvml.h).
func (m *MIGDevice) GetProcessUtilization(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	m.count()
	return nil, nvml.ERROR_NOT_SUPPORTED
}

// validateProcesses checks the pods' and the host's processes: devices
// that exist, curves in range, and a PID given to two processes only one
// after the other.
func (s *Scenario) validateProcesses() error {
	type life struct {
		start, stop time.Duration
		path        []any
	}
	byPID := map[uint32][]life{}
	check := func(ps ProcessSpec, p []any, podStart, podStop Duration) error {
		if ps.Stop != 0 && ps.Stop <= ps.Start {
			return s.errorAt(append(p, "stop"), "stop (%s) must come after start (%s)", time.Duration(ps.Stop), time.Duration(ps.Start))
		}
		if err := s.validateCurve(ps.Memory, append(p, "memory")); err != nil {
			return err
		}
		if err := s.validateCurve(ps.Utilization, append(p, "utilization")); err != nil {
			return err
		}
		if ps.PID == 1 {
			return s.errorAt(append(p, "pid"), "PID 1 is the host's init; pick another")
		}
		if ps.PID != 0 {
			st, sp := time.Duration(podStart), time.Duration(podStop)
			if time.Duration(ps.Start) > st {
				st = time.Duration(ps.Start)
			}
			if ps.Stop != 0 && (sp == 0 || time.Duration(ps.Stop) < sp) {
				sp = time.Duration(ps.Stop)
			}
			for _, o := range byPID[ps.PID] {
				if (sp == 0 || o.start < sp) && (o.stop == 0 || st < o.stop) {
					return s.errorAt(append(p, "pid"), "PID %d is in use by %s at the same time; a PID can be reused only after the process that had it stopped", ps.PID, formatPath(o.path))
				}
			}
			byPID[ps.PID] = append(byPID[ps.PID], life{st, sp, p})
		}
		return nil
	}
	for i, pod := range s.Pods {
		for j, c := range pod.Containers {
			for k, ps := range c.Processes {
				p := []any{"pods", i, "containers", j, "processes", k}
				if ps.Device < 0 || ps.Device >= len(c.Devices) {
					return s.errorAt(append(p, "device"), "device %d: the container holds %d devices (device is an index into its devices list)", ps.Device, len(c.Devices))
				}
				if ps.MPS && !s.mpsGPU(c.Devices[ps.Device].GPU) {
					return s.errorAt(append(p, "mps"), "GPU %d is not shared through MPS: list it in sharing.mps.gpus (an MPS client needs the device plugin's MPS control daemon)", c.Devices[ps.Device].GPU)
				}
				if err := check(ps, p, pod.Start, pod.Stop); err != nil {
					return err
				}
			}
		}
	}
	for i, hp := range s.HostProcesses {
		p := []any{"hostProcesses", i}
		if hp.GPU < 0 || hp.GPU >= s.Node.Count {
			return s.errorAt(append(p, "gpu"), "GPU index %d is outside 0..%d", hp.GPU, s.Node.Count-1)
		}
		if n := s.migCount(hp.GPU); n > 0 && hp.MIG == nil {
			return s.errorAt(append(p, "mig"), "GPU %d is in MIG mode: name the instance (mig: 0..%d)", hp.GPU, n-1)
		}
		if hp.MIG != nil && (*hp.MIG < 0 || *hp.MIG >= s.migCount(hp.GPU)) {
			return s.errorAt(append(p, "mig"), "GPU %d has no MIG instance %d (it has %d)", hp.GPU, *hp.MIG, s.migCount(hp.GPU))
		}
		if hp.MPS && !s.mpsGPU(hp.GPU) {
			return s.errorAt(append(p, "mps"), "GPU %d is not shared through MPS: list it in sharing.mps.gpus (an MPS client needs the device plugin's MPS control daemon)", hp.GPU)
		}
		if hp.Device != 0 {
			return s.errorAt(append(p, "device"), "a host process names its GPU with gpu (and mig), not device")
		}
		if err := check(hp.ProcessSpec, p, 0, 0); err != nil {
			return err
		}
	}
	return nil
}
