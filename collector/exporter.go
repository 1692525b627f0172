package collector

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
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
	Pods state.PodSource
	// PodMeta, when set, gives the holders' pod UIDs and labels (the API
	// server's, from a cache).
	PodMeta state.PodMetaSource
	// PodMapWait bounds how long Run's first sample waits for the pod
	// source's first answer and the pod metadata's first list (each that
	// says, as podmap.Client and podmap.MetaWatcher do, when that came), so
	// that the first page names the holders with all their labels; past it
	// the page is served, and /readyz ready, without them. 0 does not wait.
	PodMapWait time.Duration
	// XID, when set, counts XID events (its Run is the caller's to start).
	XID *xid.Reader
	// Slices, when set, gives the devices of this node's DRA
	// ResourceSlices, whose taints count on the devices they name.
	Slices state.SliceSource
	// OnState, when set, is handed each sample's state once it is joined
	// (the node condition); it must not block.
	OnState func(*state.State)
	// Reporters add their status to each sample's collectors.
	Reporters []state.StatusReporter
	// DCGM, when set, adds DCGM's profiling fields and health watches.
	DCGM state.DCGMSource
	// Derived configures idle allocations, prices and fragmentation; the
	// zero value uses the defaults.
	Derived state.DerivedConfig
	// Groups are the metric groups served; nil serves the default profile.
	Groups render.GroupSet
	// Compat, when set, also serves dcgm-exporter's default families under
	// its names, from the same sample and in the same render.
	Compat *render.CompatConfig
	// Processes, when set, maps the processes NVML lists to containers:
	// per-container use of shared devices.
	Processes *procs.Resolver
	// Status names the exporter on the landing page.
	Status render.StatusInfo
	// NVMLRestartAfter is how long NVML may stay unusable (nvmlInit not
	// returning or failing, the driver gone) before /healthz fails, so that
	// the kubelet restarts the pod; 0 never fails it.
	NVMLRestartAfter time.Duration
}

// Page is a rendered exposition, served as is to every scrape until the next
// sample replaces it.
type Page struct {
	Plain []byte
	Gzip  []byte
	Time  time.Time
	// Content-Length header values, made once per render.
	plainLen, gzipLen []string
	// State is what the page shows.
	State *state.State
	// StatusHTML and StatusJSON are the landing page and /status.json,
	// rendered with the metrics.
	StatusHTML, StatusJSON []byte
}

// Exporter samples in the background and keeps the rendered page: each
// sample is joined into a state (package state), which is rendered into
// the page (package render) that ServeHTTP serves.
type Exporter struct {
	cfg     Config
	sampler *nvmlsampler.Sampler
	join    *state.Joiner
	render  *render.Renderer
	page    atomic.Pointer[Page]

	renderMu  sync.Mutex // one sample joined and rendered at a time
	renderErr atomic.Pointer[renderResult]
	// waitingPodMap: Run waits for the first pod map before its first
	// sample.
	waitingPodMap atomic.Bool
}

// firstPodMap is a pod source that says when its first answer (or failure)
// came.
type firstPodMap interface {
	FirstRefresh() <-chan struct{}
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
	if cfg.Compat != nil && cfg.XID != nil {
		// dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT counts the XIDs of a
		// window: the counter keeps their times that long.
		cfg.XID.Counter().KeepEvents(cmp.Or(cfg.Compat.XIDCountWindow, render.DefaultXIDCountWindow))
	}
	join, err := state.NewJoiner(state.Config{Log: cfg.Log, Now: cfg.Now, Pods: cfg.Pods, PodMeta: cfg.PodMeta, XID: cfg.XID, DCGM: cfg.DCGM,
		Processes: cfg.Processes, Derived: cfg.Derived, Slices: cfg.Slices, Reporters: cfg.Reporters})
	if err != nil {
		return nil, err
	}
	rend, err := render.New(render.Config{Log: cfg.Log, Groups: cfg.Groups, Compat: cfg.Compat, RuntimeMetrics: cfg.RuntimeMetrics,
		Status: cfg.Status, PodMap: cfg.Pods != nil, Processes: cfg.Processes != nil})
	if err != nil {
		return nil, err
	}
	return &Exporter{cfg: cfg, sampler: sampler, join: join, render: rend}, nil
}

// Registry is where the rendered metrics come from; tests gather from it.
func (e *Exporter) Registry() *prometheus.Registry { return e.render.Registry() }

// Page returns the latest rendered page, or nil before the first sample.
func (e *Exporter) Page() *Page { return e.page.Load() }

// Run samples every interval until ctx is done. The first sample waits for
// the first pod map, up to PodMapWait.
func (e *Exporter) Run(ctx context.Context) {
	if !e.waitFirstPodMap(ctx) {
		return
	}
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

// waitFirstPodMap waits, up to PodMapWait, for the pod source's first
// answer and the pod metadata's first list: a first page without them
// would serve every allocated device without its holder (or its pod's
// labels), short-lived series that the next page replaces. It reports false
// when ctx ended first.
func (e *Exporter) waitFirstPodMap(ctx context.Context) bool {
	var firsts []<-chan struct{}
	for _, src := range []any{e.cfg.Pods, e.cfg.PodMeta} {
		if f, ok := src.(firstPodMap); ok {
			firsts = append(firsts, f.FirstRefresh())
		}
	}
	if len(firsts) == 0 || e.cfg.PodMapWait <= 0 {
		return true
	}
	e.waitingPodMap.Store(true)
	defer e.waitingPodMap.Store(false)
	t := time.NewTimer(e.cfg.PodMapWait)
	defer t.Stop()
	for _, first := range firsts {
		select {
		case <-first:
		case <-t.C:
			e.cfg.Log.Warn().Dur("waited", e.cfg.PodMapWait).
				Msg("the kubelet (or the API server, for pod UIDs and labels) has not answered since the start: serving devices without what it gives until it does (the landing page says why)")
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// SampleOnce takes one sample, joins it into a state, renders that and
// publishes the page; a failed render keeps the previous page.
func (e *Exporter) SampleOnce(ctx context.Context) {
	s := e.sampler.Sample(ctx)
	now := e.cfg.Now()
	e.renderMu.Lock()
	defer e.renderMu.Unlock()
	st := e.join.Join(ctx, s, now)
	if e.cfg.OnState != nil {
		e.cfg.OnState(st)
	}
	p, err := e.render.Render(st)
	if err != nil {
		e.cfg.Log.Error().Err(err).Msg("rendering metrics failed; serving the previous page")
	} else {
		e.page.Store(&Page{Plain: p.Plain, Gzip: p.Gzip, Time: st.Rendered, State: st,
			plainLen: []string{strconv.Itoa(len(p.Plain))}, gzipLen: []string{strconv.Itoa(len(p.Gzip))},
			StatusHTML: p.StatusHTML, StatusJSON: p.StatusJSON})
	}
	e.renderErr.Store(&renderResult{err})
}

// Ready reports whether a fresh sample exists: one taken within StaleAfter
// in which every GPU answered NVML within StaleAfter. A lost GPU answers
// (with an error) and is reported by gpu_up; a hung one makes samples stale.
func (e *Exporter) Ready() (bool, string) {
	p := e.page.Load()
	if p == nil {
		if e.waitingPodMap.Load() {
			return false, fmt.Sprintf("waiting for the kubelet's first pod map before the first sample (up to %s)", e.cfg.PodMapWait)
		}
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
