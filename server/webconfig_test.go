package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"
)

// writePair writes a self-signed certificate and its key as PEM files
// named cert and key in dir; a key alone (cert "") is a key that matches
// no certificate written before.
func writePair(t *testing.T, dir, cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if cert != "" {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "web config test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, cert), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, key), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// logCount is the number of lines of logs at level that contain every
// one of words.
func logCount(logs *syncBuffer, level string, words ...string) int {
	n := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, `"level":"`+level+`"`) {
			continue
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			n++
		}
	}
	return n
}

// source loads path and watches nothing: the tests call poll and reload.
func source(t *testing.T, path string) (*webConfigSource, *syncBuffer) {
	t.Helper()
	c, err := LoadWebConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	s := newWebConfigSource(c, zerolog.New(logs))
	t.Cleanup(func() { s.live.Close() })
	return s, logs
}

// tlsSource is source on a web config in a folder of its own that names
// a certificate pair beside it (tls.crt, tls.key) by relative paths.
func tlsSource(t *testing.T) (dir, path string, s *webConfigSource, logs *syncBuffer) {
	t.Helper()
	dir = t.TempDir()
	writePair(t, dir, "tls.crt", "tls.key")
	path = filepath.Join(dir, "web.yml")
	writeFile(t, path, tlsConfig)
	s, logs = source(t, path)
	return dir, path, s, logs
}

const tlsConfig = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"

// bcryptHash is pass's bcrypt hash at the lowest cost (tests only).
func bcryptHash(t *testing.T, pass string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// settle waits past the file timestamps' granularity (a kernel tick on
// older kernels), so that a file rewritten in place at its old size gets
// a new change time, as a real edit, seconds apart, does.
func settle() { time.Sleep(20 * time.Millisecond) }

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A path written as another YAML scalar (cert_file: 1.5) is a file name for
// exporter-toolkit all the same, beside the config: the view names it by
// its resolved path, not by a path under /proc/self/fd.
func TestWebConfigPathsOfAnyScalar(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir, "1.5", "true")
	path := filepath.Join(dir, "web.yml")
	writeFile(t, path, "tls_server_config:\n  cert_file: 1.5\n  key_file: true\n")
	c, err := LoadWebConfig(path)
	if err != nil {
		t.Fatalf("cert_file: 1.5 and key_file: true beside the config: %v", err)
	}
	defer c.Close()
	view, err := os.ReadFile(memFilePath(c.view))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cert_file: " + filepath.Join(dir, "1.5"), "key_file: " + filepath.Join(dir, "true")} {
		if !strings.Contains(string(view), want) {
			t.Errorf("the toolkit's view has no %q:\n%s", want, view)
		}
	}
}

// exporter-toolkit reads the certificate files at every handshake: a pair
// it cannot load after a change is an error in the log (once), and so is
// its repair (info), not only debug lines of failed handshakes.
func TestCertificateFilesThatStopLoadingAreLogged(t *testing.T) {
	dir, _, s, logs := tlsSource(t)

	s.poll()
	if n := strings.Count(logs.String(), "\n"); n != 0 {
		t.Fatalf("nothing changed, yet the watcher logged:\n%s", logs)
	}
	settle()
	writePair(t, dir, "", "tls.key") // a key of another certificate
	s.poll()
	s.poll()
	if n := logCount(logs, "error", "cannot be used", "TLS handshakes fail", filepath.Join(dir, "tls.key")); n != 1 {
		t.Fatalf("a key that matches no certificate: %d error lines naming it, want 1:\n%s", n, logs)
	}
	settle()
	writePair(t, dir, "tls.crt", "tls.key") // both renewed
	s.poll()
	if n := logCount(logs, "info", "load again"); n != 1 {
		t.Fatalf("a repaired pair: %d info lines, want 1:\n%s", n, logs)
	}
	settle()
	writePair(t, dir, "tls.crt", "tls.key") // renewed again
	s.poll()
	if n := logCount(logs, "info", "new TLS connections get them"); n != 1 {
		t.Fatalf("a renewed pair: %d info lines, want 1:\n%s", n, logs)
	}
}

