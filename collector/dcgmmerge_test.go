package collector_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

func TestDCGMProfilingPerGPUAndMIG(t *testing.T) {
	d := newDCGMNode(t, nil, nil)
	p := d.until(t, "DCGM values", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	for _, m := range []string{"gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_tensor_active_ratio", "gpu_dram_active_ratio"} {
		if n := len(series(p, m, `gpu_instance=""`)); n != 8 {
			t.Errorf("%s: %d whole-GPU series, want 8", m, n)
		}
		for _, gi := range []string{"0", "1", "2", "3"} {
			if n := len(series(p, m, `gpu="7"`, `gpu_instance="`+gi+`"`)); n != 1 {
				t.Errorf("%s: MIG instance %s has %d series, want 1", m, gi, n)
			}
		}
	}
	// NVML's fields keep their source: one series each, NVML's values.
	if n := len(series(p, "gpu_utilization_ratio")); n != 7 {
		t.Errorf("gpu_utilization_ratio: %d series, want 7 (NVML, not MIG)", n)
	}
	if v := value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`); v != "1" {
		t.Errorf("dcgm up = %s", v)
	}
	if n := len(series(p, "gpu_dcgm_health_status", `gpu="0"`)); n != len(dcgm.HealthSystems) {
		t.Errorf("%d health systems for GPU 0", n)
	}
}

func TestDCGMSkipsBlankAndUnsupported(t *testing.T) {
	d := newDCGMNode(t, nil, nil, func(f *dcgm.Fake, n *simnode.Node) {
		uuid := n.Devices()[2].UUID()
		f.SetBlank(uuid, -1, dcgm.TensorActive)
		f.SetNotSupported(uuid, -1, dcgm.FP64Active)
	})
	p := d.until(t, "DCGM values", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio", `gpu="2"`)) == 1 })
	if s := series(p, "gpu_tensor_active_ratio", `gpu="2"`, `gpu_instance=""`); len(s) != 0 {
		t.Errorf("blank value exported: %v", s)
	}
	if s := series(p, "gpu_fp64_active_ratio", `gpu="2"`, `gpu_instance=""`); len(s) != 0 {
		t.Errorf("not-supported value exported: %v", s)
	}
	if s := series(p, "gpu_tensor_active_ratio", `gpu="3"`, `gpu_instance=""`); len(s) != 1 {
		t.Errorf("other GPUs lost their tensor values: %v", s)
	}
}

func TestDCGMHostEngineLostAndBack(t *testing.T) {
	d := newDCGMNode(t, nil, nil)
	d.until(t, "DCGM up", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	d.fake.SetLost(true)
	p := d.until(t, "DCGM down", func(p *collector.Page) bool {
		return value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`) == "0"
	})
	if s := series(p, "gpu_sm_active_ratio"); len(s) != 0 {
		t.Errorf("DCGM values served while the host engine is gone: %d series", len(s))
	}
	if n := len(series(p, "gpu_memory_used_bytes")); n != 12 {
		t.Errorf("NVML metrics stopped with DCGM: %d memory series", n)
	}
	d.fake.SetLost(false)
	d.until(t, "DCGM back", func(p *collector.Page) bool {
		return value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`) == "1" && len(series(p, "gpu_sm_active_ratio")) > 0
	})
}

func TestNoLibDCGMFallsBackToNVML(t *testing.T) {
	// The real opener: there is no libdcgm.so.4 on this machine.
	d := newTestExporter(t, withRealTime(), withDCGM(dcgm.DefaultOpen), withDCGMConfig(func(c *dcgm.Config) {
		c.Mode, c.MaxMissed, c.MaxBackoff = dcgm.ModeAuto, 0, 0
	}))
	waitFor(t, "auto mode without libdcgm to settle on off", func() bool {
		return d.ds.Snapshot() != nil && d.ds.Snapshot().Mode == dcgm.ModeOff
	})
	e := d.e
	e.SampleOnce(context.Background())
	p := e.Page()
	if s := series(p, "gpu_exporter_collector_up", `collector="dcgm"`); len(s) != 0 {
		t.Errorf("DCGM off by absence reports a collector status: %v", s)
	}
	if n := len(series(p, "gpu_utilization_ratio")); n != 7 {
		t.Errorf("NVML metrics without DCGM: %d utilisation series", n)
	}
	if strings.Contains(string(p.Plain), "gpu_sm_active_ratio{") {
		t.Error("profiling metrics without DCGM")
	}
}

func TestDCGMXIDNotCountedTwice(t *testing.T) {
	reader := xid.NewReader(nil, nil)
	d := newDCGMNode(t, nil, reader)
	uuid := d.node.Devices()[5].UUID()
	at := time.Now()
	reader.Counter().Add(5, uuid, 48, at) // NVML's event
	d.fake.SetXID(uuid, 48, at)           // DCGM's last-XID field says the same
	d.until(t, "DCGM up", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	for i := 0; i < 5; i++ { // DCGM's field is read again and again
		d.e.SampleOnce(context.Background())
	}
	p := d.e.Page()
	if v := value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`); v != "1" {
		t.Errorf("XID 48 counted %s times, want 1", v)
	}
	d.fake.SetXID(uuid, 48, at.Add(time.Minute)) // a new occurrence only DCGM saw
	d.until(t, "the DCGM-only XID", func(p *collector.Page) bool {
		return value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`) == "2"
	})
}
