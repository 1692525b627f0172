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
	// countFails, when not SUCCESS, is what nvmlDeviceGetCount answers.
	countFails atomic.Int32
	mu         sync.Mutex
	initGate   chan struct{}
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
	if ret := nvml.Return(d.countFails.Load()); ret != nvml.SUCCESS {
		return 0, ret
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

// nvmlInit succeeds but nvmlDeviceGetCount fails with an error that does
// not say the driver went away: every successful nvmlInit is paired with
// nvmlShutdown (NVML counts its initialisations, and the library stays
// loaded, holding the old driver, until as many shutdowns), the next try
// waits for the backoff, the failure is logged once, and every nvmlInit
// is counted. When the GPUs can be listed again they come up.
func TestSamplerReleasesNVMLWhenTheGPUsCannotBeListed(t *testing.T) {
	lib := newDriverNVML(t)
	lib.countFails.Store(int32(nvml.ERROR_UNKNOWN))
	var logs syncBuffer
	const minBackoff, maxBackoff = 40 * time.Millisecond, time.Second
	start := time.Now()
	s, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second,
		MinBackoff: minBackoff, MaxBackoff: maxBackoff, Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sampleUntil(t, s, "a sample saying the GPUs cannot be listed", func(up bool, down string) bool {
		return !up && strings.Contains(down, nvml.ERROR_UNKNOWN.Error())
	})
	// Samples as fast as they come for 300 ms: nvmlInit may run at 0 and
	// then after each backoff (40 ms doubling to 1 s): at 40, 120, 280 ms...
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		s.Sample(context.Background())
		time.Sleep(time.Millisecond)
	}
	inits, shutdowns := lib.inits.Load(), lib.shutdown.Load()
	elapsed, allowed := time.Since(start), int32(1)
	for at, b := minBackoff, minBackoff; at <= elapsed; at += b {
		allowed++
		b = min(2*b, maxBackoff)
	}
	if inits > allowed {
		t.Errorf("nvmlInit called %d times in %s of samples, want at most %d (retried with backoff)", inits, elapsed, allowed)
	}
	if shutdowns != inits {
		t.Errorf("nvmlShutdown called %d times for %d successful nvmlInit calls, want as many", shutdowns, inits)
	}
	if st := s.Status(); st.Inits != int(inits) {
		t.Errorf("Status().Inits = %d, want %d (every successful nvmlInit)", st.Inits, inits)
	}
	if n := strings.Count(logs.String(), "cannot list the GPUs"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, logs.String())
	}

	lib.countFails.Store(int32(nvml.SUCCESS))
	sampleUntil(t, s, "GPUs up", func(up bool, down string) bool { return up && down == "" })
	if inits, shutdowns := lib.inits.Load(), lib.shutdown.Load(); shutdowns != inits-1 || s.Status().Inits != int(inits) {
		t.Errorf("after recovery: %d nvmlInit, %d nvmlShutdown, Status().Inits %d; want one nvmlInit held, each counted", inits, shutdowns, s.Status().Inits)
	}
}
