// Package simnode is a simulated GPU node for demos, tests and benchmarks, in
// the style of httptest: go-nvml's mock server supplies the GPU models, MIG
// profiles and placements, a Scenario drives telemetry that moves over time.
package simnode

import (
	"crypto/sha256"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// models are the GPU models a scenario can name: go-nvml's mock catalogue
// supplies the board (name, architecture, PCI device ID) or one of its
// architecture stands in for a board it lacks (derived); memory, MIG
// geometry and a derived board's name and PCI device ID come from the MIG
// geometry table alone (modelGeometry).
var models = map[string]gpus.Config{
	"A100-SXM4-40GB":  catalogue(gpus.A100_SXM4_40GB),
	"A100-SXM4-80GB":  catalogue(gpus.A100_SXM4_80GB),
	"A100-PCIE-40GB":  catalogue(gpus.A100_PCIE_40GB),
	"A100-PCIE-80GB":  catalogue(gpus.A100_PCIE_80GB),
	"A30-PCIE-24GB":   catalogue(gpus.A30_PCIE_24GB),
	"H100-SXM5-80GB":  catalogue(gpus.H100_SXM5_80GB),
	"H100-PCIE-80GB":  derived(gpus.H100_SXM5_80GB, "H100-PCIE-80GB"),
	"H100-NVL-94GB":   derived(gpus.H100_SXM5_80GB, "H100-NVL-94GB"),
	"H100-SXM5-94GB":  derived(gpus.H100_SXM5_80GB, "H100-SXM5-94GB"),
	"GH200-96GB":      derived(gpus.H100_SXM5_80GB, "GH200-96GB"),
	"GH200-144GB":     derived(gpus.H200_SXM5_141GB, "GH200-144GB"),
	"H200-SXM5-141GB": catalogue(gpus.H200_SXM5_141GB),
	"H200-NVL-141GB":  derived(gpus.H200_SXM5_141GB, "H200-NVL-141GB"),
	"B200-SXM5-180GB": catalogue(gpus.B200_SXM5_180GB),
	"H20-96GB":        derived(gpus.H100_SXM5_80GB, "H20-96GB"),
	"GB200-186GB":     derived(gpus.B200_SXM5_180GB, "GB200-186GB"),
	// Blackwell Ultra: compute capability 10.3.
	"B300-SXM6-288GB": capability(derived(gpus.B200_SXM5_180GB, "B300-SXM6-288GB"), 10, 3),
	"GB300-288GB":     capability(derived(gpus.B200_SXM5_180GB, "GB300-288GB"), 10, 3),
	// Blackwell workstation-class boards (GB202, GB203; compute capability
	// 12.0) with MIG: graphics (+gfx) and media-engine variants.
	"RTX-PRO-6000-BSE-96GB": capability(derived(gpus.B200_SXM5_180GB, "RTX-PRO-6000-BSE-96GB"), 12, 0),
	"RTX-PRO-5000-48GB":     capability(derived(gpus.B200_SXM5_180GB, "RTX-PRO-5000-48GB"), 12, 0),
	"RTX-PRO-4500-32GB":     capability(derived(gpus.B200_SXM5_180GB, "RTX-PRO-4500-32GB"), 12, 0),
	// An inference board of the Ada generation: GDDR6 (no HBM temperature
	// field), PCIe only (no NVLink), no MIG.
	"L4-24GB": {Name: "NVIDIA L4", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
		MemoryMB: 23034, CudaMajor: 8, CudaMinor: 9, PciDeviceId: 0x27B810DE},
}

// catalogue is a board of go-nvml's mock catalogue with the framebuffer and
// PCI device ID the geometry table records for it (what NVML reports on the
// board, where the catalogue has round figures and, for H200 and B200,
// other device IDs).
func catalogue(c gpus.Config) gpus.Config {
	geo, ok := miggeometry.ByNVMLName(c.Name)
	if !ok {
		panic("simnode: " + c.Name + " is not in the MIG geometry table")
	}
	c.MemoryMB = geo.MemoryMiB
	c.PciDeviceId = geo.PCIDeviceID
	return c
}

// derived is a board go-nvml's catalogue lacks, built from one of the same
// architecture: name, framebuffer and PCI device ID are the geometry table's.
func derived(base gpus.Config, model string) gpus.Config {
	geo, ok := miggeometry.ByModel(model)
	if !ok {
		panic("simnode: model " + model + " is not in the MIG geometry table")
	}
	base.Name = geo.NVMLNames[0]
	base.MemoryMB = geo.MemoryMiB
	base.PciDeviceId = geo.PCIDeviceID
	return base
}

// capability sets a board's CUDA compute capability.
func capability(c gpus.Config, major, minor int) gpus.Config {
	c.CudaMajor, c.CudaMinor = major, minor
	return c
}

// modelGeometry is the MIG geometry of a board; nil for a board without MIG.
func modelGeometry(cfg gpus.Config) *miggeometry.Model {
	geo, _ := miggeometry.ByNVMLName(cfg.Name)
	return geo
}

// ModelNames lists the GPU models a scenario can name.
func ModelNames() []string {
	var n []string
	for k := range models {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// boardSpecs are the telemetry ranges of a model: idle and max power, TDP.
type boardSpec struct {
	idleW, maxW        float64
	smMHz, memMHz      uint32
	pcieGen, pcieWidth int
}

// gddrPCIe reports a board with GDDR memory on PCIe only: no NVLink and no
// memory temperature sensor (Ada's L4; Blackwell's GB20x workstation-class
// boards such as the RTX PRO 6000, compute capability 12.x).
func gddrPCIe(cfg gpus.Config) bool {
	return cfg.Architecture == nvml.DEVICE_ARCH_ADA || (cfg.Architecture == nvml.DEVICE_ARCH_BLACKWELL && cfg.CudaMajor >= 12)
}

func boardFor(cfg gpus.Config) boardSpec {
	if cfg.Architecture == nvml.DEVICE_ARCH_BLACKWELL && gddrPCIe(cfg) {
		return boardSpec{idleW: 30, maxW: 600, smMHz: 2430, memMHz: 14001, pcieGen: 5, pcieWidth: 16}
	}
	switch cfg.Architecture {
	case nvml.DEVICE_ARCH_AMPERE:
		return boardSpec{idleW: 55, maxW: 400, smMHz: 1410, memMHz: 1593, pcieGen: 4, pcieWidth: 16}
	case nvml.DEVICE_ARCH_ADA:
		return boardSpec{idleW: 16, maxW: 72, smMHz: 2040, memMHz: 6251, pcieGen: 4, pcieWidth: 16}
	case nvml.DEVICE_ARCH_BLACKWELL:
		return boardSpec{idleW: 140, maxW: 1000, smMHz: 1965, memMHz: 3996, pcieGen: 5, pcieWidth: 16}
	default:
		return boardSpec{idleW: 70, maxW: 700, smMHz: 1980, memMHz: 2619, pcieGen: 5, pcieWidth: 16}
	}
}

// Node is a simulated GPU node. It implements nvmlsampler.NVML.
type Node struct {
	Scenario *Scenario
	mock     *server.Server
	devices  []*Device
	start    time.Time
	now      func() time.Time
	calls    atomic.Int64
	// missingCalls counts calls of functions the driver branch lacks.
	missingCalls atomic.Int64
	driver       string
	cuda         int

	closed    chan struct{}
	closeOnce sync.Once

	procs []*simProcess // the scenario's GPU processes, in pods and outside
	host  host          // the generated host /proc and container log directory
}

// Option changes a Node.
type Option func(*Node)

// WithClock replaces time.Now, for deterministic tests.
func WithClock(now func() time.Time) Option { return func(n *Node) { n.now = now } }

// New builds a node from a scenario (DefaultScenario when nil).
func New(sc *Scenario, opts ...Option) (*Node, error) {
	if sc == nil {
		sc = DefaultScenario()
	}
	cfg := models[sc.Node.Model]
	cuda, _ := parseCUDAVersion(sc.Node.CUDADriverVersion)
	n := &Node{Scenario: sc, now: time.Now, driver: sc.Node.DriverVersion, cuda: cuda, closed: make(chan struct{})}
	for _, o := range opts {
		o(n)
	}
	n.start = n.now()
	mock, err := server.New(
		server.WithGPUs(gpus.Multiple(sc.Node.Count, cfg)...),
		server.WithDriverVersion(sc.Node.DriverVersion),
		server.WithNVMLVersion("12."+sc.Node.DriverVersion),
		server.WithCUDADriverVersion(cuda),
	)
	if err != nil {
		return nil, err
	}
	n.mock = mock
	specs := map[int]GPUSpec{}
	for _, g := range sc.GPUs {
		specs[g.Index] = g
	}
	for i, md := range mock.Devices {
		sd := md.(*server.Device)
		// Pin identities: the mock draws random UUIDs.
		sd.UUID = stableUUID("GPU", sc.Seed, i, -1)
		sd.PciBusID = fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		d := &Device{node: n, mock: sd, index: i, board: boardFor(cfg), cfg: cfg, geo: modelGeometry(cfg)}
		d.minor = i
		if len(sc.Node.MinorNumbers) > 0 {
			d.minor = sc.Node.MinorNumbers[i]
		}
		spec := specs[i]
		d.workload = resolveWorkload(spec.Workload, i)
		if spec.MIG != nil { // mig: [] is MIG mode with no instance yet
			if err := d.enableMIG(spec.MIG); err != nil {
				return nil, fmt.Errorf("GPU %d: %w", i, err)
			}
		}
		n.devices = append(n.devices, d)
	}
	n.resolveProcesses()
	return n, nil
}

// Calls is the number of NVML calls made on the node so far.
func (n *Node) Calls() int64 { return n.calls.Load() }

func (n *Node) count() { n.calls.Add(1) }

func (n *Node) elapsed() time.Duration { return n.now().Sub(n.start) }

// Devices returns the simulated GPUs.
func (n *Node) Devices() []*Device { return n.devices }

// Init implements nvmlsampler.NVML.
func (n *Node) Init() nvml.Return { n.count(); return nvml.SUCCESS }

// Shutdown implements nvmlsampler.NVML.
func (n *Node) Shutdown() nvml.Return { n.count(); return nvml.SUCCESS }

// SystemGetDriverVersion implements nvmlsampler.NVML.
func (n *Node) SystemGetDriverVersion() (string, nvml.Return) {
	n.count()
	return n.driver, nvml.SUCCESS
}

// SystemGetNVMLVersion implements nvmlsampler.NVML.
func (n *Node) SystemGetNVMLVersion() (string, nvml.Return) {
	n.count()
	return n.mock.NvmlVersion, nvml.SUCCESS
}

// SystemGetCudaDriverVersion implements nvmlsampler.NVML.
func (n *Node) SystemGetCudaDriverVersion() (int, nvml.Return) {
	n.count()
	return n.cuda, nvml.SUCCESS
}

// DeviceGetCount implements nvmlsampler.NVML.
func (n *Node) DeviceGetCount() (int, nvml.Return) {
	n.count()
	return len(n.devices), nvml.SUCCESS
}

// DeviceGetHandleByIndex implements nvmlsampler.NVML.
func (n *Node) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	n.count()
	if i < 0 || i >= len(n.devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return n.devices[i], nvml.SUCCESS
}

// stableUUID derives a UUID from the seed so golden files stay put.
func stableUUID(prefix string, seed int64, gpu, mig int) string {
	b := sha256.Sum256([]byte(fmt.Sprintf("%d/%d/%d", seed, gpu, mig)))
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// noise is a deterministic value in [-1, 1] for (seed, device, field, second);
// 0 on a steady scenario.
func (s *Scenario) noise(key string, t time.Duration) float64 {
	if s.Steady {
		return 0
	}
	return noise(s.Seed, key, t)
}

func noise(seed int64, key string, t time.Duration) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", seed, key, int64(t/time.Second))
	return float64(h.Sum64()%20001)/10000 - 1
}

// at is the curve's value at t; on a steady scenario, its mean.
func (c *Curve) at(s *Scenario, key string, t time.Duration) float64 {
	if c == nil {
		return 0
	}
	v := c.Mean
	if c.Amplitude > 0 && c.Period > 0 && !s.Steady {
		v += c.Amplitude * math.Sin(2*math.Pi*float64(t)/float64(c.Period))
	}
	if c.Noise > 0 {
		v += c.Noise * s.noise(key, t)
	}
	return math.Max(0, math.Min(1, v))
}

// activeWorkload is a resolved workload: curves per phase.
type activeWorkload struct {
	phases []resolvedPhase
	// smActive is DCGM's SM activity where the scenario sets it.
	smActive *Curve
}

type resolvedPhase struct {
	after        time.Duration
	util, memory *Curve
}

func (w *activeWorkload) at(t time.Duration) resolvedPhase {
	cur := w.phases[0]
	for _, p := range w.phases[1:] {
		if t >= p.after {
			cur = p
		}
	}
	return cur
}

func resolveWorkload(w *Workload, _ int) *activeWorkload {
	if w == nil {
		w = &Workload{Preset: "idle"}
	}
	base := resolvePhase(0, w.Preset, w.Utilization, w.Memory)
	aw := &activeWorkload{phases: []resolvedPhase{base}, smActive: w.SMActive}
	for _, p := range w.Phases {
		rp := resolvePhase(time.Duration(p.After), p.Preset, p.Utilization, p.Memory)
		if rp.util == nil {
			rp.util = base.util
		}
		if rp.memory == nil {
			rp.memory = base.memory
		}
		aw.phases = append(aw.phases, rp)
	}
	return aw
}

func resolvePhase(after time.Duration, preset string, util, mem *Curve) resolvedPhase {
	p := resolvedPhase{after: after}
	if pr, ok := presets[preset]; ok {
		p.util, p.memory = pr.Utilization, pr.Memory
	}
	if util != nil {
		p.util = util
	}
	if mem != nil {
		p.memory = mem
	}
	if preset == "" && util == nil && mem == nil && after == 0 {
		p.util, p.memory = presets["idle"].Utilization, presets["idle"].Memory
	}
	return p
}

// migPlan is one planned MIG instance.
type migPlan struct {
	profile   miggeometry.Profile
	placement nvml.GpuInstancePlacement
}

// ProfileNames lists the MIG profiles of a model, smallest first, as the
// MIG geometry table names them.
func ProfileNames(cfg gpus.Config) []string {
	if geo := modelGeometry(cfg); geo != nil {
		return geo.ProfileNames()
	}
	return nil
}

// migError says which instance of a MIG layout is wrong.
type migError struct {
	index int
	msg   string
}

func (e *migError) Error() string { return fmt.Sprintf("instance %d: %s", e.index, e.msg) }

// planMIG places the instances at placements the MIG geometry table allows,
// within each profile's instance limit: the first layout, trying each
// instance's placements in table order, in which all of them fit (as
// mig-parted finds one for a configuration the hardware supports).
func planMIG(cfg gpus.Config, specs []MIGSpec) ([]migPlan, error) {
	geo := modelGeometry(cfg)
	if geo == nil {
		return nil, fmt.Errorf("model %s does not support MIG", cfg.Name)
	}
	profiles := make([]miggeometry.Profile, len(specs))
	count := map[int]int{}
	for i, s := range specs {
		p, ok := geo.ProfileByName(s.Profile)
		if !ok {
			return nil, &migError{i, fmt.Sprintf("unknown MIG profile %q for %s; profiles: %s", s.Profile, cfg.Name, strings.Join(geo.ProfileNames(), ", "))}
		}
		if count[p.ID]++; count[p.ID] > p.Count {
			return nil, &migError{i, fmt.Sprintf("%s does not fit: a GPU holds at most %d of it", s.Profile, p.Count)}
		}
		if s.Placement != nil {
			var starts []string
			ok := false
			for _, pl := range p.Placements() {
				starts = append(starts, strconv.Itoa(pl.Start))
				ok = ok || pl.Start == *s.Placement
			}
			if !ok {
				return nil, &migError{i, fmt.Sprintf("placement %d is not one %s allows on %s; want one of %s", *s.Placement, s.Profile, cfg.Name, strings.Join(starts, ", "))}
			}
		}
		profiles[i] = p
	}
	plans := make([]migPlan, len(specs))
	// deepest is the first instance that no placement could take.
	deepest := 0
	var place func(i int, used uint64) bool
	place = func(i int, used uint64) bool {
		if i == len(profiles) {
			return true
		}
		deepest = max(deepest, i)
		for _, pl := range profiles[i].Placements() {
			if at := specs[i].Placement; at != nil && pl.Start != *at {
				continue
			}
			mask := (uint64(1)<<uint(pl.Size) - 1) << uint(pl.Start)
			if used&mask != 0 {
				continue
			}
			plans[i] = migPlan{profile: profiles[i], placement: nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)}}
			if place(i+1, used|mask) {
				return true
			}
		}
		return false
	}
	if !place(0, 0) {
		return nil, &migError{deepest, fmt.Sprintf("%s does not fit: the instances before it leave no free placement for it", specs[deepest].Profile)}
	}
	return plans, nil
}

// Device is a simulated GPU or MIG instance. It implements nvmlsampler.Device.
type Device struct {
	node     *Node
	mock     *server.Device
	cfg      gpus.Config
	geo      *miggeometry.Model // nil: no MIG
	board    boardSpec
	index    int
	minor    int
	workload *activeWorkload

	mu      sync.Mutex
	migMode int
	migs    []*MIGDevice
	energy  float64 // joules
	lastE   time.Duration
	// hasProcs: the scenario runs processes on the GPU, whose memory and SM
	// use then make the device's, rather than its workload curves.
	hasProcs bool
}

// UUID returns the device's UUID.
func (d *Device) UUID() string { return d.mock.UUID }

// Minor returns the device's NVML minor number.
func (d *Device) Minor() int { return d.minor }

// MIG returns the simulated MIG instances.
func (d *Device) MIG() []*MIGDevice { return d.migs }

func (d *Device) enableMIG(specs []MIGSpec) error {
	plans, err := planMIG(d.cfg, specs)
	if err != nil {
		return err
	}
	d.migMode = nvml.DEVICE_MIG_ENABLE
	_, _ = d.mock.SetMigModeFunc(nvml.DEVICE_MIG_ENABLE)
	for i, p := range plans {
		// The driver numbers a GPU instance by its placement
		// (miggeometry's gpuInstanceIDs), not in creation order.
		gi := d.geo.GPUInstanceID(miggeometry.Placement{Start: int(p.placement.Start), Size: int(p.placement.Size)})
		n := max(1, specs[i].ComputeInstances)
		for ci := 0; ci < n; ci++ {
			slot := len(d.migs)
			w := specs[i].Workload
			if ci < len(specs[i].ComputeInstanceWorkloads) && specs[i].ComputeInstanceWorkloads[ci] != nil {
				w = specs[i].ComputeInstanceWorkloads[ci]
			}
			m := &MIGDevice{
				parent: d, slot: slot, profile: p.profile.Name, geo: p.profile, placement: p.placement,
				gi: gi, ci: ci, cis: n,
				uuid:     stableUUID("MIG", d.node.Scenario.Seed, d.index, slot),
				workload: resolveWorkload(w, d.index),
			}
			d.migs = append(d.migs, m)
		}
	}
	return nil
}

func (d *Device) key(f string) string { return fmt.Sprintf("%d/%s", d.index, f) }

func (d *Device) utilAt(t time.Duration) float64 {
	if d.hasProcs && len(d.migs) == 0 {
		return d.procUtil(t)
	}
	if len(d.migs) > 0 {
		// A MIG GPU is as busy as its instances, weighted by slices.
		var u float64
		for _, m := range d.migs {
			u += m.utilAt(t) * float64(m.geo.Compute) / float64(m.cis) / float64(d.geo.ComputeSlices)
		}
		return u
	}
	return d.workload.at(t).util.at(d.node.Scenario, d.key("util"), t)
}

func (d *Device) memUsedAt(t time.Duration) uint64 {
	if d.hasProcs && len(d.migs) == 0 {
		return d.procMemUsed(t)
	}
	total := d.cfg.MemoryMB << 20
	if len(d.migs) > 0 {
		var used uint64
		for _, m := range d.migs {
			if m.ci == 0 { // once per GPU instance
				used += m.memUsedAt(t)
			}
		}
		return used
	}
	f := d.workload.at(t).memory.at(d.node.Scenario, d.key("mem"), t)
	// The driver holds a little memory on every GPU.
	return uint64(f*float64(total-(512<<20))) + 512<<20
}

func (d *Device) powerAt(t time.Duration) float64 {
	return d.board.idleW + (d.board.maxW-d.board.idleW)*d.utilAt(t)*0.92
}

// GetUUID implements nvmlsampler.Device.
func (d *Device) GetUUID() (string, nvml.Return) { d.node.count(); return d.mock.UUID, nvml.SUCCESS }

// GetName implements nvmlsampler.Device.
func (d *Device) GetName() (string, nvml.Return) { d.node.count(); return d.cfg.Name, nvml.SUCCESS }

// GetIndex implements nvmlsampler.Device.
func (d *Device) GetIndex() (int, nvml.Return) { d.node.count(); return d.index, nvml.SUCCESS }

// GetMinorNumber implements nvmlsampler.Device.
func (d *Device) GetMinorNumber() (int, nvml.Return) { d.node.count(); return d.minor, nvml.SUCCESS }

// GetPciInfo implements nvmlsampler.Device.
func (d *Device) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	d.node.count()
	var p nvml.PciInfo
	for i, c := range []byte(d.mock.PciBusID) {
		p.BusId[i] = int8(c)
	}
	p.PciDeviceId = d.cfg.PciDeviceId
	return p, nvml.SUCCESS
}

