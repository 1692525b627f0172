package collector

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/expfmt"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// MinInterval is the shortest --collect-interval: NVML's busy-time counters
// are averaged over about a second, faster sampling only costs CPU.
const MinInterval = time.Second

// Config configures an Exporter.
type Config struct {
	Interval time.Duration
	// StaleAfter is how old a device's last good read may be before /readyz
	// fails; 0 means three intervals.
	StaleAfter time.Duration
	Log        zerolog.Logger
	// RuntimeMetrics adds the exporter's own go_ and process_ metrics.
	RuntimeMetrics bool
	// Now replaces time.Now in tests.
	Now func() time.Time
	// Pods, when set, maps devices to the pods holding them.
	Pods PodSource
	// XID, when set, counts XID events (its Run is the caller's to start).
	XID *xid.Reader
	// DCGM, when set, adds DCGM's profiling fields and health watches.
	DCGM DCGMSource
	// Derived configures idle allocations, prices and fragmentation; the
	// zero value uses the defaults.
	Derived DerivedConfig
	// Groups are the metric groups served; nil serves the default profile.
	Groups GroupSet
	// Compat, when set, also serves dcgm-exporter's default families under
	// its names, from the same sample and in the same render.
	Compat *CompatConfig
	// Processes, when set, maps the processes NVML lists to containers:
	// per-container use of shared devices.
	Processes *procs.Resolver
	// Status names the exporter on the landing page.
	Status StatusInfo
	// NVMLRestartAfter is how long NVML may stay unusable (nvmlInit not
	// returning or failing, the driver gone) before /healthz fails, so that
	// the kubelet restarts the pod; 0 never fails it.
	NVMLRestartAfter time.Duration
}

// StatusInfo is what the landing page says about the exporter itself.
type StatusInfo struct {
	Version   string
	Node      string
	Simulated bool
}

// CollectorStatus is the health of one part of the exporter in one sample.
type CollectorStatus struct {
	Name     string
	Up       bool
	Duration time.Duration
}

// State is everything one render shows.
type State struct {
	Sample      *sample.NodeSample
	Allocations *Allocations
	XIDs        []xid.Count
	XIDLast     []xid.DeviceLast
	// XIDOn: an XID reader runs (XIDUp: its set works). XIDCoverage says
	// which GPUs are registered for events (nil where the source cannot
	// tell); XIDUncoveredSeconds is how long no event set was open.
	XIDOn, XIDUp        bool
	XIDCoverage         []xid.Coverage
	XIDUncoveredSeconds float64
	// XIDInstances are the XIDs NVML attributed to MIG instances.
	XIDInstances []xid.InstanceCount
	// XIDEventsSupported is nil without an XID reader; false when the
	// node's boards do not support NVML events (nothing to watch: the xid
	// collector is then not applicable rather than down).
	XIDEventsSupported *bool
	// ECCEvents are the ECC error events per GPU, by sample GPU position.
	ECCEvents [][2]uint64
	// ECCUncorrectedGrew lists the GPUs whose uncorrected ECC count grew
	// while the exporter ran.
	ECCUncorrectedGrew []ECCIncrease
	Derived            *Derived
	// Usage is per-container use from process accounting; nil when off.
	Usage      *Usage
	Collectors []CollectorStatus
	// LastGood is, per GPU, the time of its last successful read.
	LastGood []time.Time
	// LastAnswer is, per GPU, the time NVML last answered at all (a lost
	// GPU answers with an error; a hung one does not answer).
	LastAnswer []time.Time
	Rendered   time.Time
	// compatHolders are the holders each device's compatibility series are
	// labelled with.
	compatHolders map[DeviceKey][]Holder
	// compatLost are the label values of the last series of each GPU (by
	// index) that does not answer.
	compatLost map[int][][]string
}

// Page is a rendered exposition, served as is to every scrape until the next
// sample replaces it.
type Page struct {
	Plain []byte
	Gzip  []byte
	Time  time.Time
	// Content-Length header values, made once per render.
	plainLen, gzipLen []string
	// State is what the page shows, for the landing page.
	State *State
	// StatusHTML and StatusJSON are the landing page and /status.json,
	// rendered with the metrics.
	StatusHTML, StatusJSON []byte
}

