package collector_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// Boards that are not SXM data-centre parts: an L4 (GDDR, PCIe, no MIG) and
// a board that answers NOT_SUPPORTED for ECC, power and events. The node is
// healthy: every GPU is up, the xid collector is not down (it has nothing to
// watch, and says so), and what the board lacks is absent, not zero.
func TestBoardsWithoutDataCentreFeatures(t *testing.T) {
	for _, tc := range []struct {
		name, scenario string
		events         bool
		absent         []string
		present        []string
	}{
		{"L4", `node: {model: L4-24GB, count: 2}`, true,
			[]string{"gpu_memory_temperature_celsius", "gpu_nvlink_errors_total", "gpu_mig_info"},
			[]string{"gpu_power_watts", "gpu_temperature_celsius", "gpu_ecc_errors_total"}},
		{"L4 without ECC, power and events", `node: {model: L4-24GB, count: 2, unsupported: [ecc, power, events]}`, false,
			[]string{"gpu_memory_temperature_celsius", "gpu_nvlink_errors_total", "gpu_power_watts", "gpu_power_limit_watts", "gpu_ecc_errors_total"},
			[]string{"gpu_temperature_celsius", "gpu_utilization_ratio"}},
		{"H100 without events", `node: {model: H100-SXM5-80GB, count: 1, unsupported: [events]}`, false,
			nil, []string{"gpu_power_watts", "gpu_memory_temperature_celsius"}},
		// A Blackwell workstation-class board (GB202): GDDR7 on PCIe, no
		// NVLink, no memory temperature sensor, MIG.
		{"RTX PRO 6000 Blackwell Server Edition", "node: {model: RTX-PRO-6000-BSE-96GB, count: 2}\ngpus: [{index: 0, mig: [{profile: 2g.48gb+gfx}, {profile: 1g.24gb-me}]}]", true,
			[]string{"gpu_memory_temperature_celsius", "gpu_nvlink_errors_total"},
			[]string{"gpu_power_watts", "gpu_temperature_celsius", "gpu_ecc_errors_total", "gpu_mig_info"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn := newTestExporter(t, withScenario(scenario(t, tc.scenario)), withGroups(fullGroups()),
				withNodeXIDSource(func(n *simnode.Node) xid.EventSource { return n.XIDSource() }))
			e, reader, ctx := tn.e, tn.reader, context.Background()
			deadline := time.Now().Add(5 * time.Second)
			for !reader.Up() && !reader.Unsupported() {
				if time.Now().After(deadline) {
					t.Fatal("the XID reader neither opened a set nor found events unsupported")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if reader.Unsupported() == tc.events {
				t.Fatalf("reader unsupported = %v, want %v", reader.Unsupported(), !tc.events)
			}
			e.SampleOnce(ctx)
			p := e.Page()
			for _, l := range series(p, "gpu_up", `gpu_instance=""`) {
				if l[len(l)-2:] != " 1" {
					t.Errorf("GPU not up on a healthy board: %s", l)
				}
			}
			if len(series(p, "gpu_up")) == 0 {
				t.Fatal("no gpu_up series")
			}
			if v := value(t, p, "gpu_exporter_collector_up", `collector="xid"`); v != "1" {
				t.Errorf(`gpu_exporter_collector_up{collector="xid"} = %s, want 1`, v)
			}
			want := "0"
			if tc.events {
				want = "1"
			}
			if v := value(t, p, "gpu_exporter_xid_events_supported"); v != want {
				t.Errorf("gpu_exporter_xid_events_supported = %s, want %s", v, want)
			}
			// Nothing to listen to is not "not listening": the alert on
			// unregistered GPUs must stay silent on such a board.
			if v := value(t, p, "gpu_exporter_xid_unregistered_gpus"); v != "0" {
				t.Errorf("gpu_exporter_xid_unregistered_gpus = %s on a healthy board, want 0", v)
			}
			for _, f := range tc.absent {
				if got := series(p, f); len(got) != 0 {
					t.Errorf("%s served on a board without it: %v", f, got)
				}
			}
			if strings.Contains(tc.scenario, "L4-24GB") || strings.Contains(tc.scenario, "RTX-PRO") {
				for _, l := range series(p, "gpu_nvlink_active_links") {
					if l[len(l)-2:] != " 0" {
						t.Errorf("a PCIe board has active NVLinks: %s", l)
					}
				}
			}
			for _, f := range tc.present {
				if got := series(p, f); len(got) == 0 {
					t.Errorf("%s missing", f)
				}
			}
		})
	}
}
