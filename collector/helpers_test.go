package collector_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakedcgm"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// This file holds the package's one way to build an exporter over a
// simulated node (newTestExporter and its options), the presets the tests
// use most, and the waits on state that go with them.

// fixedClock starts at a fixed instant and moves only when told. Hung NVML
// calls read it from their own goroutines, hence the lock.
type fixedClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fixedClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *fixedClock {
	return &fixedClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
}

// fullGroups serves every metric group: these tests check values, the
// budget test (budget_test.go) checks what each profile serves.
func fullGroups() render.GroupSet {
	g, err := render.ProfileGroups(render.ProfileFull)
	if err != nil {
		panic(err)
	}
	return g
}

// testNode is an exporter over a simulated node, with whichever of a fake
// kubelet, a DCGM sampler, an XID reader and a process resolver the options
// asked for. podNode and dcgmNode are its older names.
type testNode struct {
	e      *collector.Exporter
	node   *simnode.Node
	clk    *fixedClock // nil on real time
	kube   *fakekubelet.Server
	client *podmap.Client
	ds     *dcgm.Sampler
	fake   *fakedcgm.Fake
	reader *xid.Reader
	procs  *procs.Resolver
}

type (
	podNode  = testNode
	dcgmNode = testNode
)

// exporterOptions is what newTestExporter builds; the zero value plus a
// fresh fixed clock is a plain exporter of the default scenario.
type exporterOptions struct {
	sc        *simnode.Scenario
	node      *simnode.Node
	clk       *fixedClock
	realTime  bool
	hostDir   bool
	wrap      func(nvmlsampler.NVML) nvmlsampler.NVML
	sysfs     bool
	kubelet   bool
	podsWall  bool
	dcgm      bool
	dcgmOpen  func(dcgm.Config) (dcgm.Client, error)
	dcgmSetup []func(*fakedcgm.Fake, *simnode.Node)
	dcgmCfg   []func(*dcgm.Config)
	xidSource func(*simnode.Node) xid.EventSource
	xidTweak  []func(*xid.Reader)
	procs     bool
	resolver  *procs.Resolver
	log       zerolog.Logger
	cfg       []func(*collector.Config)
	samplerFn []func(*nvmlsampler.SamplerConfig)
}

type exporterOption func(*exporterOptions)

// withScenario simulates sc instead of the default node.
func withScenario(sc *simnode.Scenario) exporterOption {
	return func(o *exporterOptions) { o.sc = sc }
}

// withNode samples an existing node (shared with another exporter); the
// caller owns it and its clock.
func withNode(n *simnode.Node) exporterOption {
	return func(o *exporterOptions) { o.node = n }
}

// withClock puts node, sampler, exporter and pod map on clk.
func withClock(clk *fixedClock) exporterOption {
	return func(o *exporterOptions) { o.clk = clk }
}

// withRealTime runs everything on the wall clock with a 1s interval: DCGM's
// staleness rules use its own timestamps.
func withRealTime() exporterOption {
	return func(o *exporterOptions) { o.realTime = true }
}

// withHostDir gives the node a generated /proc and /var/log/containers.
func withHostDir() exporterOption {
	return func(o *exporterOptions) { o.hostDir = true }
}

// withNVML wraps the node's NVML (fault injection); nil is no wrapper.
func withNVML(wrap func(nvmlsampler.NVML) nvmlsampler.NVML) exporterOption {
	return func(o *exporterOptions) { o.wrap = wrap }
}

// withSysfs writes the node's sysfs tree and points the sampler at it.
func withSysfs() exporterOption {
	return func(o *exporterOptions) { o.sysfs = true }
}

// withKubelet serves the node's pods from a fake kubelet over a unix socket
// to a real podmap client, which has not refreshed yet.
func withKubelet() exporterOption {
	return func(o *exporterOptions) { o.kubelet = true }
}

// withPodMapOnWallClock stamps pod snapshots with the wall clock even when
// the node runs on a fixed clock.
func withPodMapOnWallClock() exporterOption {
	return func(o *exporterOptions) { o.podsWall = true }
}

// withDCGM runs a DCGM sampler (embedded, 20ms interval) over open, or the
// node's fake host engine when open is nil; setup runs on the fake before
// the sampler's first read.
func withDCGM(open func(dcgm.Config) (dcgm.Client, error), setup ...func(*fakedcgm.Fake, *simnode.Node)) exporterOption {
	return func(o *exporterOptions) { o.dcgm, o.dcgmOpen, o.dcgmSetup = true, open, setup }
}

// withDCGMConfig changes the DCGM sampler's configuration.
func withDCGMConfig(f func(*dcgm.Config)) exporterOption {
	return func(o *exporterOptions) { o.dcgmCfg = append(o.dcgmCfg, f) }
}

// withDCGMSource feeds the exporter from src instead of a DCGM sampler.
func withDCGMSource(src state.DCGMSource) exporterOption {
	return withConfig(func(c *collector.Config) { c.DCGM = src })
}

