package nvmlsampler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

func parse(t *testing.T, y string) *simnode.Scenario {
	t.Helper()
	sc, err := simnode.ParseScenario("test.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// fixedNow keeps the simulated workload still between the sampler's reads
// and the test's own.
func fixedNow() func() time.Time {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return func() time.Time { return t0 }
}

func sampleNode(t *testing.T, lib nvmlsampler.NVML, n int) *sample.NodeSample {
	t.Helper()
	s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: 5 * time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	var out *sample.NodeSample
	for i := 0; i < n; i++ {
		out = s.Sample(context.Background())
	}
	return out
}

const twoGPUs = `
node: {model: H100-SXM5-80GB, count: 2, driverBranch: %s}
gpus:
  - index: 1
    mig: [{profile: 3g.40gb}, {profile: 1g.10gb}]
`

// A function newer than the driver kills the process
// (the simulated node panics like the dynamic linker). On every supported
// branch the sampler must call only what the driver exports, fall back to
// nvmlDeviceGetCurrentClocksThrottleReasons before R535 and v1 memory
// before R510.
func TestOldDriverBranchesCallOnlyWhatTheyExport(t *testing.T) {
	for _, tc := range []struct {
		branch   string
		reserved bool
	}{
		{"R470", false},
		{"R510", true},
		{"R535", true},
		{"R550", true},
		{"R570", true},
		{"R580", true},
	} {
		t.Run(tc.branch, func(t *testing.T) {
			node, err := simnode.New(parse(t, sprintf(twoGPUs, tc.branch)), simnode.WithClock(fixedNow()))
			if err != nil {
				t.Fatal(err)
			}
			s := sampleNode(t, node, 2)
			if n := node.MissingCalls(); n != 0 {
				t.Fatalf("%d calls of functions %s does not export", n, tc.branch)
			}
			for _, g := range s.GPUs {
				if !g.Up {
					t.Fatalf("GPU %d down", g.GPU)
				}
				if !g.Health.ClockReasons.OK {
					t.Errorf("GPU %d: no clock event reasons (the fallback to ClocksThrottleReasons is missing)", g.GPU)
				}
				if _, ok := g.Values.Get(sample.FieldMemoryUsed); !ok {
					t.Errorf("GPU %d: no memory used", g.GPU)
				}
				if _, ok := g.Values.Get(sample.FieldMemoryReserved); ok != tc.reserved {
					t.Errorf("GPU %d: reserved memory exported %v, want %v", g.GPU, ok, tc.reserved)
				}
			}
			if len(s.GPUs[1].MIG) != 2 {
				t.Errorf("%d MIG instances, want 2", len(s.GPUs[1].MIG))
			}
		})
	}
}

// Used memory must not count what the driver reserves
// (v1 does; v2 separates it), and reserved is exported on its own.
func TestMemoryUsedExcludesReserved(t *testing.T) {
	node, err := simnode.New(nil, simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	s := sampleNode(t, node, 1)
	for i, g := range s.GPUs {
		d, _ := node.DeviceGetHandleByIndex(i)
		want, _ := d.GetMemoryInfo_v2()
		v1, _ := d.GetMemoryInfo()
		if want.Reserved == 0 || v1.Used != want.Used+want.Reserved {
			t.Fatalf("simulated GPU %d does not reserve memory as drivers do: %+v vs v1 %+v", i, want, v1)
		}
		used, _ := g.Values.Get(sample.FieldMemoryUsed)
		reserved, ok := g.Values.Get(sample.FieldMemoryReserved)
		if used != float64(want.Used) {
			t.Errorf("GPU %d: used %v, want %v (v1 would say %v)", i, used, want.Used, v1.Used)
		}
		if !ok || reserved != float64(want.Reserved) {
			t.Errorf("GPU %d: reserved %v (set %v), want %v", i, reserved, ok, want.Reserved)
		}
	}
}

// withheldNVML answers memory queries with a fixed code on chosen GPUs.
type withheldNVML struct {
	nvmlsampler.NVML
	ret map[int]nvml.Return
}

func (w withheldNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := w.NVML.DeviceGetHandleByIndex(i)
	if r, ok := w.ret[i]; ok && ret == nvml.SUCCESS {
		return withheldDevice{d, r}, ret
	}
	return d, ret
}

type withheldDevice struct {
	nvmlsampler.Device
	ret nvml.Return
}

func (d withheldDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) { return nvml.Memory{}, d.ret }
func (d withheldDevice) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	return nvml.Memory_v2{}, d.ret
}

// NO_PERMISSION on a MIG parent and NOT_SUPPORTED on an
// integrated GPU mean "will not tell", not "failed": the GPU and its MIG
// instances stay up. Any other memory error still marks the GPU down.
func TestMemoryWithheldIsNotAFailure(t *testing.T) {
	node, err := simnode.New(parse(t, sprintf(twoGPUs, "R580")), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	sc2 := parse(t, sprintf(twoGPUs, "R580"))
	sc2.Node.Count = 3
	node3, err := simnode.New(sc2, simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	s := sampleNode(t, withheldNVML{node, map[int]nvml.Return{0: nvml.ERROR_NOT_SUPPORTED, 1: nvml.ERROR_NO_PERMISSION}}, 1)
	for _, g := range s.GPUs {
		if !g.Up {
			t.Errorf("GPU %d down although it answered", g.GPU)
		}
		if _, ok := g.Values.Get(sample.FieldMemoryUsed); ok {
			t.Errorf("GPU %d: memory exported although NVML withheld it", g.GPU)
		}
		if _, ok := g.Values.Get(sample.FieldTemperature); !ok {
			t.Errorf("GPU %d: temperature missing", g.GPU)
		}
	}
	if len(s.GPUs[1].MIG) != 2 {
		t.Fatalf("%d MIG instances, want 2", len(s.GPUs[1].MIG))
	}
	for _, m := range s.GPUs[1].MIG {
		if _, ok := m.Values.Get(sample.FieldMemoryUsed); !m.Up || !ok {
			t.Errorf("MIG instance %d: up %v, memory %v; want both", m.GPUInstance, m.Up, ok)
		}
	}
	s = sampleNode(t, withheldNVML{node3, map[int]nvml.Return{2: nvml.ERROR_UNKNOWN}}, 1)
	if s.GPUs[2].Up || !s.GPUs[0].Up {
		t.Errorf("ERROR_UNKNOWN on memory: GPU 2 up %v (want down), GPU 0 up %v", s.GPUs[2].Up, s.GPUs[0].Up)
	}
}

// Every clock event reason bit go-nvml knows
// (ClocksEventReasonAll) has a name, taken from go-nvml's constants.
func TestEveryClockEventReasonNamed(t *testing.T) {
	named := map[uint64]string{}
	for _, r := range sample.ClockEventReasons {
		if r.Bit == 0 || r.Bit&(r.Bit-1) != 0 {
			t.Errorf("%s: %#x is not one bit", r.Name, r.Bit)
		}
		if other, dup := named[r.Bit]; dup {
			t.Errorf("%#x named twice: %s, %s", r.Bit, other, r.Name)
		}
		named[r.Bit] = r.Name
	}
	for bit := uint64(1); bit <= nvml.ClocksEventReasonAll; bit <<= 1 {
		if nvml.ClocksEventReasonAll&bit != 0 && named[bit] == "" {
			t.Errorf("clock event reason %#x (in nvml.ClocksEventReasonAll) has no name", bit)
		}
	}
}

// Every recovery action go-nvml defines has a name.
func TestEveryRecoveryActionNamed(t *testing.T) {
	named := map[nvml.DeviceGpuRecoveryAction]bool{}
	for _, a := range sample.RecoveryActions {
		named[a.Value] = true
	}
	for a := nvml.GPU_RECOVERY_ACTION_NONE; a <= nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT; a++ {
		if !named[a] {
			t.Errorf("recovery action %d has no name", a)
		}
	}
}

func sprintf(f string, a ...any) string { return fmt.Sprintf(f, a...) }

// On x86 nvmlDeviceGetNumaNodeId answers NOT_SUPPORTED
// (and R470-R545 lack it); the NUMA node is read from
// <sysfs>/bus/pci/devices/<bus id>/numa_node on every branch.
func TestNUMANodeFromSysfs(t *testing.T) {
	for _, branch := range []string{"R470", "R580"} {
		sc := parse(t, sprintf("node: {model: H100-SXM5-80GB, count: 4, driverBranch: %s}", branch))
		node, err := simnode.New(sc, simnode.WithClock(fixedNow()))
		if err != nil {
			t.Fatal(err)
		}
		sysfs := t.TempDir()
		if err := node.WriteSysfs(sysfs); err != nil {
			t.Fatal(err)
		}
		s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: 5 * time.Second, Log: zerolog.Nop(), Sysfs: sysfs})
		if err != nil {
			t.Fatal(err)
		}
		out := s.Sample(context.Background())
		s.Close()
		for _, g := range out.GPUs {
			if n := g.Health.NUMANode; !n.OK || n.V != g.GPU/2 {
				t.Errorf("%s GPU %d: NUMA node %+v, want %d", branch, g.GPU, n, g.GPU/2)
			}
		}
	}
}

// swapNVML hands out devices whose NVML answers can be switched to another
// simulated node's between samples, as a MIG reconfiguration does.
type swapNVML struct {
	nvmlsampler.NVML
	devs []*swapDevice
}

type swapDevice struct{ nvmlsampler.Device }

func (s *swapNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	return s.devs[i], nvml.SUCCESS
}

// A MIG reconfiguration shows in the next sample, not
// after the periodic rediscovery (every 12 samples).
func TestMIGReconfigurationSeenInOneSample(t *testing.T) {
	const before = "node: {model: H100-SXM5-80GB, count: 1}\ngpus: [{index: 0, mig: [{profile: 3g.40gb}]}]"
	const after = "node: {model: H100-SXM5-80GB, count: 1}\ngpus: [{index: 0, mig: [{profile: 1g.10gb}, {profile: 1g.10gb}, {profile: 2g.20gb}]}]"
	a, err := simnode.New(parse(t, before), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := simnode.New(parse(t, after), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.DeviceGetHandleByIndex(0)
	db, _ := b.DeviceGetHandleByIndex(0)
	lib := &swapNVML{NVML: a, devs: []*swapDevice{{da}}}
	s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: 5 * time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 2; i++ {
		if got := len(s.Sample(context.Background()).GPUs[0].MIG); got != 1 {
			t.Fatalf("sample %d: %d MIG devices, want 1", i, got)
		}
	}
	lib.devs[0].Device = db // nvidia-smi mig -dgi / -cgi between two samples
	g := s.Sample(context.Background()).GPUs[0]
	var profiles []string
	for _, m := range g.MIG {
		profiles = append(profiles, m.MIGProfile)
	}
	if len(profiles) != 3 || profiles[0] != "1g.10gb" {
		t.Errorf("after reconfiguration: MIG devices %v, want 1g.10gb, 1g.10gb, 2g.20gb", profiles)
	}
	if g.MIGLayout == nil || len(g.MIGLayout.Instances) != 3 {
		t.Errorf("layout not rediscovered: %+v", g.MIGLayout)
	}
}

// hangNVML blocks DeviceGetHandleByIndex of one GPU until released.
type hangNVML struct {
	nvmlsampler.NVML
	gpu     int
	release chan struct{}
}

func (h hangNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	if i == h.gpu {
		<-h.release
	}
	return h.NVML.DeviceGetHandleByIndex(i)
}

// Discovery at start has a deadline, so a hung GPU
// cannot keep the exporter (and its HTTP listener) from starting; the hung
// GPU is reported down and joins once it answers.
func TestStartupDiscoveryDeadline(t *testing.T) {
	node, err := simnode.New(parse(t, "node: {model: H100-SXM5-80GB, count: 2}"), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	lib := hangNVML{NVML: node, gpu: 1, release: make(chan struct{})}
	started := make(chan *nvmlsampler.Sampler, 1)
	go func() {
		s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: 50 * time.Millisecond, Log: zerolog.Nop()})
		if err != nil {
			t.Error(err)
		}
		started <- s
	}()
	var s *nvmlsampler.Sampler
	select {
	case s = <-started:
	case <-time.After(10 * time.Second):
		close(lib.release)
		t.Fatal("NewSampler blocked on a hung GPU")
	}
	// nvmlInit and GPU 0's discovery run in their own goroutines and may
	// outlast one device timeout on a loaded machine; GPU 1 never answers.
	var out *sample.NodeSample
	waitUntil(t, "NVML initialised with GPU 0 up", func() bool {
		out = s.Sample(context.Background())
		return len(out.GPUs) == 2 && out.GPUs[0].Up
	})
	if out.GPUs[1].Up || !out.GPUs[1].Hung {
		t.Errorf("GPU 1 up %v hung %v, want down and hung", out.GPUs[1].Up, out.GPUs[1].Hung)
	}
	close(lib.release)
	waitUntil(t, "GPU 1 to join after answering", func() bool { return s.Sample(context.Background()).GPUs[1].Up })
	s.Close()
}

// staleMIGLib hands out MIG device handles that go stale, as the driver's
// do when their compute instance is destroyed, once epoch moves past the
// epoch they were issued in: they answer INVALID_ARGUMENT.
type staleMIGLib struct {
	nvmlsampler.NVML
	epoch *atomic.Int32
}

func (l staleMIGLib) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := l.NVML.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, ret
	}
	return staleMIGParent{Device: d, epoch: l.epoch}, ret
}

type staleMIGParent struct {
	nvmlsampler.Device
	epoch *atomic.Int32
}

func (p staleMIGParent) GetMigDeviceHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	m, ret := p.Device.GetMigDeviceHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return m, ret
	}
	return staleMIGHandle{Device: m, issued: p.epoch.Load(), epoch: p.epoch}, ret
}

