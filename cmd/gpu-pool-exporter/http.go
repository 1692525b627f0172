package main

import (
	"fmt"
	stdlog "log"
	"net/http"
	"net/http/pprof"
	"time"

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
		landing(w, exp)
	})
	mux.HandleFunc(statusPath, func(w http.ResponseWriter, _ *http.Request) { statusJSON(w, exp) })
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

// statusJSON serves the landing page's table as JSON, for `gpu-pool-exporter status`.
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
