package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/config"
)

// promFlags are the flags of the subcommands that read Prometheus' query
// API through client_golang's v1 client, with fleet's names and meaning.
type promFlags struct {
	url       string
	tokenFile string
	timeout   time.Duration
	insecure  bool
}

// addPromFlags registers --prometheus, --prometheus.bearer-token-file,
// --timeout and --tls.insecure-skip-verify.
func addPromFlags(app *kingpin.Application, f *promFlags, defaultTimeout string) {
	app.Flag("prometheus", "Base URL of the Prometheus query API: Prometheus, Thanos Query, GMP's frontend (http[s]://host:port[/prefix]).").Required().StringVar(&f.url)
	app.Flag("prometheus.bearer-token-file", "File holding a bearer token sent to Prometheus (read on every run).").StringVar(&f.tokenFile)
	app.Flag("timeout", "How long to wait for Prometheus, all queries together.").Default(defaultTimeout).DurationVar(&f.timeout)
	app.Flag("tls.insecure-skip-verify", "Do not verify Prometheus' TLS certificate.").BoolVar(&f.insecure)
}

// client builds the v1 API client. Its errors are the user's (exit 2): a
// URL that is not one, a token file that cannot be read or is empty.
func (f *promFlags) client() (v1.API, error) {
	u, err := url.Parse(f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--prometheus=%s: want a URL such as http://prometheus:9090 (or Thanos Query's, or GMP frontend's)", f.url)
	}
	cfg := config.HTTPClientConfig{TLSConfig: config.TLSConfig{InsecureSkipVerify: f.insecure}} //nolint:gosec // the user asked for it
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--prometheus.bearer-token-file: %w", err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("--prometheus.bearer-token-file=%s is empty", f.tokenFile)
		}
		cfg.Authorization = &config.Authorization{Type: "Bearer", Credentials: config.Secret(token)}
	}
	rt, err := config.NewRoundTripperFromConfig(cfg, "gpu-pool-exporter")
	if err != nil {
		return nil, fmt.Errorf("--prometheus=%s: %w", f.url, err)
	}
	c, err := api.NewClient(api.Config{Address: strings.TrimSuffix(f.url, "/"), RoundTripper: rt})
	if err != nil {
		return nil, fmt.Errorf("--prometheus=%s: %w", f.url, err)
	}
	return v1.NewAPI(c), nil
}

// explain turns an error of a query into what the user can act on: where
// Prometheus did not answer, a token it refused, a URL that is not its API.
func (f *promFlags) explain(ctx context.Context, err error) error {
	where := f.url
	if u, perr := url.Parse(f.url); perr == nil {
		where = u.Redacted()
	}
	var apiErr *v1.Error
	var netErr net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer from Prometheus at %s within --timeout=%s (%v): raise --timeout, or shorten the window", where, f.timeout, err)
	case errors.As(err, &apiErr) && (strings.Contains(apiErr.Msg, ": 401") || strings.Contains(apiErr.Msg, ": 403")):
		return fmt.Errorf("%s refused the query (%s): pass a token with --prometheus.bearer-token-file", where, apiErr.Msg)
	case errors.As(err, &apiErr) && apiErr.Type == v1.ErrClient && strings.Contains(apiErr.Msg, ": 404"):
		return fmt.Errorf("%s answered 404, not Prometheus' query API (is --prometheus the API's base URL, without /api/v1?)", where)
	case errors.As(err, &apiErr) && apiErr.Type == v1.ErrBadResponse:
		return fmt.Errorf("%s did not answer as Prometheus' query API does (is --prometheus the API's base URL?): %v", where, err)
	case errors.As(err, &apiErr):
		return fmt.Errorf("Prometheus at %s: %v", where, err) //nolint:staticcheck // Prometheus is a name
	case errors.As(err, &netErr) || strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "no such host"):
		return fmt.Errorf("cannot reach Prometheus at %s: %v (check --prometheus)", where, err)
	}
	return err
}
