package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"

	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// listeners are the sockets the exporter serves on, held from before NVML
// starts: a port in use fails at once, and with :0 the port actually served
// is known for the start-up log.
type listeners struct {
	web   []net.Listener
	probe net.Listener // nil without --web.probe-address
}

func listenAll(o *options) (*listeners, error) {
	web, err := listen(*o.web.WebListenAddresses)
	if err != nil {
		return nil, err
	}
	ls := &listeners{web: web}
	if o.probeAddress != "" {
		if ls.probe, err = net.Listen("tcp", o.probeAddress); err != nil {
			ls.close()
			return nil, fmt.Errorf("cannot listen on --web.probe-address=%s: %v", o.probeAddress, err)
		}
	}
	return ls, nil
}

// close frees the ports on an early return; after serving it does nothing.
func (ls *listeners) close() {
	for _, l := range ls.web {
		l.Close()
	}
	if ls.probe != nil {
		ls.probe.Close()
	}
}

func listen(addrs []string) ([]net.Listener, error) {
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				_, port, _ := net.SplitHostPort(a)
				return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: port %s is already in use by another process "+
					"(which would answer your requests instead); choose a free port with --web.listen-address, e.g. --web.listen-address=:%s", a, port, otherPort(port))
			}
			return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// otherPort suggests the next port up, for the port-in-use message.
func otherPort(port string) string {
	if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65535 {
		return strconv.Itoa(n + 1)
	}
	return "9948"
}

// serve runs the exporter's servers until ctx is done (a clean shutdown,
// exitOK) or a server fails (exitError). stop cancels the exporter's parts,
// which the caller waits for.
func serve(ctx context.Context, stop context.CancelFunc, o *options, exp *collector.Exporter, ls *listeners, log zerolog.Logger) int {
	for i, l := range ls.web {
		ls.web[i] = newLimitListener(l, o.maxConnections)
	}
	srv := newHTTPServer(newMux(exp, o), log)

	serveErr := make(chan error, 2)
	go func() { serveErr <- serveWeb(ls.web, srv, *o.web.WebConfigFile, o.hup, log) }()
	scheme := webScheme(*o.web.WebConfigFile)
	for _, l := range ls.web {
		u := servedURL(scheme, l.Addr())
		// The message stays "serving /metrics" (scripts wait for it); url is
		// what a user opens, shown in console format too.
		log.Info().Str("address", l.Addr().String()).Str("url", u).Int("max_connections", o.maxConnections).Msg("serving /metrics")
	}
	probeSrv := newHTTPServer(newProbeMux(exp), log)
	if ls.probe != nil {
		go func() { serveErr <- probeSrv.Serve(newLimitListener(ls.probe, probeMaxConnections)) }()
		log.Info().Str("address", ls.probe.Addr().String()).Msg("serving /healthz and /readyz for probes (no TLS, no auth)")
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-serveErr:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("HTTP server failed")
			stop()
			return exitError
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer scancel()
	_ = srv.Shutdown(sctx)
	_ = probeSrv.Shutdown(sctx)
	stop()
	return exitOK
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

// webScheme is https when the web config turns TLS on. The file has been
// validated by then; a read failure here just means http.
func webScheme(webConfigFile string) string {
	if webConfigFile == "" {
		return "http"
	}
	b, err := os.ReadFile(webConfigFile)
	if err != nil {
		return "http"
	}
	var c struct {
		TLS struct {
			Cert     string `yaml:"cert"`
			CertFile string `yaml:"cert_file"`
		} `yaml:"tls_server_config"`
	}
	if yaml.Unmarshal(b, &c) == nil && (c.TLS.Cert != "" || c.TLS.CertFile != "") {
		return "https"
	}
	return "http"
}
