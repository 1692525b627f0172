package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The runs here are the attacks of clients that hold the server's answers
// rather than send it work: HTTP/2 streams held at flow-control window 0
// (with and without a password to get past), requests pipelined to the
// probe port and never read, and /metrics pipelined and read slowly. Each
// runs beside a well-behaved client and records the exporter's peak RSS.

// tlsFiles writes a self-signed certificate for 127.0.0.1 into dir and
// returns its files and a pool that trusts it.
func tlsFiles(dir string) (certFile, keyFile string, pool *x509.CertPool, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpu-pool-exporter bench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", nil, err
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool, nil
}

// h2Stats is what the HTTP/2 attackers did and got.
type h2Stats struct {
	conns, streams, ended, resets atomic.Int64
}

// h2Stall opens conns TLS HTTP/2 connections from 127.0.0.1, each
// announcing a stream window of 0 and keeping streams GET requests for
// /metrics (without credentials) open at once: a stream the server ends or
// resets is opened again, a connection it closes is opened again, until ctx
// ends. It reads what the server sends and never grants a window.
func h2Stall(ctx context.Context, addr string, conns, streams int, st *h2Stats) {
	h2StallFrom(ctx, addr, "127.0.0.1", "", conns, streams, st)
}

// h2StallFrom is h2Stall from the loopback address from, each request with
// the Authorization header auth ("": none).
func h2StallFrom(ctx context.Context, addr, from, auth string, conns, streams int, st *h2Stats) {
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if !h2StallConn(ctx, addr, from, auth, streams, st) {
					sleepCtx(ctx, 100*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
}

// h2StallConn is one connection of h2Stall; false if it could not connect.
func h2StallConn(ctx context.Context, addr, from, auth string, streams int, st *h2Stats) bool {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}},
		Config: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}} //nolint:gosec // the bench's own certificate
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	st.conns.Add(1)
	var mu sync.Mutex // the framer's writes
	fr := http2.NewFramer(c, c)
	mu.Lock()
	_, _ = c.Write([]byte(http2.ClientPreface))
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	mu.Unlock()
	free := make(chan struct{}, 4*streams) // a stream may be opened
	for i := 0; i < streams; i++ {
		free <- struct{}{}
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					mu.Lock()
					_ = fr.WriteSettingsAck()
					mu.Unlock()
				}
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					st.ended.Add(1)
					free <- struct{}{}
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					st.ended.Add(1)
					free <- struct{}{}
				}
			case *http2.RSTStreamFrame:
				st.resets.Add(1)
				free <- struct{}{}
			}
		}
	}()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", "/metrics"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if auth != "" {
		_ = enc.WriteField(hpack.HeaderField{Name: "authorization", Value: auth})
	}
	for id := uint32(1); ; id += 2 {
		select {
		case <-ctx.Done():
			return true
		case <-closed:
			return true
		case <-free:
		}
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
		mu.Unlock()
		if err != nil {
			return true
		}
		st.streams.Add(1)
	}
}

type h2Result struct {
	auth            bool
	attack          h2Stats
	rssIdle, rssMax int64
	scraper         *clientStats
}

// measureH2Stall: TLS (and with auth, basic auth), -h2-conns connections
// holding -h2-streams streams each at window 0 from 127.0.0.1, and a
// scraper over HTTP/2 from 127.0.0.2 every 100 ms (with the password when
// there is one).
func measureH2Stall(cfg config, auth bool) (*h2Result, error) {
	r := &h2Result{auth: auth}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "bench-h2")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	certFile, keyFile, pool, err := tlsFiles(dir)
	if err != nil {
		return r, err
	}
	webCfg := "tls_server_config:\n  cert_file: " + certFile + "\n  key_file: " + keyFile + "\n"
	if auth {
		hash, err := bcrypt.GenerateFromPassword([]byte("bench-secret"), bcrypt.DefaultCost)
		if err != nil {
			return r, err
		}
		webCfg += "basic_auth_users:\n  prometheus: " + string(hash) + "\n"
	}
	webFile := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webFile, []byte(webCfg), 0o600); err != nil {
		return r, err
	}
	scrape := func(addr string) *http.Request {
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		if auth {
			req.SetBasicAuth("prometheus", "bench-secret")
		}
		return req
	}
	p, err := startExporter(cfg, []string{"--web.config.file=" + webFile}, func(addr string) (*http.Request, error) { return scrape(addr), nil },
		&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})
	if err != nil {
		return r, err
	}
	defer p.stop()
	time.Sleep(3 * cfg.interval)
	r.rssIdle, _ = procRSS(p.cmd.Process.Pid)
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	r.rssMax = attackRun(cfg, p.cmd.Process.Pid, func(ctx context.Context) { h2Stall(ctx, p.addr, cfg.h2Conns, cfg.h2Streams, &r.attack) },
		func(ctx context.Context) {
			r.scraper = poll(ctx, scraper, 100*time.Millisecond, func() *http.Request { return scrape(p.addr) })
		})
	return r, nil
}

