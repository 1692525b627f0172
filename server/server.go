package server

import (
	"context"
	"errors"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"
)

// Config is what Serve serves, and how.
type Config struct {
	// Handler serves the web listeners, behind WebConfig's TLS and basic
	// auth.
	Handler http.Handler
	// ProbeHandler serves the probe listener, without TLS or auth.
	ProbeHandler http.Handler
	// WebConfig is --web.config.file, parsed; nil serves plain HTTP to
	// everyone.
	WebConfig *WebConfig
	// MaxConnections caps the open connections of each web listener; 0: no
	// cap.
	MaxConnections int
	// MemoryBudget is what the server may hold for its clients, all
	// listeners together; 0: DefaultMemoryBudget.
	MemoryBudget int64
	// BodyPrefix is the one path prefix whose requests may carry a body or
	// use other methods than GET and HEAD (pprof's); "": none.
	BodyPrefix string
	// ShutdownTimeout is the grace of requests in flight when Serve's
	// context ends.
	ShutdownTimeout time.Duration
	// Reload delivers SIGHUP: the web config is read again.
	Reload <-chan os.Signal
	Log    zerolog.Logger
}

// Serve serves ls until ctx is done (nil) or a server fails (its error).
//
// Each web listener gets an http.Server of its own, served by
// exporter-toolkit's web.Serve: web.ServeMultiple hands one server to
// several web.Serve calls at once, which each wrap and replace its
// Handler and TLSConfig (a data race, and a handler wrapped twice).
func Serve(ctx context.Context, c Config, ls *Listeners) error {
	log := c.Log
	toolkitLog := slog.New(zerolog.NewSlogHandler(log.With().Str("component", "exporter-toolkit").Logger()))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	h := c.Handler
	webFile := "" // exporter-toolkit serves plain HTTP without a file
	var src *webConfigSource
	t := newTracker(c.MemoryBudget)
	if c.WebConfig != nil {
		src = newWebConfigSource(c.WebConfig, log)
		defer src.live.Close()
		a := &authHandler{src: src, auth: newAuthenticator(), next: h}
		t.netLoad = a.auth.networkLoad
		if rl := c.WebConfig.RateLimiterConfig; rl.Interval != 0 {
			a.limiter = rate.NewLimiter(rate.Every(rl.Interval), rl.Burst)
		}
		h = a
		if c.WebConfig.TLS() {
			webFile = src.toolkitPath()
		}
	}
	if src != nil {
		src.onLoad = func(wc *WebConfig) { t.auth.Store(wc.authOn()) }
		src.onLoad(c.WebConfig)
	}
	h = guard(t, refuseUnservable(h, c.BodyPrefix)) // before a login is checked
	if src != nil && webFile == "" {
		// Without TLS, exporter-toolkit is not given the web config (it
		// would serve plain HTTP all the same, but read and parse the file
		// again for every request, twice the CPU of a refused login): the
		// configured headers are set here.
		h = withHeaders(src, h)
	}
	go watchReload(ctx, src, c.Reload, log)
	tls := c.WebConfig != nil && c.WebConfig.TLS()

	type served struct {
		srv *http.Server
		l   net.Listener
		web *web.FlagConfig
	}
	var all []served
	for _, l := range ls.Web {
		all = append(all, served{newHTTPServer(h, log), t.listen(l, c.MaxConnections, tls), &web.FlagConfig{WebConfigFile: &webFile}})
	}
	if ls.Probe != nil {
		// The probe listener has a budget of its own: nothing on the web
		// listeners can take its room, whatever credentials it has.
		pt := newTracker(probeMemoryBudget)
		noFile := ""
		probe := newProbeServer(guard(pt, refuseUnservable(c.ProbeHandler, "")), log)
		pl := pt.listen(ls.Probe, ProbeMaxConnections, false)
		pl.noAuth = true
		all = append(all, served{probe, pl, &web.FlagConfig{WebConfigFile: &noFile}})
	}
	errs := make(chan error, len(all))
	for _, s := range all {
		go func() { errs <- web.Serve(s.l, s.srv, s.web, toolkitLog) }()
	}

	var failed error
	select {
	case <-ctx.Done():
	case err := <-errs:
		if !errors.Is(err, http.ErrServerClosed) {
			failed = err
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer scancel()
	for _, s := range all {
		_ = s.srv.Shutdown(sctx)
	}
	return failed
}

// withHeaders sets the web config's response headers (http_server_config's
// headers, which exporter-toolkit checked) on every answer.
func withHeaders(src *webConfigSource, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range src.get().HTTPConfig.Header {
			w.Header().Set(k, v)
		}
		next.ServeHTTP(w, r)
	})
}

// watchReload reads the web config again at SIGHUP and when the file
// changes, until ctx is done.
func watchReload(ctx context.Context, src *webConfigSource, hup <-chan os.Signal, log zerolog.Logger) {
	if src != nil {
		src.watch(ctx, hup)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info().Msg("SIGHUP received: nothing to reload without --web.config.file")
		}
	}
}

// newHTTPServer is a server with bounded timeouts and headers; its own
// error lines (TLS handshake failures, which any client can cause at will)
// go to the debug log. h should refuse what cannot be served first
// (refuseUnservable).
func newHTTPServer(h http.Handler, log zerolog.Logger) *http.Server {
	return &http.Server{
		ErrorLog:          stdlog.New(newServerErrorLog(log.With().Str("component", "http").Logger()), "", 0),
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      writeTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       withConn,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          maxStreamsPerConn,
			MaxReadFrameSize:              h2MaxReadFrame,
			MaxReceiveBufferPerConnection: h2ConnReceive,
			MaxReceiveBufferPerStream:     h2StreamReceive,
			MaxDecoderHeaderTableSize:     h2HeaderTable,
			MaxEncoderHeaderTableSize:     h2HeaderTable,
		},
		// OPTIONS * reaches the handler, which answers 405 as for every
		// method but GET and HEAD (net/http's own answer is 200).
		DisableGeneralOptionsHandler: true,
	}
}

// newProbeServer is newHTTPServer for the kubelet's probes: one request per
// connection (a client pipelining requests it never reads gets one answer
// and loses the connection), sent whole within probeHeaderTimeout, with
// headers of at most probeMaxHeaderBytes.
func newProbeServer(h http.Handler, log zerolog.Logger) *http.Server {
	s := newHTTPServer(h, log)
	s.ReadHeaderTimeout = probeHeaderTimeout
	s.MaxHeaderBytes = probeMaxHeaderBytes
	s.SetKeepAlivesEnabled(false)
	return s
}