// GetMigMode implements nvmlsampler.Device.
func (d *Device) GetMigMode() (int, int, nvml.Return) {
	d.node.count()
	if d.geo == nil {
		return 0, 0, nvml.ERROR_NOT_SUPPORTED
	}
	return d.migMode, d.migMode, nvml.SUCCESS
}

// GetMaxMigDeviceCount implements nvmlsampler.Device.
func (d *Device) GetMaxMigDeviceCount() (int, nvml.Return) {
	d.node.count()
	if d.migMode != nvml.DEVICE_MIG_ENABLE {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return 7, nvml.SUCCESS
}

// GetMigDeviceHandleByIndex implements nvmlsampler.Device.
func (d *Device) GetMigDeviceHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d.node.count()
	if i < 0 || i >= len(d.migs) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return d.migs[i], nvml.SUCCESS
}

// GetGpuInstanceId implements nvmlsampler.Device.
func (d *Device) GetGpuInstanceId() (int, nvml.Return) {
	d.node.count()
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

// GetComputeInstanceId implements nvmlsampler.Device.
func (d *Device) GetComputeInstanceId() (int, nvml.Return) {
	d.node.count()
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

// GetAttributes implements nvmlsampler.Device.
func (d *Device) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	d.node.count()
	return nvml.DeviceAttributes{MemorySizeMB: d.cfg.MemoryMB}, nvml.SUCCESS
}

// GetMemoryInfo implements nvmlsampler.Device.
func (d *Device) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nvml.Memory{}, ret
	}
	m := d.memory()
	// v1 counts the driver's reserved memory as used.
	return nvml.Memory{Total: m.Total, Used: m.Used + m.Reserved, Free: m.Free}, nvml.SUCCESS
}

