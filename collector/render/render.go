package render

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	versioncollector "github.com/prometheus/client_golang/prometheus/collectors/version"
	"github.com/prometheus/common/expfmt"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
)

// Config says what a Renderer serves.
type Config struct {
	Log zerolog.Logger
	// Groups are the metric groups served; nil serves the default profile.
	Groups GroupSet
	// Compat, when set, also serves dcgm-exporter's default families under
	// its names, from the same state and in the same render.
	Compat *CompatConfig
	// RuntimeMetrics adds the exporter's own go_ and process_ metrics.
	RuntimeMetrics bool
	// Status names the exporter on the landing page.
	Status StatusInfo
	// PodMap and Processes say whether the pod map and process accounting
	// are configured: the landing page tells "off" from "down".
	PodMap, Processes bool
}

// Page is one state rendered: the exposition (plain and gzip), the landing
// page and /status.json.
type Page struct {
	Plain, Gzip            []byte
	StatusHTML, StatusJSON []byte
}

// Renderer renders states into pages, one at a time. It keeps what spans
// renders: the counters' offsets, the node_summary folds and the holders
// the dcgm-exporter series are labelled with.
type Renderer struct {
	cfg       Config
	reg       *prometheus.Registry
	collector *stateCollector
	gz        *gzip.Writer
	counters  *monotonic
	summary   *nodeSummary
	compat    *compatRenderer
	// lastSize is the plain size of the last page, to size the next one.
	lastSize int
}

// New builds a Renderer and its registry.
func New(cfg Config) (*Renderer, error) {
	r := &Renderer{cfg: cfg, reg: prometheus.NewRegistry(), counters: newMonotonic(), summary: newNodeSummary()}
	r.gz, _ = gzip.NewWriterLevel(nil, gzip.BestSpeed)
	if err := r.reg.Register(versioncollector.NewCollector("gpu_exporter")); err != nil {
		return nil, err
	}
	if cfg.RuntimeMetrics && cfg.Groups.On(GroupGo) {
		r.reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorMemStatsMetricsDisabled()))
	}
	if cfg.RuntimeMetrics && cfg.Groups.On(GroupProcess) {
		r.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if cfg.Compat != nil {
		if l := cfg.Compat.HostnameLabel; l != "" && !slices.Contains(HostnameLabels, l) {
			return nil, fmt.Errorf("dcgm-exporter host name label %q: want one of %v", l, HostnameLabels)
		}
		c, err := newCompatRenderer(*cfg.Compat, cfg.Log)
		if err != nil {
			return nil, err
		}
		r.compat = c
	}
	r.collector = &stateCollector{groups: cfg.Groups, compat: r.compat}
	r.reg.MustRegister(r.collector)
	return r, nil
}

// Registry is where the rendered metrics come from: it serves the state of
// the last Render.
func (r *Renderer) Registry() *prometheus.Registry { return r.reg }

// Render gathers the registry once over st and encodes the page. The
// counters are kept from falling first, then folded (node_summary).
func (r *Renderer) Render(st *state.State) (*Page, error) {
	if r.compat != nil {
		r.compat.update(st)
	}
	r.collector.cur = st
	mfs, err := r.reg.Gather()
	if err != nil {
		return nil, err
	}
	if reset := r.counters.apply(mfs, st.Rendered); len(reset) > 0 {
		r.cfg.Log.Info().Strs("metrics", reset).Msg("counters went down at the source (GPU reset, driver reload or reconnect); served values go on from where they were")
	}
	if r.cfg.Groups.On(GroupNodeSummary) {
		// After the monotonic layer: each GPU's counter is already
		// protected from resets when it is summed.
		mfs = r.summary.fold(mfs)
	}
	var buf bytes.Buffer
	buf.Grow(r.sizeHint())
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	var zbuf bytes.Buffer
	r.gz.Reset(&zbuf)
	if _, err := r.gz.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	if err := r.gz.Close(); err != nil {
		return nil, err
	}
	var html, js bytes.Buffer
	view := buildStatus(st, r.cfg.Status, r.cfg.PodMap, r.cfg.Processes)
	if err := view.HTML(&html); err != nil {
		return nil, err
	}
	if err := view.JSON(&js); err != nil {
		return nil, err
	}
	r.lastSize = buf.Len()
	return &Page{Plain: buf.Bytes(), Gzip: zbuf.Bytes(), StatusHTML: html.Bytes(), StatusJSON: js.Bytes()}, nil
}

func (r *Renderer) sizeHint() int {
	if r.lastSize == 0 {
		return 16 << 10
	}
	return r.lastSize + r.lastSize/8
}

// stateCollector turns the last rendered State into metrics. It is
// unchecked (no Describe) because the label sets follow the node.
type stateCollector struct {
	cur    *state.State
	groups GroupSet
	compat *compatRenderer
}

func (*stateCollector) Describe(chan<- *prometheus.Desc) {}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.cur
	if st == nil {
		return
	}
	filtered := make(chan prometheus.Metric, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range filtered {
			if g, ok := descGroups[m.Desc()]; !ok || c.groups.On(g) {
				ch <- m
			}
		}
	}()
	collectState(st, c.groups, filtered)
	if c.compat != nil {
		c.compat.collect(st, filtered)
	}
	close(filtered)
	<-done
}
