package collector_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	nvmlsampler "github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvml"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// The acceptance scenario: XID 79 on GPU 3, XID 13 twice on GPU 1.
func TestXIDScenario(t *testing.T) {
	sc := scenario(t, `
node: {count: 8}
faults:
  - {at: 10s, gpu: 3, xid: 79}
  - {at: 12s, gpu: 1, xid: 13, count: 2}
`)
	clk := newClock()
	node, err := simnode.New(sc, simnode.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	src, ok := nvmlsampler.XIDSource(node)
	if !ok {
		t.Fatal("the simulated node has no XID source")
	}
	reader := xid.NewReader(src, nil)
	reader.WaitTimeout = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go reader.Run(ctx)
	s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, Log: zerolog.Nop(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e, err := collector.New(collector.Config{Interval: 5 * time.Second, Log: zerolog.Nop(), Now: clk.Now, XID: reader}, s)
	if err != nil {
		t.Fatal(err)
	}
	e.SampleOnce(ctx)
	if got := series(e.Page(), "gpu_xid_errors_total"); len(got) != 0 {
		t.Fatalf("XIDs before any fault: %v", got)
	}
	clk.Advance(20 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for reader.Events() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("reader saw %d events, want 3", reader.Events())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 4; i++ { // the lost GPU needs a few samples to be rediscovered as lost
		e.SampleOnce(ctx)
		clk.Advance(time.Second)
	}
	p := e.Page()
	if v := value(t, p, "gpu_xid_errors_total", `gpu="3"`, `xid="79"`, `category="hardware"`, `action="reboot_node"`); v != "1" {
		t.Errorf("GPU 3 XID 79 = %s, want 1", v)
	}
	if v := value(t, p, "gpu_xid_errors_total", `gpu="1"`, `xid="13"`, `category="application"`, `action="restart_app"`); v != "2" {
		t.Errorf("GPU 1 XID 13 = %s, want 2", v)
	}
	for gpu := 0; gpu < 8; gpu++ {
		want := "1"
		if gpu == 3 {
			want = "0"
		}
		if v := value(t, p, "gpu_up", `gpu="`+string(rune('0'+gpu))+`"`, `gpu_instance=""`); v != want {
			t.Errorf("gpu_up{gpu=%d} = %s, want %s", gpu, v, want)
		}
	}
	if v := value(t, p, "gpu_last_xid_timestamp_seconds", `gpu="1"`); v == "0" {
		t.Error("no last-XID timestamp for GPU 1")
	}
	// Per code: first and last event time, which the rules use for "new in
	// the last hour" (GPU 3 had one XID 79: both equal its device's last XID).
	first := value(t, p, "gpu_xid_first_timestamp_seconds", `gpu="3"`, `xid="79"`, `category="hardware"`, `action="reboot_node"`)
	last := value(t, p, "gpu_xid_last_timestamp_seconds", `gpu="3"`, `xid="79"`, `category="hardware"`, `action="reboot_node"`)
	if dev := value(t, p, "gpu_last_xid_timestamp_seconds", `gpu="3"`); first == "0" || first != last || last != dev {
		t.Errorf("GPU 3 XID 79: first %s, last %s, device's last %s: want one non-zero time", first, last, dev)
	}
	f13, _ := strconv.ParseFloat(value(t, p, "gpu_xid_first_timestamp_seconds", `gpu="1"`, `xid="13"`), 64)
	l13, _ := strconv.ParseFloat(value(t, p, "gpu_xid_last_timestamp_seconds", `gpu="1"`, `xid="13"`), 64)
	if f13 <= 0 || l13 < f13 {
		t.Errorf("GPU 1 XID 13: first %v, last %v", f13, l13)
	}
	if v := value(t, p, "gpu_exporter_collector_up", `collector="xid"`); v != "1" {
		t.Errorf("xid collector up = %s", v)
	}
}
