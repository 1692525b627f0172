package fakenvml_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// The node changes under the running exporter, as the MIG manager, GPU
// resets and driver reloads change it: every change is written to the node
// file while the real binary runs, and the first sample taken after it
// must show it.

// nextSample writes the node and returns the first page sampled after it:
// a sample whose time is past the write started after it, so every NVML
// call it made saw the new node.
func (e *exporter) nextSample(node *fakenvml.Node, path string) map[string]*dto.MetricFamily {
	e.t.Helper()
	writeNode(e.t.(*testing.T), node, path)
	written := float64(time.Now().UnixNano()) / 1e9
	return e.sampleAfter(written)
}

// sampleAfter waits for the first page sampled after the time at (Unix
// seconds).
func (e *exporter) sampleAfter(at float64) map[string]*dto.MetricFamily {
	e.t.Helper()
	return e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_exporter_last_sample_timestamp_seconds", nil) > at
	}, "a sample taken after the change")
}

// GPU instances and compute instances created and destroyed while the
// exporter runs (nvidia-smi mig -cgi without -C, -cci, -dci, -dgi), at the
// default interval and at 1 s: each shows in gpu_mig_free_slices and
// gpu_mig_info in the first sample after it, though no MIG device appears
// or disappears with a GPU instance that has no compute instance.
func TestRealBinaryFollowsMIGLayoutWithinOneSample(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	for _, interval := range []string{"1s", "5s"} {
		t.Run("interval "+interval, func(t *testing.T) {
			t.Parallel()
			node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
			g := &node.GPUs[0]
			if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "node.conf")
			writeNode(t, node, path)
			e := startExporter(t, fakenvml.Full, path, "--collect-interval="+interval)
			gpu0 := map[string]string{"gpu": "0"}
			check := func(f map[string]*dto.MetricFamily, step string, freeSlices float64, migDevices int) {
				t.Helper()
				if v, ok := sample(f, "gpu_mig_free_slices", gpu0); !ok || v != freeSlices {
					t.Errorf("%s: gpu_mig_free_slices = %v (present %v) in the first sample after the change, want %v", step, v, ok, freeSlices)
				}
				want := map[string]bool{}
				for _, d := range g.MIG.Devices {
					want[d.UUID] = true
				}
				got := migUUIDs(f)
				for u := range want {
					if !got[u] {
						t.Errorf("%s: MIG device %s is not on the page", step, u)
					}
				}
				for u := range got {
					if !want[u] {
						t.Errorf("%s: the page names MIG device %s, destroyed before this sample", step, u)
					}
				}
				if len(want) != migDevices {
					t.Fatalf("%s: the fake lists %d MIG devices, the test expects %d", step, len(want), migDevices)
				}
			}
			f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_mig_free_slices"] != nil }, "gpu_mig_free_slices")
			check(f, "at start (a 3g.40gb)", 4, 1)

			// -cgi 1g.10gb without -C: 3 slices left, no MIG device.
			alone, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
			if err != nil {
				t.Fatal(err)
			}
			gi := alone.ID
			check(e.nextSample(node, path), "a GPU instance without compute instances created", 3, 1)

			// -cci in it: its MIG device appears, the slices stay taken.
			if err := g.CreateComputeInstances(gi, 1); err != nil {
				t.Fatal(err)
			}
			check(e.nextSample(node, path), "a compute instance created in it", 3, 2)

			// -dci: the MIG device goes, the GPU instance keeps its slice.
			if err := g.RemoveComputeInstances(gi); err != nil {
				t.Fatal(err)
			}
			check(e.nextSample(node, path), "its compute instance destroyed", 3, 1)

			// -dgi: the slice is free again.
			if err := g.RemoveGPUInstance(gi); err != nil {
				t.Fatal(err)
			}
			check(e.nextSample(node, path), "the GPU instance without compute instances destroyed", 4, 1)

			// -dci, then -dgi 1.5 s later, on the 3g.40gb: the first sample
			// after the -dgi shows every slice free.
			first := g.MIG.GPUInstances[0].ID
			if err := g.RemoveComputeInstances(first); err != nil {
				t.Fatal(err)
			}
			writeNode(t, node, path)
			time.Sleep(1500 * time.Millisecond)
			if err := g.RemoveGPUInstance(first); err != nil {
				t.Fatal(err)
			}
			check(e.nextSample(node, path), "-dci then -dgi 1.5 s apart", 7, 0)
		})
	}
}

