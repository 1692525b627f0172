package nvmlsampler_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// driverNVML is a simulated library whose driver can go away: while gone,
// every call answers UNINITIALIZED; while unloaded, nvmlInit answers
// DRIVER_NOT_LOADED. initGate, when set, holds nvmlInit until closed.
type driverNVML struct {
	nvmlsampler.NVML
	gone, unloaded  atomic.Bool
	inits, shutdown atomic.Int32
	mu              sync.Mutex
	initGate        chan struct{}
}

func (d *driverNVML) Init() nvml.Return {
	d.mu.Lock()
	gate := d.initGate
	d.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if d.unloaded.Load() {
		return nvml.ERROR_DRIVER_NOT_LOADED
	}
	d.gone.Store(false)
	d.inits.Add(1)
	return d.NVML.Init()
}

func (d *driverNVML) Shutdown() nvml.Return {
	d.shutdown.Add(1)
	if d.gone.Load() {
		return nvml.ERROR_UNINITIALIZED
	}
	return d.NVML.Shutdown()
}

func (d *driverNVML) DeviceGetCount() (int, nvml.Return) {
	if d.gone.Load() {
		return 0, nvml.ERROR_UNINITIALIZED
	}
	return d.NVML.DeviceGetCount()
}

func (d *driverNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	if d.gone.Load() {
		return nil, nvml.ERROR_UNINITIALIZED
	}
	h, ret := d.NVML.DeviceGetHandleByIndex(i)
	return goneDevice{h, d}, ret
}

type goneDevice struct {
	nvmlsampler.Device
	d *driverNVML
}

func (g goneDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if g.d.gone.Load() {
		return nvml.Memory{}, nvml.ERROR_UNINITIALIZED
	}
	return g.Device.GetMemoryInfo()
}

func (g goneDevice) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	if g.d.gone.Load() {
		return nvml.Memory_v2{}, nvml.ERROR_UNINITIALIZED
	}
	return g.Device.GetMemoryInfo_v2()
}

func newDriverNVML(t *testing.T) *driverNVML {
	t.Helper()
	node, err := simnode.New(parse(t, "node: {model: A100-SXM4-80GB, count: 2}"), simnode.WithClock(fixedNow()))
	if err != nil {
		t.Fatal(err)
	}
	return &driverNVML{NVML: node}
}

// sampleUntil samples until cond holds, failing after 10 s.
func sampleUntil(t *testing.T, s *nvmlsampler.Sampler, what string, cond func(up bool, down string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := s.Sample(context.Background())
		up := len(out.GPUs) > 0
		for _, g := range out.GPUs {
			up = up && g.Up
		}
		if cond(up, out.NVML.Down) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s: GPUs up %v, NVML down %q", what, up, out.NVML.Down)
		}
		time.Sleep(time.Millisecond)
	}
}

// NVML is initialised in the background: NewSampler returns before
// nvmlInit does, and samples say what they wait for.
func TestSamplerWaitsForNVMLInit(t *testing.T) {
	lib := newDriverNVML(t)
	lib.initGate = make(chan struct{})
	s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: 20 * time.Millisecond, InitTimeout: 50 * time.Millisecond, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	sampleUntil(t, s, "a sample saying nvmlInit has not returned", func(up bool, down string) bool {
		return !up && strings.Contains(down, "nvmlInit has not returned")
	})
	lib.mu.Lock()
	close(lib.initGate)
	lib.mu.Unlock()
	sampleUntil(t, s, "GPUs up", func(up bool, down string) bool { return up && down == "" })
	if n := lib.inits.Load(); n != 1 {
		t.Errorf("nvmlInit called %d times, want once", n)
	}
	if n := lib.shutdown.Load(); n != 0 {
		t.Errorf("nvmlShutdown called %d times, want none", n)
	}
	s.Close()
}

// A driver that goes away is released and initialised again, with backoff
// while it stays away.
func TestSamplerRecoversFromDriverReload(t *testing.T) {
	lib := newDriverNVML(t)
	s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sampleUntil(t, s, "GPUs up", func(up bool, down string) bool { return up && down == "" })

	lib.unloaded.Store(true)
	lib.gone.Store(true)
	sampleUntil(t, s, "NVML down, saying the driver went away", func(up bool, down string) bool {
		return !up && strings.Contains(down, "driver went away")
	})
	if lib.shutdown.Load() != 1 {
		t.Errorf("nvmlShutdown called %d times after the driver went away, want once (release)", lib.shutdown.Load())
	}
	sampleUntil(t, s, "a failing nvmlInit retried", func(up bool, down string) bool {
		return !up && strings.Contains(down, "nvmlInit failed")
	})
	if st := s.Status(); st.DownSince.IsZero() {
		t.Error("Status has no DownSince while NVML is down")
	}
	lib.unloaded.Store(false)
	sampleUntil(t, s, "GPUs up again", func(up bool, down string) bool { return up && down == "" })
	if st := s.Status(); st.Inits != 2 || lib.inits.Load() != 2 {
		t.Errorf("Inits = %d (library saw %d), want 2", st.Inits, lib.inits.Load())
	}
}