// An edit that cannot be served is logged once, not at every look at the
// file, and a later edit is read.
func TestRefusedWebConfigLoggedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yml")
	writeFile(t, path, "http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
	s, logs := source(t, path)
	writeFile(t, path, "http_server_config:\n  headerz: {}\n")
	for range 3 {
		s.poll()
	}
	if n := logCount(logs, "error", "keeping the last good one", "headerz"); n != 1 {
		t.Fatalf("an invalid edit, looked at three times: %d error lines, want 1:\n%s", n, logs)
	}
	writeFile(t, path, "http_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n")
	s.poll()
	if got := s.get().HTTPConfig.Header["X-Frame-Options"]; got != "sameorigin" {
		t.Errorf("the edit after it is not served: X-Frame-Options %q", got)
	}
	// SIGHUP reads the file whatever its stamp.
	s.reload("SIGHUP")
	if n := logCount(logs, "info", "web config reloaded", "SIGHUP"); n != 1 {
		t.Errorf("SIGHUP on an unchanged file: %d reload lines, want 1:\n%s", n, logs)
	}
}

// A new password of the same length written with the old modification
// time (cp -p, rsync -t) is a change all the same.
func TestWebConfigChangeKeepingModificationTime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yml")
	h1 := bcryptHash(t, "first")
	h2 := bcryptHash(t, "other")
	writeFile(t, path, "basic_auth_users:\n  prometheus: "+h1+"\n")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	s, logs := source(t, path)
	settle()
	writeFile(t, path, "basic_auth_users:\n  prometheus: "+h2+"\n")
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); after.Size() != fi.Size() || !after.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("setup: size %d and time %v, want %d and %v", after.Size(), after.ModTime(), fi.Size(), fi.ModTime())
	}
	s.poll()
	if got := s.get().users["prometheus"]; got != h2 {
		t.Errorf("the new hash is not served after a change that kept size and modification time:\n%s", logs)
	}
}

// The listeners are opened with TLS or without it: an edit that turns it
// off (or on) says a restart is needed and keeps serving the last good
// config, rather than failing every handshake.
func TestTLSSwitchNeedsRestart(t *testing.T) {
	_, path, s, logs := tlsSource(t)
	writeFile(t, path, "http_server_config:\n  http2: true\n")
	s.poll()
	s.poll()
	if n := logCount(logs, "error", "turns TLS off", "restart the exporter"); n != 1 {
		t.Fatalf("TLS turned off in the file: %d error lines, want 1:\n%s", n, logs)
	}
	if !s.get().TLS() {
		t.Error("the config without TLS is served")
	}

	// Settings read when the listeners open are applied with a warning.
	writeFile(t, path, tlsConfig+"http_server_config:\n  http2: false\n")
	s.poll()
	if n := logCount(logs, "warn", "http2", "restarts"); n != 1 {
		t.Errorf("http2 switched off: %d warnings, want 1:\n%s", n, logs)
	}
}

// An invalid edit while the served config's certificate files no longer
// load either: the log says that keeping the last good config does not
// keep TLS working.
func TestRefusedEditWithBrokenCertificates(t *testing.T) {
	dir, path, s, logs := tlsSource(t)
	if err := os.Remove(filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, tlsConfig+"  bogus: 1\n")
	s.poll()
	s.poll()
	if n := logCount(logs, "error", "no longer load either"); n != 1 {
		t.Fatalf("%d error lines saying the last good certificate files do not load, want 1:\n%s", n, logs)
	}
	if n := logCount(logs, "error"); n != 1 {
		t.Errorf("%d error lines in all, want that one:\n%s", n, logs)
	}
}

// A reload serves an edit in which one password is no bcrypt hash, that
// user left out (its logins fail, as with exporter-toolkit): the edit that
// removes a leaked user and mistypes another's hash still removes the
// first. At start such a file is refused (LoadWebConfig).
func TestReloadLeavesOutUsersWithoutBcryptHash(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yml")
	h1 := bcryptHash(t, "one")
	h2 := bcryptHash(t, "two")
	writeFile(t, path, "basic_auth_users:\n  leaked: "+h1+"\n  prometheus: "+h2+"\n")
	s, logs := source(t, path)
	writeFile(t, path, "basic_auth_users:\n  prometheus: "+h2+"\n  grafana: plain-text\n")
	s.poll()
	users := s.get().users
	if _, ok := users["leaked"]; ok {
		t.Error("the removed user can still log in")
	}
	if _, ok := users["grafana"]; ok {
		t.Error("a user whose password is no bcrypt hash is served")
	}
	if users["prometheus"] != h2 {
		t.Errorf("the other user is not served: %v", users)
	}
	if n := logCount(logs, "error", `\"grafana\" is not a bcrypt hash`, "htpasswd"); n != 1 {
		t.Errorf("%d error lines naming the user and the fix, want 1:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "plain-text") {
		t.Error("the password reached the log")
	}
	if _, err := LoadWebConfig(path); err == nil || !strings.Contains(err.Error(), `"grafana"`) {
		t.Errorf("at start: %v, want the file refused, naming grafana", err)
	}
}

// userSource is source on a web config with one user, prometheus.
func userSource(t *testing.T) (path string, s *webConfigSource, logs *syncBuffer) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "web.yml")
	h := bcryptHash(t, "one")
	writeFile(t, path, "basic_auth_users:\n  prometheus: "+h+"\n")
	s, logs = source(t, path)
	return path, s, logs
}

