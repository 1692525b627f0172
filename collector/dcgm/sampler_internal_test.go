package dcgm

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// White-box tests: raw values fed straight into the sampler's merge and
// health hold, and the host engine address parsing.

const uuid0 = "GPU-00000000-0000-0000-0000-000000000000"

func testConfig() Config {
	return Config{Mode: ModeEmbedded, Interval: 10 * time.Millisecond, MaxMissed: 3, MaxBackoff: 40 * time.Millisecond, Log: zerolog.Nop()}
}

// neverOpen is the Open of a sampler whose values the test feeds itself.
func neverOpen(Config) (Client, error) {
	return nil, errors.New("not opened: the test feeds the sampler")
}

func TestStandaloneAddress(t *testing.T) {
	for _, c := range []struct{ in, addr, sock string }{
		{"", "localhost:5555", "0"},
		{"nvidia-dcgm:5555", "nvidia-dcgm:5555", "0"},
		{"10.0.0.1", "10.0.0.1:5555", "0"},
		{"tcp://10.0.0.1:6000", "10.0.0.1:6000", "0"},
		{"[::1]:5555", "[::1]:5555", "0"},
		{"unix:///run/dcgm.sock", "/run/dcgm.sock", "1"},
	} {
		t.Run(fmt.Sprintf("%q", c.in), func(t *testing.T) {
			addr, sock, err := standaloneAddress(c.in)
			if err != nil || addr != c.addr || sock != c.sock {
				t.Errorf("standaloneAddress(%q) = %q, %q, %v; want %q, %q", c.in, addr, sock, err, c.addr, c.sock)
			}
		})
	}
}

// TestMergeSkipsBlankAndNotSupported feeds raw values straight into merge.
func TestMergeSkipsBlankAndNotSupported(t *testing.T) {
	s := NewSampler(testConfig(), neverOpen)
	gpu := Entity{EntityGPU, 0}
	st := &devState{info: DeviceInfo{Entity: gpu, UUID: uuid0, GPUInstance: -1}, key: devKey{uuid0, -1, -1}}
	s.devs, s.byEntity = []*devState{st}, map[Entity]*devState{gpu: st}
	now := time.Now()
	d := func(f Field, v float64, status int) RawValue {
		return RawValue{Entity: gpu, FieldID: f.ID(), Status: status, Type: FieldTypeDouble, Float: v, Time: now}
	}
	i := func(f Field, v int64, status int) RawValue {
		return RawValue{Entity: gpu, FieldID: f.ID(), Status: status, Type: FieldTypeInt64, Int: v, Time: now}
	}
	s.merge(now, []RawValue{
		d(SMActive, 0.5, StatusOK),                          // kept
		d(SMOccupancy, FP64Blank, StatusOK),                 // blank
		d(TensorActive, FP64NotSupported, StatusOK),         // not-supported sentinel
		d(DRAMActive, 0.3, StatusNotSupported),              // not-supported status, plausible value
		d(GraphicsActive, math.NaN(), StatusOK),             // not a number
		d(FP64Active, -0.1, StatusOK),                       // negative
		d(FP32Active, 0.2, StatusNotWatched),                // not watched
		i(PCIeTxBytes, Int64Blank, StatusOK),                // int blank
		i(PCIeRxBytes, Int64NotSupported, StatusOK),         // int not supported
		i(NVLinkTxBytes, 1000, StatusProfilingNotSupported), // bad status
		{Entity: Entity{EntityGPU, 7}, FieldID: SMActive.ID(), Type: FieldTypeDouble, Float: 0.9, Time: now}, // unknown entity
		{Entity: gpu, FieldID: FieldIDXIDErrors, Type: FieldTypeInt64, Int: Int64Blank, Time: now},           // no XID
	})
	devs := s.build(now, nil, true)
	if len(devs) != 1 {
		t.Fatalf("devices = %+v", devs)
	}
	got := devs[0].Values
	if len(got) != 1 || got[SMActive] != 0.5 {
		t.Errorf("values = %v, want only sm_active 0.5", got)
	}
	if devs[0].LastXID != 0 {
		t.Errorf("LastXID = %d from a blank", devs[0].LastXID)
	}
}

