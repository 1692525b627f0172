package agent_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/http2"
)

// The attacker's choices beside well-behaved clients: a stolen password,
// an attacker on the kubelet's own address. Each test asserts what was
// answered, never how fast; the waits are liveness bounds.

// HTTP/2 connections announce small frames, receive windows and header
// tables: what a connection may make the server buffer is bounded by the
// settings, not by Go's 1 MiB defaults.
func TestHTTP2Limits(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig)
	got := h2Settings(t, r.addr, pool)
	// A setting left out takes the protocol's initial value (RFC 9113, 6.5.2).
	for _, s := range []struct {
		id       http2.SettingID
		initial  uint32
		atMost   uint32
		whatFor  string
		required bool
	}{
		{http2.SettingMaxConcurrentStreams, 0, 8, "streams per connection", true},
		{http2.SettingMaxFrameSize, 16 << 10, 16 << 10, "frame size (the read buffer)", false},
		{http2.SettingInitialWindowSize, 65535, 64 << 10, "stream receive window", false},
		{http2.SettingHeaderTableSize, 4096, 4096, "HPACK table", false},
	} {
		v, ok := got[s.id]
		if !ok {
			if s.required {
				t.Errorf("%s not announced (unlimited)", s.id)
				continue
			}
			v = s.initial
		}
		if v > s.atMost {
			t.Errorf("%s (%s) = %d, want at most %d", s.id, s.whatFor, v, s.atMost)
		}
	}
}

// A stolen password: more connections logged in with the scraper's own
// credentials than the memory budget holds, each with 8 HTTP/2 streams at
// window 0, leave the scraper (same user, its own address), the kubelet's
// probes and a new Prometheus's first login (another user) served: the
// thief's connections are bounded per user and shed when they stall, and
// the probe port has a budget of its own.
func TestStolenPasswordLeavesOthersTheirRoom(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	cost := bcryptCostUnder(50 * time.Millisecond)
	var users string
	for _, u := range []string{"prometheus", "gmp"} {
		hash, err := bcrypt.GenerateFromPassword([]byte(u+"-secret"), cost)
		if err != nil {
			t.Fatal(err)
		}
		users += "  " + u + ": " + string(hash) + "\n"
	}
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\nbasic_auth_users:\n"+users), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig, "--collector.profile=full")
	tlsFrom := func(ip string, keepAlive bool) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
			TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, DisableKeepAlives: !keepAlive}}
	}
	// The scraper keeps its connection between scrapes, as Prometheus
	// does; a new Prometheus logs in on a new one each time.
	scraper, newcomer := tlsFrom("127.0.0.2", true), tlsFrom("127.0.0.4", false)
	defer scraper.CloseIdleConnections()
	// The scraper logs in before the theft: its password is known.
	if code, body := get(t, scraper, "https://"+r.addr+"/metrics", "prometheus", "prometheus-secret"); code != 200 {
		t.Fatalf("the scraper's first scrape: %d %.100s", code, body)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	// 96 connections, all open before their streams, x (32 + 64 + 128 KiB
	// + 8 streams x 16 KiB) = 33 MiB of charges, past the 24 MiB budget;
	// each keeps 8 streams open as the server ends or resets them.
	const thieves = 96
	var conns []*zeroWindowConn
	for i := 0; i < thieves; i++ {
		z, err := dialZeroWindowFrom("127.0.0.1", r.addr, pool, "/metrics", "prometheus", "prometheus-secret")
		if err != nil {
			t.Fatalf("thief %d: %v", i, err)
		}
		t.Cleanup(func() { z.c.Close() })
		conns = append(conns, z)
	}
	loggedIn := make(chan struct{}, thieves)
	for _, z := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			signal := sync.OnceFunc(func() { loggedIn <- struct{}{} })
			defer signal()
			defer context.AfterFunc(ctx, func() { z.c.Close() })()
			// A stream logs in (its page's headers come, its body cannot),
			// then the other seven.
			if !z.open() {
				return
			}
			select {
			case <-z.status:
			case <-time.After(10 * time.Second): // a liveness bound
			}
			for j := 1; j < 8; j++ {
				if !z.open() {
					return
				}
			}
			signal()
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
	for i := 0; i < thieves; i++ {
		<-loggedIn // or gone
	}
	sleepCtx(ctx, 2*time.Second) // the streams stall

	prober := clientFrom(t, "127.0.0.3")
	var failed []string
	for i := 0; i < 6; i++ {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, prober, "http://"+r.probe+path, "", ""); code != 200 {
				failed = append(failed, fmt.Sprintf("probe %d %s: %d %.100s", i, path, code, body))
			}
		}
		if i%2 == 0 {
			if code, body := get(t, newcomer, "https://"+r.addr+"/metrics", "gmp", "gmp-secret"); code != 200 {
				failed = append(failed, fmt.Sprintf("first login %d: %d %.100s", i, code, body))
			}
		}
		if code, body := get(t, scraper, "https://"+r.addr+"/metrics", "prometheus", "prometheus-secret"); code != 200 {
			failed = append(failed, fmt.Sprintf("scrape %d: %d %.100s", i, code, body))
		}
		sleepCtx(ctx, 300*time.Millisecond)
	}
	if len(failed) > 0 {
		t.Errorf("beside %d connections with the scraper's password holding 8 streams each at window 0:\n%v", thieves, failed)
	}
}

// The probe port answers the kubelet while connections from the
// kubelet's own address (a hostNetwork pod) hold it with headers that never
// end, twice its cap, each reopened when closed: the oldest connection
// without a whole request gives way to a new one, whatever its address.
func TestProbesBesideSlowHeadersFromTheirAddress(t *testing.T) {
	r := startWithAuth(t, bcrypt.MinCost)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	const kubelet = "127.0.0.3"
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(kubelet)}}
	held := make(chan struct{}, 64)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := true; ctx.Err() == nil; first = false {
				c, err := d.DialContext(ctx, "tcp", r.probe)
				if err != nil {
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				stopClose := context.AfterFunc(ctx, func() { c.Close() })
				_, err = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n"))
				if first {
					held <- struct{}{}
				}
				for err == nil && sleepCtx(ctx, 200*time.Millisecond) {
					_, err = c.Write([]byte("X-Slow: 1\r\n"))
				}
				stopClose()
				c.Close()
			}
		}()
	}
	for i := 0; i < 32; i++ {
		<-held
	}
	prober := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	var failed []string
	for i := 0; i < 10; i++ {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, prober, "http://"+r.probe+path, "", ""); code != 200 {
				failed = append(failed, fmt.Sprintf("probe %d %s: %d %.100s", i, path, code, body))
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	if len(failed) > 0 {
		t.Errorf("beside 32 connections from the prober's address sending headers that never end:\n%v", failed)
	}
}
