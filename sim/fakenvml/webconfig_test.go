package fakenvml_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"golang.org/x/crypto/bcrypt"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// testCert is a self-signed certificate for 127.0.0.1, PEM-encoded.
type testCert struct {
	certPEM, keyPEM []byte
	pool            *x509.CertPool
	serial          int64
}

func newTestCert(t *testing.T, serial int64) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "gpu-pool-exporter web config test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return testCert{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), pool: pool, serial: serial}
}

func (c testCert) write(t *testing.T, certFile, keyFile string) {
	t.Helper()
	for f, b := range map[string][]byte{certFile: c.certPEM, keyFile: c.keyPEM} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// indent indents a PEM block for a YAML block scalar.
func indent(b []byte) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "\n    ")
}

// TestAgentWebConfigAsExporterToolkitReads starts the node agent itself (on
// the fake driver: no simulation linked) with web configs written as
// exporter-toolkit's and node_exporter's documentation writes them:
// certificate paths relative to the config file's folder, whether the
// config is named by a relative path from that folder or by an absolute
// path from elsewhere; certificates inline; and a SIGHUP after the
// certificate files were replaced, which new connections see. Each serves
// TLS and basic auth.
func TestAgentWebConfigAsExporterToolkitReads(t *testing.T) {
	t.Parallel()
	bin := exporterBinary(t)
	lib := library(t, fakenvml.Full)
	nodeFile := filepath.Join(t.TempDir(), "node")
	if err := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full).WriteFile(nodeFile); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("scrape-secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users := "basic_auth_users:\n  prometheus: " + string(hash) + "\n"

	type layout struct {
		name string
		// setup writes the config and certificates under dir and returns
		// the --web.config.file value and the folder the agent runs in.
		setup func(t *testing.T, dir string, c testCert) (flag, cwd string)
		// replace writes c's files where setup wrote the first ones ("" :
		// the layout has no certificate files).
		replace func(t *testing.T, dir string, c testCert)
	}
	layouts := []layout{
		{name: "relative config and certificate paths, run from the config's folder",
			setup: func(t *testing.T, dir string, c testCert) (string, string) {
				c.write(t, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
				writeFile(t, filepath.Join(dir, "web.yml"), "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"+users)
				return "web.yml", dir
			},
			replace: func(t *testing.T, dir string, c testCert) {
				c.write(t, filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
			}},
		{name: "absolute config path, certificates in a subfolder relative to it, run from elsewhere",
			setup: func(t *testing.T, dir string, c testCert) (string, string) {
				c.write(t, filepath.Join(dir, "conf", "tls", "server.crt"), filepath.Join(dir, "conf", "tls", "server.key"))
				writeFile(t, filepath.Join(dir, "conf", "web-config.yml"), "tls_server_config:\n  cert_file: tls/server.crt\n  key_file: tls/server.key\n"+users)
				return filepath.Join(dir, "conf", "web-config.yml"), t.TempDir()
			},
			replace: func(t *testing.T, dir string, c testCert) {
				c.write(t, filepath.Join(dir, "conf", "tls", "server.crt"), filepath.Join(dir, "conf", "tls", "server.key"))
			}},
		{name: "relative config path from a parent folder",
			setup: func(t *testing.T, dir string, c testCert) (string, string) {
				c.write(t, filepath.Join(dir, "etc", "cert.pem"), filepath.Join(dir, "etc", "key.pem"))
				writeFile(t, filepath.Join(dir, "etc", "web.yml"), "tls_server_config:\n  cert_file: cert.pem\n  key_file: ./key.pem\n"+users)
				return filepath.Join("etc", "web.yml"), dir
			},
			replace: func(t *testing.T, dir string, c testCert) {
				c.write(t, filepath.Join(dir, "etc", "cert.pem"), filepath.Join(dir, "etc", "key.pem"))
			}},
		{name: "inline certificate and key",
			setup: func(t *testing.T, dir string, c testCert) (string, string) {
				writeFile(t, filepath.Join(dir, "web.yml"), "tls_server_config:\n  cert: |\n"+indent(c.certPEM)+"\n  key: |\n"+indent(c.keyPEM)+"\n"+users)
				return "web.yml", dir
			}},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			first := newTestCert(t, 1)
			flag, cwd := l.setup(t, dir, first)
			e := startAgentIn(t, bin, lib, nodeFile, cwd, "--web.config.file="+flag)

			if code, _ := tlsGet(t, e.addr, first.pool, "", ""); code != http.StatusUnauthorized {
				t.Errorf("without credentials: %d, want 401", code)
			}
			if code, body := tlsGet(t, e.addr, first.pool, "prometheus", "wrong"); code != http.StatusUnauthorized {
				t.Errorf("wrong password: %d, want 401 (%s)", code, body)
			}
			code, body := tlsGet(t, e.addr, first.pool, "prometheus", "scrape-secret")
			if code != http.StatusOK || !strings.Contains(body, "gpu_up{") {
				t.Fatalf("with the password: %d, want 200 and the page; log:\n%s", code, e.stderr.String())
			}
			if l.replace == nil {
				return
			}
			second := newTestCert(t, 2)
			l.replace(t, dir, second)
			if err := e.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(15 * time.Second)
			for {
				serial, err := servedSerial(e.addr)
				if err == nil && serial == second.serial {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the certificate files changed and SIGHUP, new connections still get serial %d (%v); log:\n%s", serial, err, e.stderr.String())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if code, _ := tlsGet(t, e.addr, second.pool, "prometheus", "scrape-secret"); code != http.StatusOK {
				t.Errorf("with the new certificate: %d, want 200", code)
			}
			if !strings.Contains(e.stderr.String(), "web config reloaded") {
				t.Errorf("SIGHUP did not reload the web config; log:\n%s", e.stderr.String())
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startAgentIn runs the agent in cwd on the fake driver with args and
// waits until /healthz answers over TLS (certificate unchecked: the test
// checks it after).
func startAgentIn(t *testing.T, bin, lib, nodeFile, cwd string, args ...string) *exporter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, append([]string{"--nvml.library=" + lib, "--no-kubelet.enabled", "--dcgm.mode=off",
		"--web.listen-address=" + addr, "--collect-interval=1s"}, args...)...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), fakenvml.EnvNode+"="+nodeFile, "LD_LIBRARY_PATH=")
	e := &exporter{t: t, cmd: cmd, addr: addr, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = e.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		e.err = cmd.Wait()
		close(e.exited)
	}()
	t.Cleanup(func() { e.stop() })
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test checks the certificate itself
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-e.exited:
			t.Fatalf("the agent exited at start (%v):\n%s", e.err, e.stderr.String())
		default:
		}
		if resp, err := insecure.Get("https://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not serve TLS within 30s:\n%s", e.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tlsGet fetches /metrics over TLS, checking the certificate with pool.
func tlsGet(t *testing.T, addr string, pool *x509.CertPool, user, pass string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics over TLS: %v", err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = io.Copy(&b, resp.Body)
	return resp.StatusCode, b.String()
}

// servedSerial is the serial number of the certificate a new connection
// gets.
func servedSerial(addr string) (int64, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate served
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return 0, fmt.Errorf("no certificate")
	}
	return certs[0].SerialNumber.Int64(), nil
}