// A MIG mode change waiting for a GPU reset (current disabled, pending
// enabled, as nvidia-smi -mig 1 leaves a GPU in use) is on the page as
// gpu_mig_mode_pending with the mode it waits for, is logged once, and
// leaves the page when the reset applied it.
func TestRealBinaryShowsPendingMIGMode(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	gpu0 := map[string]string{"gpu": "0"}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_info"] != nil }, "gpu_info")
	if mf := f["gpu_mig_mode_pending"]; mf != nil && len(mf.GetMetric()) > 0 {
		t.Errorf("gpu_mig_mode_pending served with no change pending: %v", mf.GetMetric())
	}

	node.GPUs[0].MIG.Pending = fakenvml.Ptr(true)
	f = e.nextSample(node, path)
	if v, ok := sample(f, "gpu_mig_mode_pending", map[string]string{"gpu": "0", "uuid": node.GPUs[0].UUID, "mig_mode": "enabled"}); !ok || v != 1 {
		t.Errorf("gpu_mig_mode_pending{gpu=\"0\",mig_mode=\"enabled\"} = %v (present %v) in the first sample after the change, want 1", v, ok)
	}
	if _, ok := sample(f, "gpu_mig_mode_pending", map[string]string{"gpu": "1"}); ok {
		t.Error("gpu_mig_mode_pending served for GPU 1, which has no change pending")
	}
	if _, ok := sample(f, "gpu_info", map[string]string{"gpu": "0", "mig_mode": "disabled"}); !ok {
		t.Error("gpu_info of GPU 0 does not say mig_mode=disabled: the current mode is disabled until the reset")
	}
	// Logged once, however many samples see it.
	e.sampleAfter(value(f, "gpu_exporter_last_sample_timestamp_seconds", nil) + 2)
	if n := strings.Count(e.stderr.String(), "MIG mode change is pending"); n != 1 {
		t.Errorf("the pending MIG mode was logged %d times, want once:\n%s", n, e.stderr.String())
	}

	// The reset applies it: MIG enabled, nothing pending.
	node.GPUs[0].MIG.Enabled, node.GPUs[0].MIG.Pending = true, nil
	f = e.nextSample(node, path)
	if _, ok := sample(f, "gpu_mig_mode_pending", gpu0); ok {
		t.Error("gpu_mig_mode_pending still served after the reset applied the mode")
	}
	if _, ok := sample(f, "gpu_info", map[string]string{"gpu": "0", "mig_mode": "enabled"}); !ok {
		t.Error("gpu_info of GPU 0 does not say mig_mode=enabled after the reset")
	}
	if !strings.Contains(e.stderr.String(), "MIG mode change applied") {
		t.Errorf("no log line that the pending MIG mode was applied:\n%s", e.stderr.String())
	}
}

// registered is a GPU's gpu_xid_events_registered by uuid, -1 without a
// series.
func registered(f map[string]*dto.MetricFamily, uuid string) float64 {
	v, ok := sample(f, "gpu_xid_events_registered", map[string]string{"uuid": uuid})
	if !ok {
		return -1
	}
	return v
}

// A board that falls off the bus and comes back (a reset) is registered
// for events again in the sample that sees it answer, so its XIDs are
// counted again; while it is lost its gpu_xid_events_registered is 0 and
// it counts as unregistered.
func TestRealBinaryRegistersABoardThatReturns(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node, path, _, e := twoRegisteredGPUs(t)
	uuid := node.GPUs[1].UUID
	node.GPUs[1].Lost = true
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_up", map[string]string{"uuid": uuid, "gpu_instance": ""}) == 0 && registered(f, uuid) == 0
	}, "GPU 1 down and not registered")
	if v := value(f, "gpu_exporter_xid_unregistered_gpus", nil); v != 1 {
		t.Errorf("gpu_exporter_xid_unregistered_gpus = %v while GPU 1 is lost, want 1", v)
	}

	node.GPUs[1].Lost = false
	writeNode(t, node, path)
	f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_up", map[string]string{"uuid": uuid, "gpu_instance": ""}) == 1
	}, "GPU 1 answering again")
	// Registered by the next sample: an XID raised now is counted.
	f = e.sampleAfter(value(f, "gpu_exporter_last_sample_timestamp_seconds", nil))
	if v := registered(f, uuid); v != 1 {
		t.Errorf("gpu_xid_events_registered of GPU 1 = %v in the sample after it answers again, want 1", v)
	}
	if v := value(f, "gpu_exporter_xid_unregistered_gpus", nil); v != 0 {
		t.Errorf("gpu_exporter_xid_unregistered_gpus = %v once GPU 1 is back, want 0", v)
	}
	node.Events = []fakenvml.Event{{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 48}}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "uuid": uuid, "xid": "48"}) == 1
	}, "the returned board's XID 48 counted")
}

