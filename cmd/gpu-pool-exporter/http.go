package main

import (
	"fmt"
	"html/template"
	stdlog "log"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// probeMaxConnections bounds the probe listener: the kubelet opens one or two.
const probeMaxConnections = 16

// newHTTPServer is a server with bounded timeouts and headers; its own
// error lines (TLS handshake failures, which any client can cause at will)
// go to the debug log.
func newHTTPServer(h http.Handler, log zerolog.Logger) *http.Server {
	return &http.Server{
		ErrorLog:          stdlog.New(log.With().Str("component", "http").Logger().Level(zerolog.DebugLevel), "", 0),
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         trackConnState,
	}
}

// addHealth adds /healthz (alive) and /readyz (a fresh sample exists).
func addHealth(mux *http.ServeMux, exp *collector.Exporter) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ok, why := exp.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	})
}

// newProbeMux serves the health endpoints alone: no metrics, no landing
// page, no profiler, so it needs no secret.
func newProbeMux(exp *collector.Exporter) http.Handler {
	mux := http.NewServeMux()
	addHealth(mux, exp)
	return mux
}

// newMux routes the exporter's endpoints.
func newMux(exp *collector.Exporter, o *options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", limitConcurrency(exp, o.maxRequests))
	addHealth(mux, exp)
	if o.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		landing(w, exp, o)
	})
	return mux
}

// limitConcurrency answers 503 at once past max scrapes in flight, rather
// than queueing them: a scrape is cheap, so a pile-up means a misbehaving client.
func limitConcurrency(h http.Handler, max int) http.Handler {
	if max <= 0 {
		return h
	}
	sem := make(chan struct{}, max)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			h.ServeHTTP(w, r)
		default:
			http.Error(w, "too many concurrent scrapes; raise --web.max-requests", http.StatusServiceUnavailable)
		}
	})
}

var landingTmpl = template.Must(template.New("landing").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>gpu-pool-exporter</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}.down{color:#b00}</style>
</head><body>
<h1>gpu-pool-exporter</h1>
<p>Version {{.Version}}{{if .Node}} on node <b>{{.Node}}</b>{{end}}{{if .Simulated}} &mdash; <b>simulated GPU node</b>{{end}}.</p>
<ul>
<li><a href="metrics">/metrics</a> (rendered once per sample, served from cache)</li>
<li><a href="healthz">/healthz</a> (alive)</li>
<li><a href="readyz">/readyz</a> (a fresh sample exists): {{.Ready}}</li>
</ul>
{{if .Driver}}<p>Driver {{.Driver.DriverVersion}}, CUDA {{.Driver.CUDADriverVersion}}, NVML {{.Driver.NVMLVersion}}. Last sample {{.SampleTime}}.</p>{{end}}
<table><tr><th>GPU</th><th>Model</th><th>UUID</th><th>Device</th><th>Up</th><th>Util</th><th>Memory used</th><th>MIG</th></tr>
{{range .Rows}}<tr{{if not .Up}} class="down"{{end}}><td>{{.GPU}}</td><td>{{.Model}}</td><td>{{.UUID}}</td><td>{{.Device}}</td><td>{{if .Up}}yes{{else}}no{{end}}</td><td>{{.Util}}</td><td>{{.Mem}}</td><td>{{.MIG}}</td></tr>
{{else}}<tr><td colspan="8">no sample yet</td></tr>{{end}}
</table></body></html>
`))

type landingRow struct {
	GPU, Model, UUID, Device, Util, Mem, MIG string
	Up                                       bool
}

func landing(w http.ResponseWriter, exp *collector.Exporter, o *options) {
	data := struct {
		Version, Node, Ready, SampleTime string
		Simulated                        bool
		Driver                           *collector.DriverInfo
		Rows                             []landingRow
	}{Version: version.Version, Node: o.nodeName, Simulated: o.simulate}
	_, data.Ready = exp.Ready()
	if p := exp.Page(); p != nil {
		s := p.State.Sample
		data.Driver = &s.Driver
		data.SampleTime = s.Time.UTC().Format("2006-01-02 15:04:05 MST")
		for _, g := range s.GPUs {
			row := landingRow{GPU: strconv.Itoa(g.GPU), Model: g.Model, UUID: g.UUID, Up: g.Up, Util: "-", Mem: "-"}
			if g.Minor >= 0 {
				row.Device = "nvidia" + strconv.Itoa(g.Minor)
			}
			if u, ok := g.Values.Get(collector.FieldUtilization); ok {
				row.Util = fmt.Sprintf("%.0f%%", u*100)
			}
			used, ok1 := g.Values.Get(collector.FieldMemoryUsed)
			total, ok2 := g.Values.Get(collector.FieldMemoryTotal)
			if ok1 && ok2 {
				row.Mem = fmt.Sprintf("%.1f / %.1f GiB", used/(1<<30), total/(1<<30))
			}
			for i, m := range g.MIG {
				if i > 0 {
					row.MIG += ", "
				}
				row.MIG += m.MIGProfile
			}
			data.Rows = append(data.Rows, row)
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = landingTmpl.Execute(w, data)
}
