package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Clients that hold the server's answers: HTTP/2 streams at flow-control
// window 0, pipelines never read or read slowly. Each test asserts what
// was answered and who kept a connection, never how fast; the waits are
// liveness bounds.

// zeroWindowConn is an HTTP/2 connection over TLS from a loopback address
// that grants the server no flow-control window: no answer body can reach
// it.
type zeroWindowConn struct {
	c  net.Conn
	mu sync.Mutex // the framer's writes
	fr *http2.Framer
	hb []byte // the request's header block
	// ended gets the :status of each stream the server ended (HEADERS or
	// DATA with END_STREAM), reset the ID of each it reset.
	ended chan string
	reset chan uint32
	// status gets the :status of each answer's headers, ended or not (a
	// stream held at window 0 gets its headers, never its body), while
	// there is room for it.
	status chan string
	next   uint32
}

func dialZeroWindow(t *testing.T, addr string, pool *x509.CertPool, path, user, pass string) *zeroWindowConn {
	t.Helper()
	z, err := dialZeroWindowFrom("127.0.0.1", addr, pool, path, user, pass)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.c.Close() })
	return z
}

// dialZeroWindowFrom is dialZeroWindow from the loopback address from; the
// caller closes z.c.
func dialZeroWindowFrom(from, addr string, pool *x509.CertPool, path, user, pass string) (*zeroWindowConn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}},
		Config: &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	z := &zeroWindowConn{c: c, fr: http2.NewFramer(c, c), ended: make(chan string, 1024), reset: make(chan uint32, 1024), status: make(chan string, 64), next: 1}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", path}}
	if user != "" {
		req, _ := http.NewRequest("GET", "/", nil)
		req.SetBasicAuth(user, pass)
		fields = append(fields, [2]string{"authorization", req.Header.Get("Authorization")})
	}
	for _, f := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	z.hb = hb.Bytes()
	z.mu.Lock()
	_, _ = c.Write([]byte(http2.ClientPreface))
	_ = z.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	z.mu.Unlock()
	dec := hpack.NewDecoder(4096, nil)
	go func() {
		status := map[uint32]string{}
		for {
			f, err := z.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					z.mu.Lock()
					_ = z.fr.WriteSettingsAck()
					z.mu.Unlock()
				}
			case *http2.HeadersFrame:
				if hf, err := dec.DecodeFull(f.HeaderBlockFragment()); err == nil {
					for _, h := range hf {
						if h.Name == ":status" {
							status[f.StreamID] = h.Value
							select {
							case z.status <- h.Value:
							default:
							}
						}
					}
				}
				if f.StreamEnded() {
					z.ended <- status[f.StreamID]
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					z.ended <- status[f.StreamID]
				}
			case *http2.RSTStreamFrame:
				z.reset <- f.StreamID
			}
		}
	}()
	return z, nil
}

// open opens a stream; false if the connection is gone.
func (z *zeroWindowConn) open() bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	id := z.next
	z.next += 2
	return z.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: z.hb, EndStream: true, EndHeaders: true}) == nil
}

// With TLS and basic auth, a client without credentials that grants no
// flow-control window still gets its 401 whole: the refusal has no body,
// so nothing of it waits on the window and no stream is held.
func TestRefusalsNeedNoFlowControlWindow(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret-scrape"), bcrypt.MinCost)
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+
		"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig)
	for _, user := range []string{"", "prometheus"} { // no credentials; a wrong password
		z := dialZeroWindow(t, r.addr, pool, "/metrics", user, "wrong")
		const streams = 8
		for i := 0; i < streams; i++ {
			if !z.open() {
				t.Fatal("the server closed the connection")
			}
		}
		for i := 0; i < streams; i++ {
			select {
			case s := <-z.ended:
				if s != "401" && s != "429" {
					t.Errorf("user %q: a stream ended with status %s, want 401 (or 429)", user, s)
				}
			case id := <-z.reset:
				t.Fatalf("user %q: stream %d reset: its answer waited on the window 0 until the write deadline", user, id)
			case <-time.After(20 * time.Second): // a liveness bound, not a latency
				t.Fatalf("user %q: %d of %d refusals not sent whole to a client granting window 0", user, streams-i, streams)
			}
		}
	}
}