// GetMemoryInfo_v2 implements nvmlsampler.Device (R510 and later).
func (d *Device) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	d.node.require("nvmlDeviceGetMemoryInfo_v2")
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nvml.Memory_v2{}, ret
	}
	return d.memory(), nvml.SUCCESS
}

// memory is the board's memory as v2 reports it. The driver reserves about
// 0.7% of the framebuffer (nvidia-smi's "Reserved": 579 MiB of 81559 MiB
// on an H100 80GB), which v1 counts as used.
func (d *Device) memory() nvml.Memory_v2 {
	total := d.cfg.MemoryMB << 20
	reserved := (d.cfg.MemoryMB / 140) << 20
	used := d.memUsedAt(d.node.elapsed())
	if used+reserved > total {
		used = total - reserved
	}
	return nvml.Memory_v2{Total: total, Reserved: reserved, Used: used, Free: total - reserved - used}
}

// GetUtilizationRates implements nvmlsampler.Device.
func (d *Device) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nvml.Utilization{}, ret
	}
	if d.migMode == nvml.DEVICE_MIG_ENABLE {
		return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED // as on real MIG GPUs
	}
	t := d.node.elapsed()
	u := d.utilAt(t)
	return nvml.Utilization{Gpu: uint32(math.Round(u * 100)), Memory: uint32(math.Round(u * 55))}, nvml.SUCCESS
}