// A driver reload after which NVML lists one board fewer (the middle one:
// the boards after it move down one index) and then, after the next
// reload, all of them again. The boards are followed by UUID: no board is
// shown twice, every board NVML lists is up at its new index, the missing
// one stays on the page lost (gpu_up 0, not registered for events), and
// XID counts and registrations follow each board to its current index.
func TestRealBinaryFollowsBoardsAcrossReinit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 3, fakenvml.Full)
	all := append([]fakenvml.GPU(nil), node.GPUs...)
	a, b, c := all[0].UUID, all[1].UUID, all[2].UUID
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return registered(f, c) == 1 }, "every board registered")
	node.Events = []fakenvml.Event{{GPU: 2, Type: nvml.EventTypeXidCriticalError, Data: 13}}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "2", "uuid": c, "xid": "13"}) == 1
	}, "XID 13 of the third board counted at index 2")

	// upAt is a board's whole-GPU gpu_up, by uuid and index; -1 without.
	upAt := func(f map[string]*dto.MetricFamily, uuid, gpu string) float64 {
		v, ok := sample(f, "gpu_up", map[string]string{"uuid": uuid, "gpu": gpu, "gpu_instance": ""})
		if !ok {
			return -1
		}
		return v
	}
	// once fails for a board shown more than once in a family of one series
	// per board.
	once := func(f map[string]*dto.MetricFamily, step string) {
		t.Helper()
		for _, fam := range []string{"gpu_info", "gpu_up", "gpu_xid_events_registered"} {
			seen := map[string]int{}
			for _, m := range f[fam].GetMetric() {
				l := labelMap(m)
				if l["gpu_instance"] == "" {
					seen[l["uuid"]]++
				}
			}
			for u, n := range seen {
				if n > 1 {
					t.Errorf("%s: %s shows board %s %d times", step, fam, u, n)
				}
			}
		}
	}

	// Reload with the middle board missing: a at 0, c at 1.
	node.GPUs = []fakenvml.GPU{all[0], all[2]}
	node.Events = nil
	node.DriverGeneration = 1
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_exporter_nvml_inits_total", nil) == 2 && upAt(f, c, "1") == 1 && registered(f, c) == 1
	}, "NVML initialised again, the third board up and registered at index 1")
	once(f, "one board fewer")
	if v := upAt(f, a, "0"); v != 1 {
		t.Errorf("one board fewer: the first board's gpu_up at index 0 = %v, want 1", v)
	}
	if v, ok := sample(f, "gpu_up", map[string]string{"uuid": b, "gpu_instance": ""}); !ok || v != 0 {
		t.Errorf("one board fewer: the missing board's gpu_up = %v (present %v), want 0: it is lost", v, ok)
	}
	if v := registered(f, b); v != 0 {
		t.Errorf("one board fewer: the missing board's gpu_xid_events_registered = %v, want 0", v)
	}
	if v := value(f, "gpu_exporter_xid_unregistered_gpus", nil); v != 1 {
		t.Errorf("one board fewer: gpu_exporter_xid_unregistered_gpus = %v, want 1 (the missing board)", v)
	}
	for _, m := range f["gpu_xid_errors_total"].GetMetric() {
		if l := labelMap(m); l["uuid"] == c && l["gpu"] != "1" {
			t.Errorf("one board fewer: the third board's XID count is served at gpu=%q, want its current index 1", l["gpu"])
		}
	}
	if v := value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "uuid": c, "xid": "13"}); v != 1 {
		t.Errorf("one board fewer: the third board's XID 13 count at index 1 = %v, want 1", v)
	}
	if !strings.Contains(e.stderr.String(), b) || !strings.Contains(e.stderr.String(), "no longer lists") {
		t.Errorf("the log does not say which board NVML no longer lists:\n%s", e.stderr.String())
	}
	node.Events = []fakenvml.Event{{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 13}}
	writeNode(t, node, path)
	f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "uuid": c, "xid": "13"}) == 2
	}, "the third board's second XID 13 counted at index 1")
	once(f, "one board fewer, after an XID")

	// Reload with every board back: b at 1 again, c at 2.
	node.GPUs = all
	node.Events = nil
	node.DriverGeneration = 2
	writeNode(t, node, path)
	f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_exporter_nvml_inits_total", nil) == 3 && upAt(f, b, "1") == 1 && upAt(f, c, "2") == 1 &&
			registered(f, b) == 1 && registered(f, c) == 1
	}, "every board up and registered at its index again")
	once(f, "every board back")
	node.Events = []fakenvml.Event{{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 31}}
	writeNode(t, node, path)
	f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "uuid": b, "xid": "31"}) == 1
	}, "the returned board's XID 31 counted at index 1")
	if v := value(f, "gpu_xid_errors_total", map[string]string{"gpu": "2", "uuid": c, "xid": "13"}); v != 2 {
		t.Errorf("every board back: the third board's XID 13 count at index 2 = %v, want 2", v)
	}
}