// TLS without basic auth: at the connection cap, connections whose HTTP/2
// streams are held at window 0 give way to a scraper's new connection (they
// make no progress; the scraper's does).
func TestStalledStreamsGiveWayToAScraper(t *testing.T) {
	const attacker, scraperAddr = "127.0.0.1", "127.0.0.2"
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig, "--web.max-connections=8", "--collector.profile=full")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	// The cap, each with 8 streams held, opened a fifth of a second apart
	// and again when reset or ended: a connection always has a stream open.
	for i := 0; i < 8; i++ {
		z, err := dialZeroWindowFrom(attacker, r.addr, pool, "/metrics", "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { z.c.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 8; j++ {
				if !z.open() || !sleepCtx(ctx, 200*time.Millisecond) {
					return
				}
			}
			for {
				select {
				case <-ctx.Done():
					return
				case <-z.ended:
				case <-z.reset:
				}
				if !z.open() {
					return
				}
			}
		}()
	}
	sleepCtx(ctx, 3*time.Second) // every stream opened, and held a while
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(scraperAddr)}}
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, DisableKeepAlives: true}}
	var code int
	var body string
	if !pollUntil(20*time.Second, func() bool { // a liveness bound, under the 30 s WriteTimeout
		code, body = get(t, scraper, "https://"+r.addr+"/metrics", "", "")
		return code == 200
	}) {
		t.Fatalf("no scrape from %s on a new connection beside 8 connections from %s holding 64 streams at window 0 (cap 8): last %d %.200s",
			scraperAddr, attacker, code, body)
	}
}

// The probe port answers one request per connection: a client pipelining
// requests it never reads gets one answer and loses the connection, so it
// cannot hold the probe port's few connections.
func TestProbePortAnswersOneRequestPerConnection(t *testing.T) {
	r := startWithAuth(t, bcrypt.MinCost)
	c, err := net.Dial("tcp", r.probe)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, strings.Repeat("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 3))
	br := bufio.NewReader(c)
	answers := 0
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a liveness bound
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("after %d answers the connection stays open: want one answer, then the connection closed", answers)
			}
			break
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answers++
		if resp.StatusCode != 200 || !resp.Close {
			t.Errorf("answer %d: %d (Connection: close %v), want 200 and close", answers, resp.StatusCode, resp.Close)
		}
	}
	if answers != 1 {
		t.Errorf("3 pipelined probes on one connection got %d answers, want 1", answers)
	}
}

