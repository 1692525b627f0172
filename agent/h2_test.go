package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Attack opens an HTTP/2 connection and asks for /metrics on many
// streams: "stall" announces a stream window of 0 (the answers can never be
// sent) and keeps the streams open; "reset" cancels each stream right after
// opening it (rapid reset). It returns the connection to close.
func h2Attack(t *testing.T, addr string, pool *x509.CertPool, mode string, streams int) io.Closer {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	var mu sync.Mutex
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	if mode == "stall" {
		_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	} else {
		_ = fr.WriteSettings()
	}
	go func() { // read and drop what the server sends; acknowledge its settings
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				mu.Lock()
				_ = fr.WriteSettingsAck()
				mu.Unlock()
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", "/metrics"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i < streams; i++ {
		id := uint32(2*i + 1)
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
		if err == nil && mode == "reset" {
			err = fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		mu.Unlock()
		if err != nil {
			break // the server closed the connection: also a defence
		}
	}
	return c
}

// h2MaxStreams is the SETTINGS_MAX_CONCURRENT_STREAMS the server announces
// on a new HTTP/2 connection (0: none announced, so unlimited).
func h2MaxStreams(t *testing.T, addr string, pool *x509.CertPool) uint32 {
	t.Helper()
	v, _ := h2Settings(t, addr, pool)[http2.SettingMaxConcurrentStreams]
	return v
}

// h2Settings are the settings the server announces on a new HTTP/2
// connection.
func h2Settings(t *testing.T, addr string, pool *x509.CertPool) map[http2.SettingID]uint32 {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a guard against a hang
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's HTTP/2 settings: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			m := map[http2.SettingID]uint32{}
			_ = s.ForeachSetting(func(x http2.Setting) error { m[x.ID] = x.Val; return nil })
			return m
		}
	}
}

// HTTP/2 clients that hold streams at window 0 or open and reset streams
// rapidly leave the scrape slots free: a real scrape over HTTP/2 is served
// beside them.
func TestHTTP2StalledAndResetStreams(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--web.listen-address=" + addr, "--web.config.file=" + webConfig,
			"--collect-interval=1s", "--web.max-requests=2", "--log.level=error", "--collector.profile=full"}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-done }()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}, Timeout: 20 * time.Second}
	scrape := func() (int, string) {
		resp, err := client.Get("https://" + addr + "/metrics")
		if err != nil {
			return -1, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ProtoMajor != 2 {
			t.Fatalf("the scrape used %s, want HTTP/2", resp.Proto)
		}
		return resp.StatusCode, string(b)
	}
	for i := 0; ; i++ { // the first sample
		if code, body := scrape(); code == 200 && strings.Contains(body, "gpu_memory_used_bytes") {
			break
		}
		if i > 300 {
			t.Fatal("no HTTPS scrape")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var conns []io.Closer
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 4; i++ {
		conns = append(conns, h2Attack(t, addr, pool, "stall", 16), h2Attack(t, addr, pool, "reset", 500))
	}
	for i := 0; i < 10; i++ {
		if code, body := scrape(); code != 200 || !strings.Contains(body, "gpu_memory_used_bytes") {
			t.Fatalf("scrape %d beside stalled and reset HTTP/2 streams, --web.max-requests=2: %d %.200s", i, code, body)
		}
	}
	// Each stalled stream is a handler waiting on its client: one
	// connection may hold at most 8 (Go's default is 250).
	if n := h2MaxStreams(t, addr, pool); n == 0 || n > 8 {
		t.Errorf("the server lets one HTTP/2 connection open %d streams at once (0: no limit), want at most 8", n)
	}
}
