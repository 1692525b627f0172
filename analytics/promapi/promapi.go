package promapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/config"
	"github.com/prometheus/common/model"
)

// Flags are the flags that say how to reach Prometheus.
type Flags struct {
	URL                string
	BearerTokenFile    string
	InsecureSkipVerify bool
	Timeout            time.Duration
}

// AddFlags adds the flags to app; defaultTimeout is --timeout's default (a
// week of recordings takes longer to read than an instant's figures).
func AddFlags(app *kingpin.Application, defaultTimeout string) *Flags {
	f := &Flags{}
	app.Flag("prometheus", "Base URL of the Prometheus query API: Prometheus, Thanos Query, GMP's frontend (http[s]://host:port[/prefix]).").Required().StringVar(&f.URL)
	app.Flag("prometheus.bearer-token-file", "File holding a bearer token sent to Prometheus (read for every query, so a rotated token is used at once).").StringVar(&f.BearerTokenFile)
	app.Flag("tls.insecure-skip-verify", "Do not verify Prometheus' TLS certificate.").BoolVar(&f.InsecureSkipVerify)
	app.Flag("timeout", "How long to wait for Prometheus, all queries together.").Default(defaultTimeout).DurationVar(&f.Timeout)
	return f
}

// Client queries one Prometheus.
type Client struct {
	api     v1.API
	base    string        // the URL for messages, without a password
	timeout time.Duration // --timeout, for messages
	// Warnings, when set, gets the warnings Prometheus attaches to an
	// answer (a partial answer from Thanos, for example), one a line.
	Warnings io.Writer
}

// NewClient checks the flags (the URL, the token file) and builds the
// client. Its errors are the user's: each names the flag.
func (f *Flags) NewClient() (*Client, error) {
	u, err := url.Parse(f.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--prometheus=%s: want a URL such as http://prometheus:9090 (or Thanos Query's, or GMP frontend's)", f.URL)
	}
	if f.Timeout <= 0 {
		return nil, fmt.Errorf("--timeout=%s: want a duration above 0, such as 30s", f.Timeout)
	}
	hc := config.HTTPClientConfig{TLSConfig: config.TLSConfig{InsecureSkipVerify: f.InsecureSkipVerify}}
	if f.BearerTokenFile != "" {
		b, err := os.ReadFile(f.BearerTokenFile)
		if err != nil {
			return nil, fmt.Errorf("--prometheus.bearer-token-file: %w", err)
		}
		if strings.TrimSpace(string(b)) == "" {
			return nil, fmt.Errorf("--prometheus.bearer-token-file=%s is empty", f.BearerTokenFile)
		}
		hc.Authorization = &config.Authorization{Type: "Bearer", CredentialsFile: f.BearerTokenFile}
	}
	rt, err := config.NewRoundTripperFromConfig(hc, "gpu-pool-exporter")
	if err != nil {
		return nil, err
	}
	c, err := api.NewClient(api.Config{Address: f.URL, RoundTripper: statusRecorder{rt}})
	if err != nil {
		return nil, fmt.Errorf("--prometheus=%s: %w", f.URL, err)
	}
	return &Client{api: v1.NewAPI(c), base: u.Redacted(), timeout: f.Timeout}, nil
}

// Context is ctx bounded by --timeout: all queries of one run together.
func (f *Flags) Context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.Timeout)
}

// Vector runs the instant query expr now; its answer must be a vector.
func (c *Client) Vector(ctx context.Context, expr string) (model.Vector, error) {
	return c.VectorAt(ctx, expr, time.Time{})
}

// VectorAt runs the instant query expr at a time (the zero time is
// Prometheus' now); its answer must be a vector.
func (c *Client) VectorAt(ctx context.Context, expr string, at time.Time) (model.Vector, error) {
	var status int
	v, warnings, _, err := c.api.Query(context.WithValue(ctx, statusKey{}, &status), expr, at)
	if err != nil {
		return nil, c.explain(ctx, expr, status, err)
	}
	if c.Warnings != nil {
		for _, w := range warnings {
			fmt.Fprintf(c.Warnings, "warning: Prometheus at %s, query %s: %s\n", c.base, expr, w)
		}
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("the answer to %s is a %s, want a vector", expr, v.Type())
	}
	return vec, nil
}

// explain turns a failed query into what happened and what to do.
func (c *Client) explain(ctx context.Context, expr string, status int, err error) error {
	var apiErr *v1.Error
	if !errors.As(err, &apiErr) {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("no answer from Prometheus at %s within --timeout=%s (query %s): raise --timeout", c.base, c.timeout, expr)
		}
		return fmt.Errorf("cannot reach Prometheus at %s: %v (check --prometheus)", c.base, err)
	}
	detail := strings.TrimSpace(apiErr.Detail)
	if len(detail) > 200 {
		detail = detail[:200] + "..."
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return fmt.Errorf("%s answered %d %s: pass a token with --prometheus.bearer-token-file (%s)", c.base, status, http.StatusText(status), detail)
	case apiErr.Type == v1.ErrBadData || apiErr.Type == v1.ErrExec || apiErr.Type == v1.ErrTimeout || apiErr.Type == v1.ErrCanceled ||
		((status == http.StatusBadRequest || status == http.StatusUnprocessableEntity) && detail == ""):
		return fmt.Errorf("query %s rejected by Prometheus: %s: %s", expr, apiErr.Type, apiErr.Msg)
	case status >= 500:
		return fmt.Errorf("the Prometheus at %s failed (%d %s): %s", c.base, status, http.StatusText(status), detail)
	}
	return fmt.Errorf("%s answered %d %s, not Prometheus' query API (is --prometheus the API's base URL?): %s", c.base, status, http.StatusText(status), detail)
}

// statusKey carries a *int through a query's context: the status of the
// last HTTP answer, which client_golang's errors do not keep.
type statusKey struct{}

type statusRecorder struct{ next http.RoundTripper }

func (s statusRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.next.RoundTrip(req)
	if p, ok := req.Context().Value(statusKey{}).(*int); ok && resp != nil {
		*p = resp.StatusCode
	}
	return resp, err
}
