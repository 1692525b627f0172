package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
)

// runStatus is `gpupool status`: it reads a running exporter's
// /status.json and prints who is on each GPU, as the landing page shows it.
// Inside the exporter's pod: kubectl exec ds/gpu-pool-exporter -- gpupool status
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := kingpin.New("gpupool status", "Print who is on each GPU of a running exporter: holders, VRAM, activity, idleness and GPU health.")
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	var done bool
	app.Terminate(func(int) { done = true })
	addr := app.Flag("url", "The exporter's address (http[s]://[user:password@]host:port); user and password for basic auth.").Default("http://localhost:" + status.DefaultPort).String()
	timeout := app.Flag("timeout", "How long to wait for the exporter.").Default("5s").Duration()
	asJSON := app.Flag("json", "Print the status document as JSON instead of a table.").Bool()
	insecure := app.Flag("tls.insecure-skip-verify", "Do not verify the exporter's TLS certificate (self-signed --web.config.file certificates).").Bool()
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(stderr, "gpupool status: %v (see --help)\n", err)
		return exitUsage
	}
	if done {
		return exitOK
	}
	u, err := statusURL(*addr)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool status: --url=%s: %v\n", *addr, err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool status: %v\n", err)
		return exitUsage
	}
	req.Header.Set("Accept", "application/json")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: *insecure}}} //nolint:gosec // the user asked for it
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool status: cannot reach the exporter at %s: %v (is it running? pass --url)\n", redact(u), err)
		return exitError
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 16<<20)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(body, 512))
		fmt.Fprintf(stderr, "gpupool status: %s answered %s: %s\n", redact(u), resp.Status, strings.TrimSpace(string(msg)))
		return exitError
	}
	n, err := status.Decode(body)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool status: %s: %v (is --url a gpu-pool-exporter?)\n", redact(u), err)
		return exitError
	}
	if *asJSON {
		err = n.JSON(stdout)
	} else {
		var b strings.Builder
		if err = n.Text(&b); err == nil {
			_, err = io.WriteString(stdout, printable(b.String()))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpupool status: %v\n", err)
		return exitError
	}
	return exitOK
}

// statusURL accepts host:port, :port or a URL, and points it at /status.json.
func statusURL(addr string) (string, error) {
	if strings.HasPrefix(addr, ":") {
		addr = "localhost" + addr
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("no host: want e.g. http://localhost:%s", status.DefaultPort)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + status.Path
	return u.String(), nil
}

// redact hides a password in error messages.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	return p.Redacted()
}

// printable replaces the control characters in names that come from pods
// (escape sequences, carriage returns) with '?', so that a pod name cannot
// rewrite the operator's terminal; newlines and tabs of the table stay.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || !unicode.IsControl(r) {
			return r
		}
		return '?'
	}, s)
}