// withXIDSource runs an XID reader of src (20ms waits) for the exporter;
// tweak adjusts it before it starts.
func withXIDSource(src xid.EventSource, tweak ...func(*xid.Reader)) exporterOption {
	return withNodeXIDSource(func(*simnode.Node) xid.EventSource { return src }, tweak...)
}

// withNodeXIDSource is withXIDSource for a source made from the node.
func withNodeXIDSource(src func(*simnode.Node) xid.EventSource, tweak ...func(*xid.Reader)) exporterOption {
	return func(o *exporterOptions) { o.xidSource, o.xidTweak = src, tweak }
}

// withXIDCounter counts XIDs with r, whose Run is the caller's to start.
func withXIDCounter(r *xid.Reader) exporterOption {
	return withConfig(func(c *collector.Config) { c.XID = r })
}

// withGroups serves the groups g (default: the zero set).
func withGroups(g render.GroupSet) exporterOption {
	return withConfig(func(c *collector.Config) { c.Groups = g })
}

// withDerived sets the derived gauges' configuration.
func withDerived(dc state.DerivedConfig) exporterOption {
	return withConfig(func(c *collector.Config) { c.Derived = dc })
}

// withConfig changes the exporter's configuration last.
func withConfig(f func(*collector.Config)) exporterOption {
	return func(o *exporterOptions) { o.cfg = append(o.cfg, f) }
}

// withSamplerConfig changes the NVML sampler's configuration last.
func withSamplerConfig(f func(*nvmlsampler.SamplerConfig)) exporterOption {
	return func(o *exporterOptions) { o.samplerFn = append(o.samplerFn, f) }
}