// Exporter samples in the background and keeps the rendered page.
type Exporter struct {
	cfg     Config
	sampler *nvmlsampler.Sampler
	reg     *prometheus.Registry
	page    atomic.Pointer[Page]

	renderMu  sync.Mutex // one render at a time; guards cur and lastGood
	cur       *State
	lastGood  []time.Time
	lastAns   []time.Time
	gz        *gzip.Writer
	unmatched *podmap.UnmatchedLogger
	idle      *fragmentation.IdleTracker
	counters  *monotonic   // under renderMu
	summary   *nodeSummary // under renderMu
	ecc       eccWatch     // under renderMu
	renderErr atomic.Pointer[renderResult]
	// procsWarned: the proc-root warning was logged (under renderMu).
	procsWarned bool
	// procRootDown: the proc root could not be read at the last sample
	// (under renderMu).
	procRootDown bool
	compat       *compatRenderer
	// gpuByUUID maps the physical GPUs' UUIDs to their NVML indexes, as of
	// the last sample: the XIDs DCGM hands over are placed by UUID, as
	// DCGM's own GPU numbering need not be NVML's.
	gpuByUUID atomic.Pointer[map[string]int]
}

type renderResult struct{ err error }

// New builds an exporter over a sampler.
func New(cfg Config, sampler *nvmlsampler.Sampler) (*Exporter, error) {
	if cfg.Interval < MinInterval {
		return nil, fmt.Errorf("collect interval %s is below the minimum of %s", cfg.Interval, MinInterval)
	}
	if cfg.StaleAfter == 0 {
		cfg.StaleAfter = 3 * cfg.Interval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Derived.Idle.Threshold == 0 {
		cfg.Derived.Idle.Threshold = fragmentation.DefaultIdleThreshold
	}
	if cfg.Derived.Idle.Window == 0 {
		cfg.Derived.Idle.Window = fragmentation.DefaultIdleWindow
	}
	if cfg.Derived.Shapes == nil {
		cfg.Derived.Shapes = fragmentation.DefaultShapes
	}
	idle, err := fragmentation.NewIdleTracker(cfg.Derived.Idle)
	if err != nil {
		return nil, err
	}
	e := &Exporter{cfg: cfg, sampler: sampler, reg: prometheus.NewRegistry(),
		unmatched: podmap.NewUnmatchedLogger(cfg.Log, 0), idle: idle, counters: newMonotonic(),
		summary: newNodeSummary()}
	e.unmatched.Now = cfg.Now
	e.gz, _ = gzip.NewWriterLevel(nil, gzip.BestSpeed)
	if err := e.reg.Register(versioncollector.NewCollector("gpu_exporter")); err != nil {
		return nil, err
	}
	if cfg.RuntimeMetrics && cfg.Groups.On(GroupGo) {
		e.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorMemStatsMetricsDisabled()))
	}
	if cfg.RuntimeMetrics && cfg.Groups.On(GroupProcess) {
		e.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if cfg.Compat != nil {
		if l := cfg.Compat.HostnameLabel; l != "" && !slices.Contains(HostnameLabels, l) {
			return nil, fmt.Errorf("dcgm-exporter host name label %q: want one of %v", l, HostnameLabels)
		}
		e.compat = newCompatRenderer(*cfg.Compat)
	}
	if sink, ok := cfg.DCGM.(XIDSink); ok && cfg.XID != nil {
		counter := cfg.XID.Counter()
		sink.SetXIDSink(func(gpu int, uuid string, code int, at time.Time) {
			if m := e.gpuByUUID.Load(); m != nil && uuid != "" {
				if i, ok := (*m)[uuid]; ok {
					gpu = i
				}
			}
			counter.AddFrom(xid.SourceDCGM, gpu, uuid, code, at)
		})
	}
	e.reg.MustRegister(stateCollector{e})
	return e, nil
}

// noteGPUIndexes updates gpuByUUID when the sample's GPUs differ from it.
func (e *Exporter) noteGPUIndexes(s *sample.NodeSample) {
	if m := e.gpuByUUID.Load(); m != nil {
		same := true
		for i := range s.GPUs {
			if g := &s.GPUs[i]; g.UUID != "" {
				if idx, ok := (*m)[g.UUID]; !ok || idx != g.GPU {
					same = false
					break
				}
			}
		}
		if same {
			return
		}
	}
	m := make(map[string]int, len(s.GPUs))
	for i := range s.GPUs {
		if g := &s.GPUs[i]; g.UUID != "" {
			m[g.UUID] = g.GPU
		}
	}
	e.gpuByUUID.Store(&m)
}

// Registry is where the rendered metrics come from; tests gather from it.
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// Page returns the latest rendered page, or nil before the first sample.
func (e *Exporter) Page() *Page { return e.page.Load() }