type staleMIGHandle struct {
	nvmlsampler.Device
	issued int32
	epoch  *atomic.Int32
}

func (h staleMIGHandle) stale() bool { return h.issued != h.epoch.Load() }

func (h staleMIGHandle) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if h.stale() {
		return nvml.Memory{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return h.Device.GetMemoryInfo()
}

func (h staleMIGHandle) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	if h.stale() {
		return nvml.Memory_v2{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return h.Device.GetMemoryInfo_v2()
}

// MIG reconfigured between a sample's layout check and its read of the MIG
// devices (mig-parted at work): the handles answer INVALID_ARGUMENT. The
// same sample reads the layout and the handles again, and serves the MIG
// devices up, not as lost.
func TestMIGHandlesStaleWithinASample(t *testing.T) {
	node, err := simnode.New(parse(t, sprintf(twoGPUs, "R580")), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	var epoch atomic.Int32
	s, err := nvmlsampler.NewSampler(staleMIGLib{NVML: node, epoch: &epoch}, nvmlsampler.SamplerConfig{DeviceTimeout: 5 * time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	migUp := func(out *sample.NodeSample) (up, all int) {
		for _, g := range out.GPUs {
			for _, m := range g.MIG {
				all++
				if m.Up {
					up++
				}
			}
		}
		return up, all
	}
	var out *sample.NodeSample
	waitUntil(t, "a sample with both MIG devices up", func() bool {
		out = s.Sample(context.Background())
		up, all := migUp(out)
		return all == 2 && up == 2
	})
	epoch.Add(1) // every MIG handle issued so far is stale
	out = s.Sample(context.Background())
	if up, all := migUp(out); all != 2 || up != 2 {
		t.Errorf("after the handles went stale: %d of %d MIG devices up, want 2 of 2", up, all)
	}
}