// At the connection cap, connections pipelining /metrics and reading a
// trickle (2 KiB every 100 ms, with a small receive window), twice as many
// as the cap and each opened again as soon as it is closed, give way to
// every scrape of a scraper: their writes stall, its do not, and those
// from the address holding the cap do not push out each other.
func TestSlowReadersGiveWayToAScraper(t *testing.T) {
	r := startExporter(t, "--collect-interval=1s", "--log.level=warn", "--web.max-connections=8",
		"--collector.profile=full", "--compat.dcgm-exporter")
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	served := make(chan struct{}, 1024)
	slowReader := func() {
		c, err := d.DialContext(ctx, "tcp", r.addr)
		if err != nil {
			return
		}
		defer c.Close()
		stopClose := context.AfterFunc(ctx, func() { c.Close() })
		defer stopClose()
		_, _ = c.Write([]byte(strings.Repeat("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200)))
		buf := make([]byte, 2048)
		for n := 0; ; n++ {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if n == 0 {
				served <- struct{}{}
			}
			if !sleepCtx(ctx, 100*time.Millisecond) {
				return
			}
		}
	}
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				slowReader()
			}
		}()
	}
	for i := 0; i < 8; i++ {
		<-served // the cap full of connections being answered
	}
	sleepCtx(ctx, 3*time.Second) // reading a trickle for a while
	scraper := clientFrom(t, "127.0.0.2")
	for i := 0; i < 10; i++ {
		if code, body := get(t, scraper, r.url("/metrics"), "", ""); code != 200 {
			t.Fatalf("scrape %d on a new connection beside 16 slow readers of pipelined pages (cap 8): %d %.200s", i, code, body)
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// bcryptCostUnder is the highest bcrypt cost, at most 10, whose hash
// takes this process less than d (the race detector's build is several
// times slower than a plain one).
func bcryptCostUnder(d time.Duration) int {
	cost := 10
	for ; cost > bcrypt.MinCost; cost-- {
		start := time.Now()
		_, _ = bcrypt.GenerateFromPassword([]byte("calibrate"), cost)
		if time.Since(start) < d {
			break
		}
	}
	return cost
}

// sleepCtx waits d or until ctx is done; false if ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// clientFrom is a client whose connections come from the loopback address
// ip, a new connection for each request.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// OPTIONS * is a method other than GET and HEAD: 405, as documented (Go's
// server answers it 200 by itself unless told not to).
func TestOptionsStarIsRefused(t *testing.T) {
	r := startExporter(t, "--collect-interval=1s", "--log.level=warn")
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("OPTIONS *: %d, Allow %q; want 405 with Allow: GET, HEAD", resp.StatusCode, resp.Header.Get("Allow"))
	}
}

// Wrong passwords, each request from a new address (tens of thousands in
// a few seconds), keep the bcrypt slots and queue full. A scraper logging
// in for the first time still gets in within two tries, as Prometheus
// retries at its scrape interval: from the flood's own /24 as another
// user, and from another network as the user the flood tries. Tries are
// counted, not timed.
func TestFirstLoginBesideWrongPasswordsFromManyAddresses(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of bcrypt checks")
	}
	// A check of tens of ms: the flood keeps the queue full, and a first
	// login's wait for the next slot stays well within the server's bound.
	cost := bcryptCostUnder(50 * time.Millisecond)
	var users strings.Builder
	for _, u := range [][2]string{{"prometheus", "s3cret-scrape"}, {"new-scraper", "new-s3cret"}} {
		hash, err := bcrypt.GenerateFromPassword([]byte(u[1]), cost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&users, "  %s: %s\n", u[0], hash)
	}
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n"+users.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig)

	// Address i of the flood: 250 /16 networks of 127.0.0.0/8, 240
	// addresses in each /24; no address is used twice (so none has failed,
	// or been turned away, before).
	floodAddr := func(i int) string { return fmt.Sprintf("127.%d.%d.%d", 1+i%250, i/250/240%250, 1+i/250%240) }
	var next, busy atomic.Int64
	flood := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ip := floodAddr(int(next.Add(1)))
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
			return d.DialContext(ctx, network, addr)
		}}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for w := 0; w < 160; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+r.addr+"/metrics", nil)
				req.SetBasicAuth("prometheus", fmt.Sprintf("wrong-%d-%d", w, i))
				resp, err := flood.Do(req)
				if err != nil {
					sleepCtx(ctx, 10*time.Millisecond)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					busy.Add(1)
				}
			}
		}()
	}
	waitUntil(t, "the flood to fill the bcrypt queue (503s)", func() bool { return busy.Load() >= 100 })

	for _, tc := range []struct {
		name, from, user, pass string
	}{
		{"the flood's own /24, another user", "127.1.0.200", "new-scraper", "new-s3cret"},
		{"another network, the flooded user", "127.252.0.1", "prometheus", "s3cret-scrape"},
	} {
		const tries = 2
		var got []int
		for len(got) < tries {
			code, _ := get(t, clientFrom(t, tc.from), "http://"+r.addr+"/metrics", tc.user, tc.pass)
			got = append(got, code)
			if code == 200 {
				break
			}
			sleepCtx(ctx, time.Second)
		}
		if got[len(got)-1] != 200 {
			t.Errorf("first login from %s (%s) beside wrong passwords from %d addresses (%d answered 503 so far): answers %v to %d tries, want 200 within them",
				tc.from, tc.name, next.Load(), busy.Load(), got, tries)
		} else {
			t.Logf("first login from %s (%s), bcrypt cost %d: answers %v", tc.from, tc.name, cost, got)
		}
	}
}