// Run samples every interval until ctx is done.
func (e *Exporter) Run(ctx context.Context) {
	t := time.NewTicker(e.cfg.Interval)
	defer t.Stop()
	for {
		e.SampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleOnce takes one sample and publishes a new page.
func (e *Exporter) SampleOnce(ctx context.Context) {
	s := e.sampler.Sample(ctx)
	now := e.cfg.Now()
	e.renderMu.Lock()
	defer e.renderMu.Unlock()
	if len(e.lastGood) != len(s.GPUs) {
		e.lastGood = make([]time.Time, len(s.GPUs))
		e.lastAns = make([]time.Time, len(s.GPUs))
	}
	e.noteGPUIndexes(s)
	for i, g := range s.GPUs {
		if g.Up {
			e.lastGood[i] = s.Time
		}
		if !g.Hung {
			e.lastAns[i] = s.Time
		}
	}
	st := &State{
		Sample:      s,
		Collectors:  []CollectorStatus{{Name: "nvml", Up: anyUp(s) && s.NVML.Down == "", Duration: s.Duration}},
		LastGood:    append([]time.Time(nil), e.lastGood...),
		LastAnswer:  append([]time.Time(nil), e.lastAns...),
		Rendered:    now,
		Allocations: &Allocations{},
	}
	st.ECCUncorrectedGrew = e.ecc.observe(s)
	if e.cfg.DCGM != nil {
		snap := e.cfg.DCGM.Snapshot()
		mergeDCGM(snap, s)
		if cs, ok := dcgmStatus(snap, now); ok {
			st.Collectors = append(st.Collectors, cs)
		}
	}
	if e.cfg.Pods != nil {
		st.Allocations = resolveAllocations(e.cfg.Pods.Snapshot(), s, now, e.unmatched)
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "podmap", Up: st.Allocations.Up, Duration: st.Allocations.Duration})
	}
	if e.cfg.Processes != nil {
		st.Usage = attributeProcesses(ctx, e.cfg.Processes, s, st.Allocations)
		// Every PID missing is a proc root that is not the host's, not
		// processes that happened to exit: say so once.
		lost := st.Usage.RootErr == "" && st.Usage.PIDs > 0 && st.Usage.NotFound == st.Usage.PIDs
		if lost && !e.procsWarned {
			e.cfg.Log.Warn().Int("pids", st.Usage.PIDs).Msg("none of the PIDs NVML reports is in the proc root: mount the host's /proc (read-only hostPath) and pass --procs.proc-root; until then every GPU process counts as outside pods")
		}
		e.procsWarned = lost
		switch unreadable := st.Usage.RootErr != ""; {
		case unreadable && !e.procRootDown:
			e.cfg.Log.Error().Str("error", st.Usage.RootErr).Msg("process accounting is down: the proc root cannot be read, so no per-container or outside-pods figures are served until it can (check the --procs.proc-root mount)")
		case !unreadable && e.procRootDown:
			e.cfg.Log.Info().Msg("process accounting is back: the proc root can be read again")
		}
		e.procRootDown = st.Usage.RootErr != ""
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "processes", Up: st.Usage.IdentityErr == "" && st.Usage.RootErr == "", Duration: st.Usage.Duration})
	}
	st.Derived = computeDerived(&e.cfg.Derived, e.idle, s, st.Allocations, st.Usage, s.Time)
	if r := e.cfg.XID; r != nil {
		st.XIDs = r.Counter().Snapshot()
		st.XIDLast = r.Counter().LastPerDevice()
		st.XIDInstances = r.InstanceCounts()
		st.ECCEvents = make([][2]uint64, len(s.GPUs))
		for i, g := range s.GPUs {
			st.ECCEvents[i][0], st.ECCEvents[i][1] = r.ECCEvents(g.GPU)
		}
		supported := !r.Unsupported()
		st.XIDEventsSupported = &supported
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "xid", Up: r.Up() || !supported})
		st.XIDOn, st.XIDUp = true, r.Up()
		st.XIDCoverage = r.Coverage()
		st.XIDUncoveredSeconds = r.UncoveredSeconds()
	}
	if e.compat != nil {
		e.compat.update(st)
	}
	err := e.render(st)
	if err != nil {
		e.cfg.Log.Error().Err(err).Msg("rendering metrics failed; serving the previous page")
	}
	e.renderErr.Store(&renderResult{err})
}

func anyUp(s *sample.NodeSample) bool {
	if len(s.GPUs) == 0 {
		return true // a node without GPUs is a valid, if dull, node
	}
	for _, g := range s.GPUs {
		if g.Up {
			return true
		}
	}
	return false
}

