package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// writeCert makes a self-signed certificate for 127.0.0.1.
func writeCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gpu-pool-exporter test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLSAndBasicAuth(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret-scrape"), bcrypt.MinCost)
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--web.listen-address=" + addr, "--web.config.file=" + webConfig, "--collect-interval=1s"}, io.Discard, &logs)
	}()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	get := func(user, pass string) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			return -1, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	if !pollUntil(15*time.Second, func() bool {
		code, body = get("prometheus", "s3cret-scrape")
		return code == 200 && strings.Contains(body, "gpu_memory_used_bytes")
	}) {
		t.Fatalf("no authenticated HTTPS scrape: %d %s\nlog:\n%s", code, body, logs.String())
	}
	if code, _ := get("", ""); code != http.StatusUnauthorized {
		t.Errorf("no credentials: status %d, want 401", code)
	}
	if code, _ := get("prometheus", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong password: status %d, want 401", code)
	}
	// Plain HTTP gets no metrics.
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "gpu_memory_used_bytes") {
			t.Error("metrics served over plain HTTP with TLS configured")
		}
	}
	if strings.Contains(logs.String(), "s3cret") || strings.Contains(logs.String(), string(hash)) {
		t.Error("a secret reached the log")
	}
	cancel()
	<-done
}

func TestBadWebConfigFails(t *testing.T) {
	f := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(f, []byte("tls_server_config:\n  cert_file: /nonexistent.crt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errb syncBuffer
	code := runSim(context.Background(), []string{"--web.listen-address=" + freeAddr(t), "--web.config.file=" + f}, io.Discard, &errb)
	if code != exitUsage {
		t.Fatalf("a broken web config: exit %d, want 2", code)
	}
	if !strings.Contains(errb.String(), "--web.config.file="+f) {
		t.Errorf("error does not say what is wrong: %s", errb.String())
	}
}

func TestPprofOnlyBehindFlag(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		addr := freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		args := []string{"--simulate", "--web.listen-address=" + addr}
		if enabled {
			args = append(args, "--web.enable-pprof")
		}
		done := make(chan int)
		go func() { done <- run(ctx, args, io.Discard, io.Discard) }()
		waitFor(t, "http://"+addr+"/healthz", 200)
		resp, err := http.Get("http://" + addr + "/debug/pprof/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{false: 404, true: 200}[enabled]; resp.StatusCode != want {
			t.Errorf("pprof enabled=%v: status %d, want %d", enabled, resp.StatusCode, want)
		}
		cancel()
		<-done
	}
}

// Rotation needs no restart: a new certificate is served on the next
// connection, and a changed password is checked once the web config file
// changes.
func TestWebConfigRotation(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool1 := writeCert(t, dir)
	hash1, _ := bcrypt.GenerateFromPassword([]byte("first"), bcrypt.MinCost)
	webConfig := filepath.Join(dir, "web.yml")
	writeConfig := func(hash []byte) {
		if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig(hash1)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--web.listen-address=" + addr, "--web.config.file=" + webConfig, "--collect-interval=1s"}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-done }()
	status := func(pool *x509.CertPool, pass string) int {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		req.SetBasicAuth("prometheus", pass)
		resp, err := c.Do(req)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually := func(what string, f func() bool) {
		t.Helper()
		if !pollUntil(15*time.Second, f) {
			t.Fatalf("%s: not within 15s", what)
		}
	}
	eventually("first certificate and password", func() bool { return status(pool1, "first") == 200 })

	// New certificate files in place (cert-manager renews a Secret): the
	// next connection gets the new one.
	_, _, pool2 := writeCert(t, dir)
	eventually("renewed certificate", func() bool { return status(pool2, "first") == 200 })
	if code := status(pool1, "first"); code != -1 {
		t.Errorf("the old CA still verifies the served certificate (%d)", code)
	}
	// A new password in the web config.
	hash2, _ := bcrypt.GenerateFromPassword([]byte("second"), bcrypt.MinCost)
	time.Sleep(1100 * time.Millisecond) // a different modification time
	writeConfig(hash2)
	eventually("new password", func() bool { return status(pool2, "second") == 200 })
	if code := status(pool2, "first"); code != http.StatusUnauthorized {
		t.Errorf("the old password after rotation: %d, want 401", code)
	}
}

// exporter-toolkit serves the web config's headers (on refusals too) and
// its HTTP/2 switch: with http2: false, TLS offers HTTP/1.1 alone.
func TestWebConfigHeadersAndHTTP2Switch(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir)
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret-scrape"), bcrypt.MinCost)
	webConfig := filepath.Join(dir, "web.yml")
	// Relative paths: the toolkit is given them resolved against this file.
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: "+filepath.Base(certFile)+"\n  key_file: "+filepath.Base(keyFile)+
		"\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"+
		"basic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}, Timeout: 20 * time.Second}
	for _, user := range []string{"prometheus", ""} {
		req, _ := http.NewRequest("GET", "https://"+r.addr+"/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, "s3cret-scrape")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[string]int{"prometheus": 200, "": 401}[user]; resp.StatusCode != want {
			t.Errorf("user %q: %d, want %d", user, resp.StatusCode, want)
		}
		if resp.Header.Get("X-Frame-Options") != "deny" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("user %q: headers %v, want the web config's", user, resp.Header)
		}
		if resp.ProtoMajor != 1 {
			t.Errorf("user %q: %s with http2: false", user, resp.Proto)
		}
	}
}

// Without TLS, the web config's headers are served all the same (by the
// exporter: exporter-toolkit is not given the file then).
func TestWebConfigHeadersWithoutTLS(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("s3cret-scrape"), bcrypt.MinCost)
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n"+
		"basic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startWithConfig(t, webConfig)
	c := &http.Client{Timeout: 20 * time.Second}
	for _, user := range []string{"prometheus", ""} {
		req, _ := http.NewRequest("GET", "http://"+r.addr+"/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, "s3cret-scrape")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Frame-Options") != "sameorigin" {
			t.Errorf("user %q: %d, headers %v, want the web config's X-Frame-Options", user, resp.StatusCode, resp.Header)
		}
	}
}
