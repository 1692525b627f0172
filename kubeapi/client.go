package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Client calls one API server. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	http      *http.Client
	userAgent string

	username, password string
	token              string
	tokenFile          string
	mu                 sync.Mutex
	fileToken          string
	fileTokenRead      time.Time
}

// tokenFileTTL is how long a token read from a file is used before the
// file is read again: the kubelet replaces a projected service account
// token well before it expires (client-go reads it once a minute too).
const tokenFileTTL = time.Minute

// maxErrorBody bounds what is read of an error answer.
const maxErrorBody = 64 << 10

// New is a client for cfg.
func New(cfg *Config) (*Client, error) {
	u, err := url.Parse(cfg.Host)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("API server %q: want an http(s) URL", cfg.Host)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	tc := &tls.Config{RootCAs: cfg.CA, InsecureSkipVerify: cfg.Insecure, ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12} //nolint:gosec // insecure only where the kubeconfig says insecure-skip-tls-verify
	if cfg.ClientCert != nil {
		tc.Certificates = []tls.Certificate{*cfg.ClientCert}
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   2,
		ForceAttemptHTTP2:     true,
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = "gpu-pool-exporter"
	}
	return &Client{base: u, http: &http.Client{Transport: tr}, userAgent: ua,
		username: cfg.Username, password: cfg.Password, token: cfg.Token, tokenFile: cfg.TokenFile}, nil
}

// Host is the API server's URL.
func (c *Client) Host() string { return c.base.String() }

// StatusError is an API server's refusal: its HTTP code and the Status it
// sent (reason, message).
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	if e.Reason != "" {
		return fmt.Sprintf("the API server answered %d %s: %s", e.Code, e.Reason, msg)
	}
	return fmt.Sprintf("the API server answered %d: %s", e.Code, msg)
}

// IsStatus reports whether err is a StatusError with code.
func IsStatus(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// status is the body of an API server's error answer and of a watch's
// ERROR event.
type status struct {
	Kind    string `json:"kind"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// bearer is the token to send: the file's (read again once a minute) or the
// fixed one.
func (c *Client) bearer() (string, error) {
	if c.tokenFile == "" {
		return c.token, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fileToken != "" && time.Since(c.fileTokenRead) < tokenFileTTL {
		return c.fileToken, nil
	}
	b, err := os.ReadFile(c.tokenFile)
	if err != nil {
		if c.fileToken != "" {
			return c.fileToken, nil // keep the last one while the file is replaced
		}
		return "", fmt.Errorf("the API server's token: %w", err)
	}
	c.fileToken, c.fileTokenRead = strings.TrimSpace(string(b)), time.Now()
	return c.fileToken, nil
}

// request sends one request; a non-2xx answer is a StatusError (the body
// read and closed).
func (c *Client) request(ctx context.Context, method, path string, query url.Values, accept, contentType string, body []byte) (*http.Response, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", c.userAgent)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	tok, err := c.bearer()
	if err != nil {
		return nil, err
	}
	switch {
	case tok != "":
		req.Header.Set("Authorization", "Bearer "+tok)
	case c.username != "":
		req.SetBasicAuth(c.username, c.password)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	se := &StatusError{Code: resp.StatusCode}
	var st status
	if json.Unmarshal(b, &st) == nil && st.Kind == "Status" {
		se.Reason, se.Message = st.Reason, st.Message
	} else {
		se.Message = strings.TrimSpace(string(b))
	}
	return nil, se
}

// Get reads path (with query) into out, a JSON value.
func (c *Client) Get(ctx context.Context, path string, query url.Values, accept string, out any) error {
	resp, err := c.request(ctx, http.MethodGet, path, query, accept, "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// Patch types the API server takes.
const (
	StrategicMergePatch = "application/strategic-merge-patch+json"
	MergePatch          = "application/merge-patch+json"
)

// Patch sends a patch of patchType to path and reads the answer into out
// (nil: discarded).
func (c *Client) Patch(ctx context.Context, path, patchType string, patch []byte, out any) error {
	resp, err := c.request(ctx, http.MethodPatch, path, nil, "application/json", patchType, patch)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
