package collector_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// XID 79 on GPU 3 (the GPU falls off the bus), XID 13 twice on GPU 1.
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
	tn := newTestExporter(t, withNode(node), withClock(clk), withXIDSource(src))
	e, ctx := tn.e, context.Background()
	e.SampleOnce(ctx)
	if got := series(e.Page(), "gpu_xid_errors_total"); len(got) != 0 {
		t.Fatalf("XIDs before any fault: %v", got)
	}
	clk.Advance(20 * time.Second)
	tn.waitXIDEvents(t, 3)
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

// xidExporter runs an exporter over node with an XID reader of src.
func xidExporter(t *testing.T, node *simnode.Node, src xid.EventSource, clk *fixedClock, events uint64) *collector.Page {
	t.Helper()
	tn := newTestExporter(t, withNode(node), withClock(clk), withXIDSource(src), withGroups(fullGroups()))
	clk.Advance(20 * time.Second)
	tn.waitXIDEvents(t, events)
	tn.e.SampleOnce(context.Background())
	return tn.e.Page()
}

// An XID NVML attributes to a MIG device (its event
// carries GPU and compute instance IDs) is counted on that instance too.
func TestXIDPerMIGInstance(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
faults:
  - {at: 10s, gpu: 0, mig: 1, xid: 13}
  - {at: 10s, gpu: 0, mig: 2, xid: 43, count: 2}
`)
	clk := newClock()
	node, err := simnode.New(sc, simnode.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	src, _ := nvmlsampler.XIDSource(node)
	p := xidExporter(t, node, src, clk, 3)
	migs := node.Devices()[0].MIG()
	gi13, gi43 := strconv.Itoa(migs[1].GPUInstance()), strconv.Itoa(migs[2].GPUInstance())
	if v := value(t, p, "gpu_mig_xid_errors_total", `gpu_instance="`+gi13+`"`, `compute_instance="1"`, `xid="13"`); v != "1" {
		t.Errorf("XID 13 on GI %s CI 1 = %s, want 1", gi13, v)
	}
	if got := series(p, "gpu_mig_xid_errors_total", `gpu_instance="`+gi13+`"`, `compute_instance="0"`); len(got) != 0 {
		t.Errorf("XID 13 counted on the other compute instance: %v", got)
	}
	if v := value(t, p, "gpu_mig_xid_errors_total", `gpu_instance="`+gi43+`"`, `compute_instance="0"`, `xid="43"`); v != "2" {
		t.Errorf("XID 43 on GI %s = %s, want 2", gi43, v)
	}
	if v := value(t, p, "gpu_xid_errors_total", `gpu="0"`, `xid="13"`); v != "1" {
		t.Errorf("XID 13 on the GPU = %s, want 1", v)
	}
}

// eccSource delivers a fixed list of events once; covered, when set, says
// which GPUs are registered for which event types.
type eccSource struct {
	events  []xid.Event
	covered []xid.Coverage
}

func (s *eccSource) Covered() []xid.Coverage { return s.covered }

func (s *eccSource) Open() (xid.Waiter, error) { return s, nil }
func (s *eccSource) Close() error              { return nil }
func (s *eccSource) Wait(timeout time.Duration) (xid.Event, error) {
	if len(s.events) == 0 {
		time.Sleep(timeout) // a real event set blocks for the timeout when idle; do not spin the reader
		return xid.Event{}, xid.ErrTimeout
	}
	e := s.events[0]
	s.events = s.events[1:]
	return e, nil
}

// ECC events counted by the event reader are exported, for the types each
// GPU is registered for: a GPU with ECC off registers for XIDs only, and
// has no ECC event series rather than a 0 that means nothing.
func TestECCEventsExported(t *testing.T) {
	clk := newClock()
	node, err := simnode.New(scenario(t, "node: {model: H100-SXM5-80GB, count: 3}"), simnode.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	uuid := node.Devices()[1].UUID()
	const ecc = nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError
	src := &eccSource{events: []xid.Event{
		{GPU: 1, UUID: uuid, Type: nvml.EventTypeSingleBitEccError},
		{GPU: 1, UUID: uuid, Type: nvml.EventTypeSingleBitEccError},
		{GPU: 1, UUID: uuid, Type: nvml.EventTypeDoubleBitEccError},
	}, covered: []xid.Coverage{
		{GPU: 0, Registered: true, Types: nvml.EventTypeXidCriticalError | ecc},
		{GPU: 1, Registered: true, Types: nvml.EventTypeXidCriticalError | ecc},
		{GPU: 2, Registered: true, Types: nvml.EventTypeXidCriticalError},
	}}
	p := xidExporter(t, node, src, clk, 3)
	for _, c := range []struct{ gpu, typ, want string }{{"1", "single_bit", "2"}, {"1", "double_bit", "1"}, {"0", "single_bit", "0"}} {
		t.Run("gpu"+c.gpu+"/"+c.typ, func(t *testing.T) {
			if v := value(t, p, "gpu_ecc_error_events_total", `gpu="`+c.gpu+`"`, `type="`+c.typ+`"`); v != c.want {
				t.Errorf("GPU %s %s ECC events = %s, want %s", c.gpu, c.typ, v, c.want)
			}
		})
	}
	if got := series(p, "gpu_ecc_error_events_total", `gpu="2"`); len(got) != 0 {
		t.Errorf("ECC events served for a GPU registered for XIDs only: %v", got)
	}
}

// An XID NVML attributes to a GPU instance but to none of its compute
// instances (the event's compute instance ID is 0xFFFFFFFF) hits every
// holder of the GPU instance: it is counted on each of its compute
// instances, so that every series joins gpu_allocation_info on uuid,
// gpu_instance and compute_instance, and on the GPU once.
func TestXIDOnGPUInstanceJoinsItsHolders(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
pods:
  - {namespace: a, name: p0, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: b, name: p1, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
  - {namespace: c, name: p2, containers: [{name: c, devices: [{gpu: 0, mig: 2}]}]}
`)
	clk := newClock()
	node, err := simnode.New(sc, simnode.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	migs := node.Devices()[0].MIG()
	split, whole := migs[0].GPUInstance(), migs[2].GPUInstance()
	uuid := node.Devices()[0].UUID()
	ev := func(gi, ci int) xid.Event {
		return xid.Event{GPU: 0, UUID: uuid, Type: nvml.EventTypeXidCriticalError, Data: 31,
			Instance: &xid.Instance{GPUInstance: gi, ComputeInstance: ci}}
	}
	src := &eccSource{events: []xid.Event{ev(split, -1), ev(split, 1), ev(whole, -1)}}
	tn := newTestExporter(t, withNode(node), withClock(clk), withKubelet(), withXIDSource(src), withGroups(fullGroups()))
	tn.waitXIDEvents(t, 3)
	p := tn.step(t, time.Second)
	for k, want := range map[[2]int]string{{split, 0}: "1", {split, 1}: "2", {whole, 0}: "1"} {
		gi, ci := `gpu_instance="`+strconv.Itoa(k[0])+`"`, `compute_instance="`+strconv.Itoa(k[1])+`"`
		if v := value(t, p, "gpu_mig_xid_errors_total", gi, ci, `xid="31"`); v != want {
			t.Errorf("XID 31 on %s %s = %s, want %s", gi, ci, v, want)
		}
	}
	if s := series(p, "gpu_mig_xid_errors_total", `compute_instance=""`); len(s) != 0 {
		t.Errorf("an XID of a GPU instance that has compute instances is served without one: %v", s)
	}
	for _, l := range series(p, "gpu_mig_xid_errors_total") {
		lb := parseLabels(l)
		if a := series(p, "gpu_allocation_info", `uuid="`+lb["uuid"]+`"`, `gpu_instance="`+lb["gpu_instance"]+`"`, `compute_instance="`+lb["compute_instance"]+`"`); len(a) != 1 {
			t.Errorf("%s joins %d allocations, want 1", l, len(a))
		}
	}
	if v := value(t, p, "gpu_xid_errors_total", `gpu="0"`, `xid="31"`); v != "3" {
		t.Errorf("XID 31 on the GPU = %s, want 3 (each event once)", v)
	}
}
