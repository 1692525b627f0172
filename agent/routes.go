package agent

import (
	"fmt"
	"net/http"
	"net/http/pprof"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

// addHealth adds /healthz (alive) and /readyz (a fresh sample exists).
func addHealth(mux *http.ServeMux, exp *collector.Exporter) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ok, why := exp.Alive()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
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

// pprofPrefix is the one path that takes other methods than GET and HEAD
// (pprof's symbol lookup reads a POST body); it is served only with
// --web.enable-pprof.
const pprofPrefix = "/debug/pprof/"

// newMux routes the exporter's endpoints.
func newMux(exp *collector.Exporter, c *Config) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", server.LimitScrapes(exp, c.MaxRequests))
	addHealth(mux, exp)
	if c.Pprof {
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
		landing(w, exp)
	})
	mux.HandleFunc(status.Path, func(w http.ResponseWriter, _ *http.Request) { statusJSON(w, exp) })
	return mux
}

// landing serves the page rendered with the last sample: no work per request.
func landing(w http.ResponseWriter, exp *collector.Exporter) {
	p := exp.Page()
	if p == nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "no sample yet: the first sample is being taken", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(p.StatusHTML)
}

// statusJSON serves the landing page's table as JSON, for `gpupool status`.
func statusJSON(w http.ResponseWriter, exp *collector.Exporter) {
	p := exp.Page()
	if p == nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "no sample yet: the first sample is being taken", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(p.StatusJSON)
}