// GetTemperature implements nvmlsampler.Device.
func (d *Device) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	return d.temperature(), nvml.SUCCESS
}

// GetTemperatureV1 implements nvmlsampler.Device: nvmlDeviceGetTemperatureV
// (R570+) for the GPU's sensor.
func (d *Device) GetTemperatureV1() (nvml.Temperature, nvml.Return) {
	d.node.require("nvmlDeviceGetTemperatureV")
	if ret := d.enter(); ret != nvml.SUCCESS {
		return nvml.Temperature{}, ret
	}
	return nvml.Temperature{SensorType: uint32(nvml.TEMPERATURE_GPU), Temperature: int32(d.temperature())}, nvml.SUCCESS
}

// temperature is the die's temperature, warmer with work.
func (d *Device) temperature() uint32 {
	t := d.node.elapsed()
	return uint32(math.Round(31 + 45*d.utilAt(t) + 2*d.node.Scenario.noise(d.key("temp"), t)))
}

// memoryTemperature is the HBM temperature: a few degrees under the die's
// under load, as on H100s.
func (d *Device) memoryTemperature() uint32 {
	t := d.node.elapsed()
	return uint32(math.Round(30 + 36*d.utilAt(t) + 2*d.node.Scenario.noise(d.key("memtemp"), t)))
}