// attackRun runs attack for -attack-for against the exporter (process
// pid), and beside it, from half a second in, clients (which return when
// their context ends); it returns the exporter's peak RSS meanwhile.
func attackRun(cfg config, pid int, attack, clients func(ctx context.Context)) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.attackFor)
	defer cancel()
	var peak atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pollRSS(ctx, pid, &peak) }()
	go func() { defer wg.Done(); attack(ctx) }()
	sleepCtx(ctx, 500*time.Millisecond)
	clients(ctx)
	wg.Wait()
	return peak.Load()
}

type pipelineStats struct {
	conns, requests atomic.Int64
}

// pipeline runs conns connections from 127.0.0.1 to addr, each writing n
// pipelined GET requests for path; every read reads at most readBytes, then
// waits readEvery (readBytes 0: never reads). A connection the server
// closes is opened again reconnect later, until ctx ends.
func pipeline(ctx context.Context, addr, path string, conns, n, readBytes int, readEvery, reconnect time.Duration, st *pipelineStats) {
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: bench\r\n\r\n")
	batch := bytes.Repeat(req, 100)
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := &net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")},
				Control: smallReceiveWindow}
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				st.conns.Add(1)
				stop := context.AfterFunc(ctx, func() { c.Close() })
				done := make(chan struct{})
				if readBytes > 0 {
					go func() {
						defer close(done)
						buf := make([]byte, readBytes)
						for {
							if _, err := c.Read(buf); err != nil {
								return
							}
							sleepCtx(ctx, readEvery)
						}
					}()
				} else {
					close(done)
				}
				for sent := 0; sent < n && ctx.Err() == nil; sent += 100 {
					if _, err := c.Write(batch[:len(req)*min(100, n-sent)]); err != nil {
						break
					}
					st.requests.Add(int64(min(100, n-sent)))
				}
				if readBytes > 0 {
					<-done // the server closes it, or ctx ends
				} else {
					// Never read: the connection stays until the server
					// closes it (a write fails) or ctx ends.
					for ctx.Err() == nil {
						if _, err := c.Write(req); err != nil {
							break
						}
						sleepCtx(ctx, 200*time.Millisecond)
					}
				}
				stop()
				c.Close()
				sleepCtx(ctx, reconnect) // then a new connection, and the same again
			}
		}()
	}
	wg.Wait()
}

// smallReceiveWindow gives a socket a receive buffer of 4 KiB before it
// connects, so that the window it announces is small and what it does not
// read fills the server's send buffer soon, as across a real network.
func smallReceiveWindow(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	if err != nil {
		return err
	}
	return serr
}

type probePipelineResult struct {
	attack          pipelineStats
	healthz, readyz *clientStats
	rssMax          int64
}

// measureProbePipeline: -pipeline-probe-conns connections pipelining
// -pipeline-probe-requests `GET /healthz` each to the probe port, never
// reading, and a prober from 127.0.0.2 asking /healthz and /readyz every
// 100 ms on a new connection each with the kubelet's 1 s timeout.
func measureProbePipeline(cfg config) (*probePipelineResult, error) {
	r := &probePipelineResult{}
	p, probeAddr, err := startWithProbe(cfg)
	if err != nil {
		return r, err
	}
	defer p.stop()
	r.rssMax = attackRun(cfg, p.cmd.Process.Pid, func(ctx context.Context) {
		pipeline(ctx, probeAddr, "/healthz", cfg.probePipeConns, cfg.probePipeRequests, 0, 0, 5*time.Second, &r.attack)
	}, func(ctx context.Context) {
		var wg sync.WaitGroup
		probeBoth(ctx, &wg, probeAddr, &r.healthz, &r.readyz)
		wg.Wait()
	})
	return r, nil
}

type slowReaderResult struct {
	attack  pipelineStats
	scraper *clientStats
	rssMax  int64
}

// measureSlowReaders: -slow-readers connections pipelining
// -slow-reader-requests `GET /metrics` each and reading 1 KiB every 100 ms,
// and a scraper from 127.0.0.2 every 100 ms.
func measureSlowReaders(cfg config) (*slowReaderResult, error) {
	r := &slowReaderResult{}
	raiseFileLimit()
	p, err := startExporter(cfg, nil, func(addr string) (*http.Request, error) { return http.NewRequest("GET", "http://"+addr+"/readyz", nil) }, nil)
	if err != nil {
		return r, err
	}
	defer p.stop()
	r.rssMax = attackRun(cfg, p.cmd.Process.Pid, func(ctx context.Context) {
		pipeline(ctx, p.addr, "/metrics", cfg.slowReaders, cfg.slowReaderRequests, 1024, 100*time.Millisecond, time.Second, &r.attack)
	}, func(ctx context.Context) {
		r.scraper = poll(ctx, clientFrom("127.0.0.2", true, 10*time.Second), 100*time.Millisecond, func() *http.Request {
			req, _ := http.NewRequest("GET", "http://"+p.addr+"/metrics", nil)
			return req
		})
	})
	return r, nil
}

// answered is the share of a client's requests that were answered 200.
func answered(s *clientStats) float64 {
	n := len(s.lat) + s.failed()
	if n == 0 {
		return 0
	}
	return float64(len(s.lat)) / float64(n)
}