func TestCounterIntegration(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = time.Second // max age 3.5s
	s := NewSampler(cfg, neverOpen)
	gpu := Entity{EntityGPU, 0}
	st := &devState{info: DeviceInfo{Entity: gpu, UUID: uuid0, GPUInstance: -1}, key: devKey{uuid0, -1, -1}}
	s.devs, s.byEntity = []*devState{st}, map[Entity]*devState{gpu: st}
	t0 := time.Now()
	step := func(sec float64, rate int64, blank bool) (float64, float64) {
		ts := t0.Add(time.Duration(sec * float64(time.Second)))
		rv := RawValue{Entity: gpu, FieldID: PCIeTxBytes.ID(), Type: FieldTypeInt64, Int: rate, Time: ts}
		if blank {
			rv.Int = Int64Blank
		}
		s.merge(ts, []RawValue{rv})
		d := s.build(ts, nil, false)
		v, ok := d[0].Values[PCIeTxBytes]
		if !ok {
			t.Fatalf("t=%v: counter absent", sec)
		}
		r, ok := d[0].Rate(PCIeTxBytes)
		if !ok {
			t.Fatalf("t=%v: rate absent beside the counter", sec)
		}
		return v, r
	}
	steps := []struct {
		sec   float64
		rate  int64
		blank bool
		want  float64
		// wantRate: the rate beside the counter is DCGM's last one, from
		// the first value on and across gaps.
		wantRate float64
	}{
		{0, 100, false, 0, 100},    // first value: the counter starts at 0
		{1, 100, false, 100, 100},  // 100 B/s for 1 s
		{2, 300, false, 400, 300},  // 300 B/s for 1 s
		{2, 999, false, 400, 300},  // same DCGM timestamp: nothing new
		{3, 0, true, 400, 300},     // blank: skipped (the last value stays fresh)
		{4, 50, false, 500, 50},    // 50 B/s over the 2 s since the last rate
		{12, 70, false, 500, 70},   // an 8 s gap (> max age) is not integrated; its rate is current
		{13.5, 20, false, 530, 20}, // 20 B/s for 1.5 s
	}
	prev := -1.0
	for _, c := range steps {
		got, rate := step(c.sec, c.rate, c.blank)
		if math.Abs(got-c.want) > 1e-6 {
			t.Errorf("t=%v: counter = %v, want %v", c.sec, got, c.want)
		}
		if rate != c.wantRate {
			t.Errorf("t=%v: rate = %v, want %v", c.sec, rate, c.wantRate)
		}
		if got < prev {
			t.Errorf("t=%v: counter decreased %v -> %v", c.sec, prev, got)
		}
		prev = got
	}
	// Counters survive a reconnect (new field state, same device).
	s.devs[0] = &devState{info: st.info, key: st.key}
	s.byEntity[gpu] = s.devs[0]
	if got, _ := step(14, 10, false); got != 535 { // 10 B/s for the 0.5 s since 13.5
		t.Errorf("after reconnect: counter = %v, want 535", got)
	}
}

func TestHealthHold(t *testing.T) {
	cfg := testConfig()
	cfg.HealthHold = time.Hour
	s := NewSampler(cfg, nil)
	k := devKey{uuid0, -1, -1}
	now := time.Now()
	if h := s.healthOf(now, k, map[string]string{HealthMemory: HealthFail}); h[HealthMemory] != HealthFail {
		t.Fatalf("memory = %q", h[HealthMemory])
	}
	if h := s.healthOf(now.Add(time.Minute), k, nil); h[HealthMemory] != HealthFail || h[HealthPCIe] != HealthPass {
		t.Errorf("held: %v", h)
	}
	if h := s.healthOf(now.Add(2*time.Hour), k, nil); h[HealthMemory] != HealthPass {
		t.Errorf("after the hold: %v", h)
	}
}