// newTestExporter assembles an exporter over a simulated node with
// collector.Assemble, as the binary does. Without options: the default
// scenario on a fresh fixed clock, 5s interval, 1s device timeout, no pods,
// DCGM or XIDs. Nothing runs in the background but the DCGM sampler and the
// XID reader the options ask for; the test samples. Everything it starts
// stops at cleanup.
func newTestExporter(t testing.TB, opts ...exporterOption) *testNode {
	t.Helper()
	o := exporterOptions{log: zerolog.Nop()}
	for _, f := range opts {
		f(&o)
	}
	tn := &testNode{}
	var now func() time.Time
	if !o.realTime {
		if o.clk == nil {
			o.clk = newClock()
		}
		tn.clk, now = o.clk, o.clk.Now
	}
	tn.node = o.node
	if tn.node == nil {
		var nopts []simnode.Option
		if now != nil {
			nopts = append(nopts, simnode.WithClock(now))
		}
		if o.hostDir {
			nopts = append(nopts, simnode.WithHostDir(t.TempDir()))
		}
		node, err := simnode.New(o.sc, nopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(node.Close)
		tn.node = node
	}
	src := collector.Sources{NVML: tn.node}
	if o.wrap != nil {
		src.NVML = o.wrap(tn.node)
	}
	cfg := collector.NodeConfig{Log: o.log, Now: now,
		Exporter: collector.Config{Interval: 5 * time.Second},
		Sampler:  nvmlsampler.SamplerConfig{DeviceTimeout: time.Second}}
	if o.realTime {
		cfg.Exporter.Interval = time.Second
	}
	if o.kubelet {
		// Not t.TempDir: a unix socket path must stay under ~100 bytes.
		dir, err := os.MkdirTemp("", "gpe")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		tn.kube = startKubelet(t, dir, tn.node)
		src.KubeletSocket = tn.kube.Socket()
		cfg.Kubelet = &podmap.Config{RefreshInterval: time.Hour, CallTimeout: 2 * time.Second, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
		if o.podsWall {
			cfg.Kubelet.Now = time.Now
		}
	}
	if o.dcgm {
		tn.fake = tn.node.DCGM()
		for _, f := range o.dcgmSetup {
			f(tn.fake, tn.node)
		}
		src.OpenDCGM = o.dcgmOpen
		if src.OpenDCGM == nil {
			src.OpenDCGM = tn.fake.Open
		}
		cfg.DCGM = &dcgm.Config{Mode: dcgm.ModeEmbedded, Interval: 20 * time.Millisecond, MaxMissed: 3, MaxBackoff: 50 * time.Millisecond}
		for _, f := range o.dcgmCfg {
			f(cfg.DCGM)
		}
	}
	if o.xidSource != nil {
		src.XIDEvents = o.xidSource(tn.node)
		cfg.XID, cfg.XIDWaitTimeout = true, 20*time.Millisecond
	}
	if o.procs {
		src.Processes = o.resolver
		if src.Processes == nil {
			r, err := sim.HostResolver(tn.node, now)
			if err != nil {
				t.Fatal(err)
			}
			src.Processes = r
		}
	}
	if o.sysfs {
		src.Sysfs = t.TempDir()
		if err := tn.node.WriteSysfs(src.Sysfs); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range o.samplerFn {
		f(&cfg.Sampler)
	}
	for _, f := range o.cfg {
		f(&cfg.Exporter)
	}
	n, err := collector.Assemble(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	tn.e, tn.client, tn.ds, tn.reader, tn.procs = n.Exporter, n.Pods, n.DCGM, n.XID, src.Processes
	ctx, cancel := context.WithCancel(context.Background())
	if tn.ds != nil {
		done := make(chan struct{})
		go func() { defer close(done); tn.ds.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	if tn.reader != nil {
		for _, f := range o.xidTweak {
			f(tn.reader)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = tn.reader.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Error("the XID reader did not stop within 5s")
			}
		})
	}
	t.Cleanup(cancel)
	return tn
}

// withLog gives every part of the exporter this log (default: none).
func withLog(l zerolog.Logger) exporterOption {
	return func(o *exporterOptions) { o.log = l }
}

// newExporter is the plain exporter: the node of sc on clk with its sysfs
// tree, every group served, NVML wrapped by wrap when it is not nil.
func newExporter(t testing.TB, sc *simnode.Scenario, clk *fixedClock, wrap func(nvmlsampler.NVML) nvmlsampler.NVML) (*collector.Exporter, *simnode.Node) {
	t.Helper()
	tn := newTestExporter(t, withScenario(sc), withClock(clk), withNVML(wrap), withSysfs(), withGroups(fullGroups()))
	return tn.e, tn.node
}

// newPodNode is the node of sc on a fixed clock with its fake kubelet and a
// real podmap client talking gRPC over a unix socket.
func newPodNode(t testing.TB, sc *simnode.Scenario) *podNode {
	t.Helper()
	return newTestExporter(t, withScenario(sc), withKubelet())
}

// newDerivedNode is a pod node with its sysfs tree, every group served and
// the derived config dc.
func newDerivedNode(t *testing.T, sc *simnode.Scenario, dc state.DerivedConfig) *podNode {
	t.Helper()
	return newTestExporter(t, withScenario(sc), withKubelet(), withSysfs(), withGroups(fullGroups()), withDerived(dc))
}

// newProcNode is a pod node with per-process accounting over the simulated
// host's generated /proc and /var/log/containers, and a one-minute idle window.
func newProcNode(t testing.TB, sc *simnode.Scenario) (*podNode, *procs.Resolver) {
	t.Helper()
	pn := newTestExporter(t, withScenario(sc), withHostDir(), withKubelet(), withProcessResolver(nil),
		withDerived(state.DerivedConfig{Idle: fragmentation.IdleConfig{Threshold: 0.05, Window: time.Minute}}))
	return pn, pn.procs
}

// withProcessResolver turns on per-process accounting, resolved by r, or when
// r is nil by a resolver over the node's generated host (which needs
// withHostDir).
func withProcessResolver(r *procs.Resolver) exporterOption {
	return func(o *exporterOptions) { o.procs, o.resolver = true, r }
}

// newDCGMNode is the default node on real time with its fake DCGM host
// engine behind open (nil: the fake itself), XIDs counted by counter when it
// is not nil, and every group served.
func newDCGMNode(t *testing.T, open func(dcgm.Config) (dcgm.Client, error), counter *xid.Reader, setup ...func(*fakedcgm.Fake, *simnode.Node)) *dcgmNode {
	t.Helper()
	opts := []exporterOption{withRealTime(), withDCGM(open, setup...), withGroups(fullGroups())}
	if counter != nil {
		opts = append(opts, withXIDCounter(counter))
	}
	return newTestExporter(t, opts...)
}

// startKubelet serves node's pods from a fake kubelet in dir.
func startKubelet(t testing.TB, dir string, node *simnode.Node) *fakekubelet.Server {
	t.Helper()
	kube := fakekubelet.New(filepath.Join(dir, "kubelet.sock"))
	kube.SetPods(node.KubeletPods())
	kube.SetAllocatable(node.KubeletAllocatable())
	if err := kube.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	return kube
}

// step moves the scenario clock, updates the fake kubelet, refreshes the
// client and takes a sample.
func (p *testNode) step(t testing.TB, d time.Duration) *collector.Page {
	t.Helper()
	p.clk.Advance(d)
	p.kube.SetPods(p.node.KubeletPods())
	p.kube.SetAllocatable(p.node.KubeletAllocatable())
	_ = p.client.Refresh(context.Background())
	p.e.SampleOnce(context.Background())
	return p.e.Page()
}

// until samples until cond holds on the page.
func (p *testNode) until(t testing.TB, what string, cond func(p *collector.Page) bool) *collector.Page {
	t.Helper()
	var page *collector.Page
	waitFor(t, what, func() bool {
		p.e.SampleOnce(context.Background())
		page = p.e.Page()
		return cond(page)
	})
	return page
}

// waitXIDEvents waits until the XID reader has seen n events.
func (p *testNode) waitXIDEvents(t testing.TB, n uint64) {
	t.Helper()
	waitFor(t, "the XID reader to see the events", func() bool { return p.reader.Events() >= n })
}

// waitTimeout bounds every wait on a state: generous, as the machine is
// shared; a wait that passes returns as soon as the state holds.
const waitTimeout = 10 * time.Second

// describe is a wait's description, worded when the wait fails.
type describe func() string

func (d describe) String() string { return d() }

// waitFor polls cond until it holds, failing the test after waitTimeout;
// what says what it waits for (a string, or a describe).
func waitFor(t testing.TB, what any, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %v", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