// An XID on a MIG device created in the same sample as it (the GPU
// instance destroyed and another created in its place, same GPU and
// compute instance IDs, new UUID, and the tenant's XID at once) is counted
// on the new device, not on the destroyed one that had those IDs.
func TestRealBinaryCountsAnXIDOnAMIGDeviceCreatedInTheSample(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	g := &node.GPUs[0]
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	old := g.MIG.Devices[0]
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return registered(f, g.UUID) == 1 && migUUIDs(f)[old.UUID]
	}, "the GPU registered, its 3g.40gb on the page")

	if err := g.RemoveGPUInstance(old.GPUInstance); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	d := g.MIG.Devices[0]
	if d.GPUInstance != old.GPUInstance || d.ComputeInstance != old.ComputeInstance || d.UUID == old.UUID {
		t.Fatalf("the new instance is GI %d CI %d %s; the test needs the old IDs and a new UUID", d.GPUInstance, d.ComputeInstance, d.UUID)
	}
	node.Events = []fakenvml.Event{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 43,
		GPUInstance: fakenvml.Ptr(uint32(d.GPUInstance)), ComputeInstance: fakenvml.Ptr(uint32(d.ComputeInstance))}}
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "43"}) == 1 && migUUIDs(f)[d.UUID] &&
			f["gpu_mig_xid_errors_total"] != nil
	}, "the XID counted on the GPU and a MIG device, the new 4g.40gb on the page")
	f = e.sampleAfter(value(f, "gpu_exporter_last_sample_timestamp_seconds", nil))
	want := map[string]string{"gpu": "0", "gpu_instance": fmt.Sprint(d.GPUInstance), "compute_instance": fmt.Sprint(d.ComputeInstance),
		"mig_uuid": d.UUID, "xid": "43"}
	if v, ok := sample(f, "gpu_mig_xid_errors_total", want); !ok || v != 1 {
		t.Errorf("gpu_mig_xid_errors_total of the new 4g.40gb = %v (present %v), want 1; served: %v", v, ok, f["gpu_mig_xid_errors_total"].GetMetric())
	}
}

// A node total that misses a GPU's value says so: one GPU's power read
// fails (the driver answers UNKNOWN) and the folded gpu_power_watts
// carries partial="true" with the other GPU's draw, in the first sample
// after; once the read works again the total is whole and unmarked. The
// same holds wherever node_summary folds: the lean profile, and the full
// profile with --collector.node_summary.
func TestRealBinaryMarksPartialNodeTotals(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	for name, args := range map[string][]string{
		"lean":                 {"--collector.profile=lean"},
		"default+node_summary": {"--collector.profile=default", "--collector.node_summary"},
		"full+node_summary":    {"--collector.profile=full", "--collector.node_summary"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
			path := filepath.Join(t.TempDir(), "node.conf")
			writeNode(t, node, path)
			e := startExporter(t, fakenvml.Full, path, args...)
			all := map[string]string{"gpu": "all"}
			partial := func(f map[string]*dto.MetricFamily, fam string) (v float64, marked, ok bool) {
				for _, m := range f[fam].GetMetric() {
					l := labelMap(m)
					if l["gpu"] == "all" {
						return m.GetGauge().GetValue(), l["partial"] == "true", true
					}
				}
				return 0, false, false
			}
			f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return value(f, "gpu_power_watts", all) == 140 }, "the node's power, 2 x 70 W")
			if _, marked, _ := partial(f, "gpu_power_watts"); marked {
				t.Error("gpu_power_watts{gpu=\"all\"} marked partial with every GPU's value in it")
			}

			node.GPUs[1].Returns = map[string]nvml.Return{"nvmlDeviceGetPowerUsage": nvml.ERROR_UNKNOWN}
			f = e.nextSample(node, path)
			if v, marked, ok := partial(f, "gpu_power_watts"); !ok || !marked || v != 70 {
				t.Errorf("one GPU's power read fails: gpu_power_watts{gpu=\"all\"} = %v, partial %v (present %v); want 70, partial=\"true\"", v, marked, ok)
			}
			if _, marked, _ := partial(f, "gpu_power_limit_watts"); marked {
				t.Error("gpu_power_limit_watts{gpu=\"all\"} marked partial, though every GPU's limit was read")
			}

			node.GPUs[1].Returns = nil
			f = e.nextSample(node, path)
			if v, marked, ok := partial(f, "gpu_power_watts"); !ok || marked || v != 140 {
				t.Errorf("the read works again: gpu_power_watts{gpu=\"all\"} = %v, partial %v (present %v); want 140, unmarked", v, marked, ok)
			}

			// A GPU lost from the bus has no value in any folded family.
			node.GPUs[1].Lost = true
			f = e.nextSample(node, path)
			if v, marked, ok := partial(f, "gpu_power_watts"); !ok || !marked || v != 70 {
				t.Errorf("one GPU lost: gpu_power_watts{gpu=\"all\"} = %v, partial %v (present %v); want 70, partial=\"true\"", v, marked, ok)
			}
		})
	}
}
