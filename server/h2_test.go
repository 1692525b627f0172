package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/rs/zerolog"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// selfSigned is a TLS certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "server test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// holdStreams opens an HTTP/2 connection to addr that grants no
// flow-control window and opens n streams for /, then returns it.
func holdStreams(t *testing.T, addr string, n int) net.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) //nolint:gosec // the test's own certificate
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", addr}, {":path", "/"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i < n; i++ {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	}
	go func() { // settings acknowledged, the rest read and dropped
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		}
	}()
	return c
}

// An HTTP/2 connection that its client closes while its streams wait at
// window 0 leaves memory at once: nothing of it (its TLS state, buffers,
// HPACK tables, here its tracked connection) stays reachable once it is
// served no more. Go's HTTP/2 server re-arms its idle timer (IdleTimeout,
// or ReadTimeout without one) as it closes such a connection's streams,
// and the timer then holds the whole connection until it fires.
func TestClosedHTTP2ConnectionsAreFreed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(0)
	page := bytes.Repeat([]byte("x"), 256<<10)
	srv := newHTTPServer(guard(tr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) })), zerolog.Nop())
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, MinVersion: tls.VersionTLS12}
	go func() { _ = srv.ServeTLS(tr.listen(l, 0, true), "", "") }()
	defer srv.Close()

	const conns, streams = 8, 4
	var clients []net.Conn
	for i := 0; i < conns; i++ {
		clients = append(clients, holdStreams(t, l.Addr().String(), streams))
	}
	waitUntil(t, "every stream to be served", func() bool { return tr.stats().serving >= conns })
	var held []weak.Pointer[trackedConn]
	tr.mu.Lock()
	for c := range tr.conns {
		held = append(held, weak.Make(c))
	}
	tr.mu.Unlock()
	for _, c := range clients {
		c.Close()
	}
	waitUntil(t, "the server to close them", func() bool { return tr.stats().open == 0 })
	left := len(held)
	for deadline := time.Now().Add(10 * time.Second); left > 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		runtime.GC()
		left = 0
		for _, w := range held {
			if w.Value() != nil {
				left++
			}
		}
	}
	if left > 0 {
		t.Errorf("%d of %d HTTP/2 connections closed with streams open still in memory 10 s after", left, len(held))
	}
}

// An answer small enough to stay in the stream's buffer when its handler
// returns does not mark a connection that holds its window at 0 as one
// whose client takes its answers: guard sends the rest while the request
// is charged, and it never leaves. A client that reads is marked.
func TestSmallAnswerAtWindowZeroIsNoAnswerTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(0)
	page := bytes.Repeat([]byte("x"), 3000)
	var served atomic.Int64
	srv := newHTTPServer(guard(tr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		_, _ = w.Write(page)
	})), zerolog.Nop())
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, MinVersion: tls.VersionTLS12}
	go func() { _ = srv.ServeTLS(tr.listen(l, 0, true), "", "") }()
	defer srv.Close()

	held := holdStreams(t, l.Addr().String(), 2)
	defer held.Close()
	waitUntil(t, "both streams' handlers to run", func() bool { return served.Load() >= 2 })
	var c *trackedConn
	tr.mu.Lock()
	for x := range tr.conns {
		c = x
	}
	tr.mu.Unlock()
	waitUntil(t, "the streams' answers to end", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return c.handlers == 0
	})
	tr.mu.Lock()
	fake := c.answered
	tr.mu.Unlock()
	if fake {
		t.Error("a connection at window 0 counted as one that took an answer")
	}

	reader := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own certificate
	resp, err := reader.Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("the reader spoke %s, want HTTP/2", resp.Proto)
	}
	waitUntil(t, "the reader's connection to be marked", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for x := range tr.conns {
			if x != c && x.answered {
				return true
			}
		}
		return false
	})
}
