package agent

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

// serve serves the exporter's endpoints on ls until ctx is done (nil) or a
// server fails (an error: exit 1).
func serve(ctx context.Context, c *Config, exp *collector.Exporter, ls *server.Listeners, hup <-chan os.Signal, log zerolog.Logger) error {
	scheme := "http"
	if c.WebConfig != nil && c.WebConfig.TLS() {
		scheme = "https"
	}
	for _, l := range ls.Web {
		// The message stays "serving /metrics" (scripts wait for it); url is
		// what a user opens, shown in console format too.
		log.Info().Str("address", l.Addr().String()).Str("url", servedURL(scheme, l.Addr())).Int("max_connections", c.MaxConnections).Msg("serving /metrics")
	}
	if ls.Probe != nil {
		log.Info().Str("address", ls.Probe.Addr().String()).Msg("serving /healthz and /readyz for probes (no TLS, no auth)")
	}
	body := ""
	if c.Pprof {
		body = pprofPrefix
	}
	err := server.Serve(ctx, server.Config{
		Handler: newMux(exp, c), ProbeHandler: newProbeMux(exp), WebConfig: c.WebConfig,
		MaxConnections: c.MaxConnections, BodyPrefix: body, ShutdownTimeout: c.ShutdownTimeout, Reload: hup, Log: log,
	}, ls)
	if err != nil {
		log.Error().Err(err).Msg("HTTP server failed")
		return fmt.Errorf("HTTP server failed: %w", err)
	}
	log.Info().Msg("shutting down")
	return nil
}

// servedURL is the URL a user on this machine opens to reach listener addr:
// an unspecified host (":9947") becomes localhost.
func servedURL(scheme string, addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + "://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/"
}
