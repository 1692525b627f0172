package main

import (
	"fmt"
	stdlog "log"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// probeMaxConnections bounds the probe listener: the kubelet opens one or two.
const probeMaxConnections = 16

// maxStreamsPerConn bounds the HTTP/2 streams one connection may have open
// (Go's default is 250): a scraper uses one at a time, and every stream is a
// handler that a client which stops reading can keep waiting.
const maxStreamsPerConn = 8

// writeStall is the longest one write of a response may wait for the client
// to read: a client that stops reading (a full TCP window, an HTTP/2 stream
// held at window 0) loses its connection or stream then, not at the
// server's WriteTimeout.
const writeStall = 5 * time.Second

// writeTimeout bounds the whole response, however its writes went.
const writeTimeout = 30 * time.Second

// writeChunk is how much of a response one write hands over, each with a
// fresh writeStall deadline: a slow but moving client is served to the end.
const writeChunk = 32 << 10

// newHTTPServer is a server with bounded timeouts and headers; its own
// error lines (TLS handshake failures, which any client can cause at will)
// go to the debug log. h should refuse what cannot be served first
// (refuseUnservable).
func newHTTPServer(h http.Handler, log zerolog.Logger) *http.Server {
	return &http.Server{
		ErrorLog:          stdlog.New(newServerErrorLog(log.With().Str("component", "http").Logger()), "", 0),
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         trackConnState,
		ConnContext:       withConn,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxStreamsPerConn},
	}
}

// Server error lines: at most serverErrorRate a second (burst
// serverErrorBurst), each cut to maxLogLine bytes.
const (
	serverErrorRate  = 5
	serverErrorBurst = 20
	maxLogLine       = 512
)

// serverErrorLog takes net/http's own error lines (TLS handshakes that
// fail, connections closed mid-request: any client can cause them at will)
// to the debug level, rate-limited, with the number of lines left out since
// the last one written. (A zerolog.Logger used as the writer itself writes
// at no level, which every log level lets through.)
type serverErrorLog struct {
	log     zerolog.Logger
	limit   *rate.Limiter
	dropped atomic.Int64
}

func newServerErrorLog(log zerolog.Logger) *serverErrorLog {
	return &serverErrorLog{log: log, limit: rate.NewLimiter(serverErrorRate, serverErrorBurst)}
}

func (l *serverErrorLog) Write(p []byte) (int, error) {
	if l.log.GetLevel() > zerolog.DebugLevel {
		return len(p), nil
	}
	if !l.limit.Allow() {
		l.dropped.Add(1)
		return len(p), nil
	}
	line := strings.TrimSpace(string(p[:min(len(p), maxLogLine)]))
	e := l.log.Debug()
	if n := l.dropped.Swap(0); n > 0 {
		e = e.Int64("lines_left_out", n)
	}
	e.Msg(line)
	return len(p), nil
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
// page, no profiler, so it needs no secret; and no request body, so no
// client can hold the kubelet's port by sending one slowly.
func newProbeMux(exp *collector.Exporter) http.Handler {
	mux := http.NewServeMux()
	addHealth(mux, exp)
	return refuseUnservable(mux)
}

// pprofPrefix is the one path that takes other methods than GET and HEAD
// (pprof's symbol lookup reads a POST body); it is served only with
// --web.enable-pprof.
const pprofPrefix = "/debug/pprof/"

// refuseUnservable answers at once, before any slot, login or handler, a
// request that no endpoint serves: a method other than GET and HEAD (405,
// with Allow), or a request with a body (413). A body is never read: the
// connection is closed after the answer, so a client sending it slowly
// holds neither a scrape slot nor a connection that cannot be evicted
// (net/http would otherwise drain up to 256 KiB of it, up to the read timeout).
func refuseUnservable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, pprofPrefix) {
			next.ServeHTTP(w, r)
			return
		}
		hasBody := r.ContentLength != 0 // -1: chunked, or HTTP/2 without a length
		code, msg := 0, ""
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			code, msg = http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: this endpoint answers GET and HEAD"
		case hasBody:
			code, msg = http.StatusRequestEntityTooLarge, "this endpoint takes no request body"
		default:
			next.ServeHTTP(w, r)
			return
		}
		if hasBody {
			w.Header().Set("Connection", "close")
			// The body is not wanted: reading it must end now, not after
			// the client has sent it.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
		http.Error(w, msg, code)
	})
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
	return refuseUnservable(mux)
}

// limitConcurrency answers 503 at once past limit scrapes being prepared,
// rather than queueing them: a scrape is cheap, so a pile-up means a
// misbehaving client. A scrape holds its slot until it starts writing its
// (pre-rendered) page: how fast the client reads is the connection's
// business, bounded by writeStall, and a client that stops reading cannot
// keep a slot from the scraper. A request whose client has gone (an HTTP/2
// stream reset at once) takes no slot.
func limitConcurrency(h http.Handler, limit int) http.Handler {
	if limit <= 0 {
		return h
	}
	sem := make(chan struct{}, limit)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Err() != nil {
			return
		}
		select {
		case sem <- struct{}{}:
			sw := &slotWriter{ResponseWriter: w, rc: http.NewResponseController(w), release: func() { <-sem },
				end: time.Now().Add(writeTimeout)}
			defer sw.done()
			h.ServeHTTP(sw, r)
		default:
			http.Error(w, "too many concurrent scrapes; raise --web.max-requests", http.StatusServiceUnavailable)
		}
	})
}

// slotWriter gives its scrape slot back at the first write, and writes in
// chunks, each with a writeStall deadline.
type slotWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	release  func()
	released bool
	end      time.Time // no write deadline goes past this (the server's WriteTimeout)
	deadline bool      // a write deadline was set
}

func (s *slotWriter) done() {
	if !s.released {
		s.released = true
		s.release()
	}
	if s.deadline {
		s.setDeadline() // the last buffered bytes are flushed after the handler
	}
}

// setDeadline gives the next write writeStall, never past the response's end.
func (s *slotWriter) setDeadline() {
	d := time.Now().Add(writeStall)
	if d.After(s.end) {
		d = s.end
	}
	if s.rc.SetWriteDeadline(d) == nil {
		s.deadline = true
	}
}

func (s *slotWriter) Write(b []byte) (int, error) {
	if !s.released {
		s.released = true
		s.release()
	}
	n := 0
	for len(b) > 0 {
		c := b[:min(len(b), writeChunk)]
		s.setDeadline()
		m, err := s.ResponseWriter.Write(c)
		n += m
		if err != nil {
			return n, err
		}
		b = b[len(c):]
	}
	return n, nil
}

// Unwrap lets http.ResponseController reach the connection.
func (s *slotWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

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