// render gathers the registry once and stores plain and gzip bytes.
func (e *Exporter) render(st *State) error {
	e.cur = st
	mfs, err := e.reg.Gather()
	if err != nil {
		return err
	}
	if reset := e.counters.apply(mfs, st.Rendered); len(reset) > 0 {
		e.cfg.Log.Info().Strs("metrics", reset).Msg("counters went down at the source (GPU reset, driver reload or reconnect); served values go on from where they were")
	}
	if e.cfg.Groups.On(GroupNodeSummary) {
		// After the monotonic layer: each GPU's counter is already
		// protected from resets when it is summed.
		mfs = e.summary.fold(mfs)
	}
	var buf bytes.Buffer
	buf.Grow(sizeHint(e.page.Load()))
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return err
		}
	}
	var zbuf bytes.Buffer
	e.gz.Reset(&zbuf)
	if _, err := e.gz.Write(buf.Bytes()); err != nil {
		return err
	}
	if err := e.gz.Close(); err != nil {
		return err
	}
	var html, js bytes.Buffer
	view := buildStatus(st, e.cfg.Status, e.cfg.Pods != nil, e.cfg.Processes != nil)
	if err := view.HTML(&html); err != nil {
		return err
	}
	if err := view.JSON(&js); err != nil {
		return err
	}
	e.page.Store(&Page{Plain: buf.Bytes(), Gzip: zbuf.Bytes(), Time: st.Rendered, State: st,
		plainLen: []string{strconv.Itoa(buf.Len())}, gzipLen: []string{strconv.Itoa(zbuf.Len())},
		StatusHTML: html.Bytes(), StatusJSON: js.Bytes()})
	return nil
}

func sizeHint(p *Page) int {
	if p == nil {
		return 16 << 10
	}
	return len(p.Plain) + len(p.Plain)/8
}

// Ready reports whether a fresh sample exists: one taken within StaleAfter
// in which every GPU answered NVML within StaleAfter. A lost GPU answers
// (with an error) and is reported by gpu_up; a hung one makes samples stale.
func (e *Exporter) Ready() (bool, string) {
	p := e.page.Load()
	if p == nil {
		return false, "no sample yet"
	}
	if r := e.renderErr.Load(); r != nil && r.err != nil {
		return false, "the last render failed, serving an older page: " + r.err.Error()
	}
	if d := p.State.Sample.NVML.Down; d != "" {
		return false, "NVML is not usable: " + d
	}
	now := e.cfg.Now()
	if age := now.Sub(p.State.Sample.Time); age > e.cfg.StaleAfter {
		return false, fmt.Sprintf("last sample is %s old (stale after %s)", age.Round(time.Millisecond), e.cfg.StaleAfter)
	}
	for i, t := range p.State.LastAnswer {
		if age := now.Sub(t); age > e.cfg.StaleAfter {
			return false, fmt.Sprintf("GPU %d has not answered for %s (stale after %s)", i, age.Round(time.Second), e.cfg.StaleAfter)
		}
	}
	return true, "ok"
}

// Alive reports whether the process is of any use: false once NVML has been
// unusable for longer than NVMLRestartAfter, so that the liveness probe
// (/healthz) fails and the kubelet restarts the pod. It reads the
// sampler's state, not the page.
func (e *Exporter) Alive() (bool, string) {
	st := e.sampler.Status()
	if st.Down == "" || e.cfg.NVMLRestartAfter <= 0 || st.DownSince.IsZero() {
		return true, "ok"
	}
	if d := e.cfg.Now().Sub(st.DownSince); d > e.cfg.NVMLRestartAfter {
		return false, fmt.Sprintf("NVML has been unusable for %s (restart after %s): %s", d.Round(time.Second), e.cfg.NVMLRestartAfter, st.Down)
	}
	return true, "ok"
}

// Header values shared by every response; net/http only reads them.
var (
	contentType  = []string{string(expfmt.NewFormat(expfmt.TypeTextPlain))}
	varyEncoding = []string{"Accept-Encoding"}
	gzipEncoding = []string{"gzip"}
	allowGetHead = []string{"GET, HEAD"}
)

// ServeHTTP serves the cached page: no NVML, DCGM or kubelet call happens here.
//
// Every Accept header gets the text format (version 0.0.4): OpenMetrics would
// add nothing the page needs (no exemplars, no created timestamps) for a second
// rendering per sample, and Prometheus 2 and 3 both list text/plain in their
// Accept header and parse the answer by its Content-Type.
func (e *Exporter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header()["Allow"] = allowGetHead
		http.Error(w, "method "+r.Method+" not allowed: /metrics answers GET and HEAD", http.StatusMethodNotAllowed)
		return
	}
	p := e.page.Load()
	if p == nil {
		http.Error(w, "no sample yet: the first sample is being taken", http.StatusServiceUnavailable)
		return
	}
	h := w.Header()
	h["Content-Type"] = contentType
	h["Vary"] = varyEncoding
	body, length := p.Plain, p.plainLen
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		h["Content-Encoding"] = gzipEncoding
		body, length = p.Gzip, p.gzipLen
	}
	h["Content-Length"] = length
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// acceptsGzip reads Accept-Encoding without allocating; "gzip;q=0" refuses.
func acceptsGzip(ae string) bool {
	for ae != "" {
		var part string
		part, ae, _ = strings.Cut(ae, ",")
		enc, params, _ := strings.Cut(part, ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		q := strings.TrimSpace(params)
		if v, ok := strings.CutPrefix(q, "q="); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && f > 0
		}
		return true
	}
	return false
}