// GetEncoderUtilization implements nvmlsampler.Device: the simulated
// workloads do no video work.
func (d *Device) GetEncoderUtilization() (uint32, uint32, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, 0, ret
	}
	return 0, 167000, nvml.SUCCESS
}

// GetDecoderUtilization implements nvmlsampler.Device.
func (d *Device) GetDecoderUtilization() (uint32, uint32, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, 0, ret
	}
	return 0, 167000, nvml.SUCCESS
}

// GetPowerUsage implements nvmlsampler.Device (milliwatts).
func (d *Device) GetPowerUsage() (uint32, nvml.Return) {
	if ret := d.enter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	if d.node.unsupported("power") {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return uint32(d.powerAt(d.node.elapsed()) * 1000), nvml.SUCCESS
}

// GetTotalEnergyConsumption implements nvmlsampler.Device (millijoules since
// the driver loaded). Integrated from the power curve, so it only grows.
func (d *Device) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	d.node.count()
	if d.node.unsupported("power") {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.node.elapsed()
	if t > d.lastE {
		d.energy += d.powerAt(t) * (t - d.lastE).Seconds()
		d.lastE = t
	}
	// The driver was loaded a day before the simulation started.
	return uint64((d.energy + d.board.idleW*86400) * 1000), nvml.SUCCESS
}

// GetClockInfo implements nvmlsampler.Device (MHz).
func (d *Device) GetClockInfo(c nvml.ClockType) (uint32, nvml.Return) {
	d.node.count()
	switch c {
	case nvml.CLOCK_SM:
		u := d.utilAt(d.node.elapsed())
		if u < 0.01 {
			return 345, nvml.SUCCESS
		}
		return d.board.smMHz, nvml.SUCCESS
	case nvml.CLOCK_MEM:
		return d.board.memMHz, nvml.SUCCESS
	}
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetCurrPcieLinkGeneration implements nvmlsampler.Device.
func (d *Device) GetCurrPcieLinkGeneration() (int, nvml.Return) {
	d.node.count()
	return d.board.pcieGen, nvml.SUCCESS
}

// GetCurrPcieLinkWidth implements nvmlsampler.Device.
func (d *Device) GetCurrPcieLinkWidth() (int, nvml.Return) {
	d.node.count()
	return d.board.pcieWidth, nvml.SUCCESS
}

// MIGDevice is a simulated MIG instance handle.
type MIGDevice struct {
	parent    *Device
	geo       miggeometry.Profile // the GPU instance's profile
	placement nvml.GpuInstancePlacement
	slot      int
	profile   string
	gi, ci    int
	cis       int // compute instances in the GPU instance
	uuid      string
	workload  *activeWorkload
}

// deviceProfile is the profile NVML names the MIG device by: the GPU
// instance's, prefixed with the compute instance's slices ("1c.3g.40gb")
// when the GPU instance holds several compute instances.
func (m *MIGDevice) deviceProfile() string {
	if m.cis > 1 {
		return fmt.Sprintf("%dc.%s", m.geo.Compute/m.cis, m.profile)
	}
	return m.profile
}

// UUID returns the MIG instance's UUID.
func (m *MIGDevice) UUID() string { return m.uuid }

// GPUInstance returns the GPU instance ID.
func (m *MIGDevice) GPUInstance() int { return m.gi }

// Profile returns the MIG profile name.
func (m *MIGDevice) Profile() string { return m.profile }

func (m *MIGDevice) key(f string) string {
	return fmt.Sprintf("%d/mig%d/%s", m.parent.index, m.slot, f)
}

func (m *MIGDevice) utilAt(t time.Duration) float64 {
	return m.workload.at(t).util.at(m.parent.node.Scenario, m.key("util"), t)
}

// memUsedAt is the memory used in the MIG device's GPU instance: compute
// instances of one GPU instance share its memory, and NVML reports the GPU
// instance's memory on each of them.
func (m *MIGDevice) memUsedAt(t time.Duration) uint64 {
	if m.cis <= 1 {
		return m.ownMemAt(t)
	}
	var used uint64
	for _, o := range m.parent.migs {
		if o.gi == m.gi {
			used += o.ownMemAt(t)
		}
	}
	return min(used, m.geo.MemoryMiB<<20)
}

// ownMemAt is the memory the compute instance's own work uses: its share
// of the GPU instance's memory, by its workload.
func (m *MIGDevice) ownMemAt(t time.Duration) uint64 {
	total := m.geo.MemoryMiB << 20
	if ps := m.parent.node.processesOn(m.parent.index, m.slot, t); len(ps) > 0 {
		used := uint64(64 << 20)
		for _, p := range ps {
			used += m.parent.node.processMemory(p, t)
		}
		return min(used, total) // compute instances share the memory, with no limit each
	}
	share := total / uint64(m.cis)
	f := m.workload.at(t).memory.at(m.parent.node.Scenario, m.key("mem"), t)
	return uint64(f*float64(share-(64<<20))) + 64<<20
}

func (m *MIGDevice) count() { m.parent.node.count() }

// GetUUID implements nvmlsampler.Device.
func (m *MIGDevice) GetUUID() (string, nvml.Return) { m.count(); return m.uuid, nvml.SUCCESS }

// GetName implements nvmlsampler.Device.
func (m *MIGDevice) GetName() (string, nvml.Return) {
	m.count()
	return m.parent.cfg.Name + " MIG " + m.deviceProfile(), nvml.SUCCESS
}

// GetIndex implements nvmlsampler.Device.
func (m *MIGDevice) GetIndex() (int, nvml.Return) { m.count(); return m.slot, nvml.SUCCESS }

// GetMinorNumber implements nvmlsampler.Device.
func (m *MIGDevice) GetMinorNumber() (int, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetPciInfo implements nvmlsampler.Device.
func (m *MIGDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) { return m.parent.GetPciInfo() }

// GetMigMode implements nvmlsampler.Device.
func (m *MIGDevice) GetMigMode() (int, int, nvml.Return) {
	m.count()
	return 0, 0, nvml.ERROR_NOT_SUPPORTED
}

// GetMaxMigDeviceCount implements nvmlsampler.Device.
func (m *MIGDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetMigDeviceHandleByIndex implements nvmlsampler.Device.
func (m *MIGDevice) GetMigDeviceHandleByIndex(int) (nvmlsampler.Device, nvml.Return) {
	m.count()
	return nil, nvml.ERROR_NOT_SUPPORTED
}

// GetGpuInstanceId implements nvmlsampler.Device.
func (m *MIGDevice) GetGpuInstanceId() (int, nvml.Return) { m.count(); return m.gi, nvml.SUCCESS }

// GetComputeInstanceId implements nvmlsampler.Device.
func (m *MIGDevice) GetComputeInstanceId() (int, nvml.Return) { m.count(); return m.ci, nvml.SUCCESS }

// GetAttributes implements nvmlsampler.Device.
func (m *MIGDevice) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	m.count()
	return nvml.DeviceAttributes{
		MultiprocessorCount:       uint32(m.geo.Compute * 16 / m.cis),
		GpuInstanceSliceCount:     uint32(m.geo.Compute),
		ComputeInstanceSliceCount: uint32(m.geo.Compute / m.cis),
		MemorySizeMB:              m.geo.MemoryMiB,
	}, nvml.SUCCESS
}

// GetMemoryInfo implements nvmlsampler.Device.
func (m *MIGDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	m.count()
	total := m.geo.MemoryMiB << 20
	used := m.memUsedAt(m.parent.node.elapsed())
	return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
}

// GetMemoryInfo_v2 implements nvmlsampler.Device: a MIG instance reserves
// nothing of its own.
func (m *MIGDevice) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	m.parent.node.require("nvmlDeviceGetMemoryInfo_v2")
	v1, ret := m.GetMemoryInfo()
	return nvml.Memory_v2{Total: v1.Total, Used: v1.Used, Free: v1.Free}, ret
}

// GetUtilizationRates implements nvmlsampler.Device: not on MIG instances.
func (m *MIGDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	m.count()
	return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
}

// GetTemperature implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetTemperatureV1 implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetTemperatureV1() (nvml.Temperature, nvml.Return) {
	m.parent.node.require("nvmlDeviceGetTemperatureV")
	m.count()
	return nvml.Temperature{}, nvml.ERROR_NOT_SUPPORTED
}

// GetPowerUsage implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetPowerUsage() (uint32, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetTotalEnergyConsumption implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetClockInfo implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetClockInfo(nvml.ClockType) (uint32, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetCurrPcieLinkGeneration implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetCurrPcieLinkGeneration() (int, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetCurrPcieLinkWidth implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetCurrPcieLinkWidth() (int, nvml.Return) {
	m.count()
	return 0, nvml.ERROR_NOT_SUPPORTED
}

// GetEncoderUtilization implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetEncoderUtilization() (uint32, uint32, nvml.Return) {
	m.count()
	return 0, 0, nvml.ERROR_NOT_SUPPORTED
}

// GetDecoderUtilization implements nvmlsampler.Device: per board only.
func (m *MIGDevice) GetDecoderUtilization() (uint32, uint32, nvml.Return) {
	m.count()
	return 0, 0, nvml.ERROR_NOT_SUPPORTED
}