// Every user's password mistyped in a reload: basic auth stays on and
// nobody logs in (as with exporter-toolkit), rather than no users meaning
// no auth.
func TestReloadWithNoUsableUserKeepsAuthOn(t *testing.T) {
	path, s, logs := userSource(t)
	writeFile(t, path, "basic_auth_users:\n  prometheus: new-password-in-clear\n")
	s.poll()
	c := s.get()
	if !c.authOn() || len(c.users) != 0 {
		t.Errorf("after a reload whose one password is in clear: auth on %v, users %v; want auth on and no user", c.authOn(), c.users)
	}
	if n := logCount(logs, "error", "every request is refused"); n != 1 {
		t.Errorf("%d error lines saying nobody can log in, want 1:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "new-password") {
		t.Error("the password reached the log")
	}
}

// An empty file (as one is while it is written) is not served: it would
// turn basic auth off.
func TestReloadRefusesAnEmptyFile(t *testing.T) {
	path, s, logs := userSource(t)
	writeFile(t, path, "# being written\n")
	s.poll()
	if !s.get().authOn() {
		t.Error("an empty file turned basic auth off")
	}
	if n := logCount(logs, "error", "empty", "without --web.config.file"); n != 1 {
		t.Errorf("%d error lines about the empty file, want 1:\n%s", n, logs)
	}

	// A file that was empty at start stays so without an error.
	s, logs = source(t, path)
	s.reload("SIGHUP")
	if n := logCount(logs, "error"); n != 0 {
		t.Errorf("an empty file served since the start, read again: %d errors, want none:\n%s", n, logs)
	}
}

// A client_ca_file that holds no certificate refuses every client
// certificate: refused at load, and an error when it becomes so.
func TestClientCAFileWithoutCertificate(t *testing.T) {
	dir := t.TempDir()
	writePair(t, dir, "tls.crt", "tls.key")
	writePair(t, dir, "ca.crt", "ca.key")
	path := filepath.Join(dir, "web.yml")
	writeFile(t, path, tlsConfig+"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")
	s, logs := source(t, path)
	settle()
	writeFile(t, filepath.Join(dir, "ca.crt"), "not a certificate\n")
	s.poll()
	if n := logCount(logs, "error", "holds no PEM certificate", filepath.Join(dir, "ca.crt")); n != 1 {
		t.Errorf("a CA file turned to garbage: %d error lines, want 1:\n%s", n, logs)
	}
	if _, err := LoadWebConfig(path); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("at start: %v, want the CA file refused", err)
	}
	// The same CAs written inline.
	writeFile(t, path, tlsConfig+"  client_auth_type: VerifyClientCertIfGiven\n  client_ca: not a certificate\n")
	if _, err := LoadWebConfig(path); err == nil || !strings.Contains(err.Error(), "client_ca holds no PEM certificate") {
		t.Errorf("inline client_ca without a certificate: %v, want it refused", err)
	}
	// Where the toolkit verifies nothing with it, it is no mistake.
	writeFile(t, path, tlsConfig+"  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.crt\n")
	c, err := LoadWebConfig(path)
	if err != nil {
		t.Fatalf("client_auth_type RequireAnyClientCert with that CA file: %v, want it served as the toolkit serves it", err)
	}
	c.Close()
}

// The restart warnings compare with what the listeners were opened with:
// a rate limit changed and changed back warns once.
func TestRestartWarningsAgainstTheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.yml")
	limit := func(n int) string { return fmt.Sprintf("rate_limit:\n  interval: 1s\n  burst: %d\n", n) }
	writeFile(t, path, limit(10))
	s, logs := source(t, path)
	settle()
	writeFile(t, path, limit(20))
	s.poll()
	settle()
	writeFile(t, path, limit(10)+"http_server_config:\n  http2: false\n")
	s.poll()
	if n := logCount(logs, "warn", "rate_limit"); n != 1 {
		t.Errorf("rate limit changed, then back: %d warnings, want 1:\n%s", n, logs)
	}
	if n := logCount(logs, "warn", "http2"); n != 0 {
		t.Errorf("http2 changed without TLS (where it does not apply): %d warnings, want none:\n%s", n, logs)
	}
}
