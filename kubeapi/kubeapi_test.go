package kubeapi_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakeapiserver"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// selfSigned is a CA-less certificate and key in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// A kubeconfig as kubectl reads it: the current context's cluster and
// user, file paths relative to the kubeconfig's folder, -data fields in
// base64; what the client cannot do is refused with what to do instead.
func TestLoadKubeconfig(t *testing.T) {
	cert, key := selfSigned(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "pki", "ca.crt"), cert)
	writeFile(t, filepath.Join(dir, "pki", "client.crt"), cert)
	writeFile(t, filepath.Join(dir, "pki", "client.key"), key)
	writeFile(t, filepath.Join(dir, "token"), "file-token\n")
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	kc := func(user string) string {
		return `apiVersion: v1
kind: Config
current-context: main
contexts:
- name: main
  context: {cluster: c1, user: u1}
- name: other
  context: {cluster: c2, user: u2}
clusters:
- name: c1
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.crt
- name: c2
  cluster:
    server: https://10.0.0.1
users:
- name: u1
  user:
` + user
	}
	for _, tc := range []struct {
		name, user string
		check      func(t *testing.T, c *kubeapi.Config)
		wantErr    string
	}{
		{name: "client certificate by relative path", user: "    client-certificate: pki/client.crt\n    client-key: pki/client.key\n",
			check: func(t *testing.T, c *kubeapi.Config) {
				if c.Host != "https://127.0.0.1:6443" || c.CA == nil || c.ClientCert == nil {
					t.Errorf("host %q, CA %v, client certificate %v", c.Host, c.CA != nil, c.ClientCert != nil)
				}
			}},
		{name: "client certificate as data", user: "    client-certificate-data: " + b64(cert) + "\n    client-key-data: " + b64(key) + "\n",
			check: func(t *testing.T, c *kubeapi.Config) {
				if c.ClientCert == nil {
					t.Error("no client certificate")
				}
			}},
		{name: "token file relative to the kubeconfig", user: "    tokenFile: token\n",
			check: func(t *testing.T, c *kubeapi.Config) {
				if c.TokenFile != filepath.Join(dir, "token") {
					t.Errorf("token file %q, want %q", c.TokenFile, filepath.Join(dir, "token"))
				}
			}},
		{name: "exec plugin", user: "    exec: {command: gke-gcloud-auth-plugin, apiVersion: client.authentication.k8s.io/v1beta1}\n", wantErr: "exec plugin or auth provider"},
		{name: "certificate without key", user: "    client-certificate: pki/client.crt\n", wantErr: "without the other"},
		{name: "missing file", user: "    client-certificate: pki/nope.crt\n    client-key: pki/client.key\n", wantErr: "nope.crt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".kubeconfig")
			writeFile(t, p, kc(tc.user))
			// From another working directory: paths are the file's.
			t.Chdir(t.TempDir())
			c, err := kubeapi.LoadKubeconfig(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
	t.Run("no current context", func(t *testing.T) {
		p := filepath.Join(dir, "empty.kubeconfig")
		writeFile(t, p, "apiVersion: v1\nkind: Config\n")
		if _, err := kubeapi.LoadKubeconfig(p); err == nil || !strings.Contains(err.Error(), "current-context") {
			t.Errorf("error %v, want one naming current-context", err)
		}
	})
	t.Run("several files", func(t *testing.T) {
		if _, err := kubeapi.LoadKubeconfig("a:b"); err == nil || !strings.Contains(err.Error(), "one kubeconfig") {
			t.Errorf("error %v, want one asking for one file", err)
		}
	})
}

// The token file is read again as the kubelet rotates it, and an error
// answer's Status reaches the caller.
func TestTokenFileAndStatusErrors(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "code": 403, "reason": "Forbidden",
			"message": `pods is forbidden: User "system:serviceaccount:gpu:exporter" cannot list resource "pods"`})
	}))
	defer srv.Close()
	tok := filepath.Join(t.TempDir(), "token")
	writeFile(t, tok, "first\n")
	c, err := kubeapi.New(&kubeapi.Config{Host: srv.URL, TokenFile: tok})
	if err != nil {
		t.Fatal(err)
	}
	var out any
	err = c.Get(context.Background(), "/api/v1/pods", nil, "", &out)
	if !kubeapi.IsStatus(err, http.StatusForbidden) || !strings.Contains(err.Error(), "cannot list resource") {
		t.Fatalf("error %v, want the 403 with the API server's message", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "Bearer first" {
		t.Errorf("Authorization %q, want the file's token", seen)
	}
}

// sink records a list-watch.
type sink struct {
	mu      sync.Mutex
	objects map[string]string // name -> label "v"
	lists   int
}

func (s *sink) name(raw json.RawMessage) (string, string) {
	var o struct {
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &o)
	return o.Metadata.Name, o.Metadata.Labels["v"]
}

func (s *sink) Replace(items []json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lists++
	s.objects = map[string]string{}
	for _, raw := range items {
		n, v := s.name(raw)
		s.objects[n] = v
	}
}

func (s *sink) Upsert(raw json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, v := s.name(raw)
	s.objects[n] = v
}

func (s *sink) Delete(raw json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, _ := s.name(raw)
	delete(s.objects, n)
}

func (s *sink) get() (map[string]string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.objects {
		out[k] = v
	}
	return out, s.lists
}

func slice(name, node, v string) fakeapiserver.Object {
	return fakeapiserver.Object{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"v": v}}, "spec": map[string]any{"nodeName": node}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Run follows a collection through a watch that the server ends (its
// timeout: resumed from the last version, no new list) and a compaction
// (410: listed again), neither reported as a failure.
func TestRunFollowsTheCollection(t *testing.T) {
	srv := fakeapiserver.New()
	defer srv.Close()
	const path = "/apis/resource.k8s.io/v1/resourceslices"
	srv.Serve(path, "spec.nodeName")
	srv.Set(path, []fakeapiserver.Object{slice("a", "n1", "1"), slice("b", "n2", "1")})
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	s := &sink{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	synced := make(chan struct{})
	var errMu sync.Mutex
	var errs []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, kubeapi.ListWatch{Path: path, FieldSelector: "spec.nodeName=n1"}, s, kubeapi.WatchOptions{
			OnSynced: func() { close(synced) }, WatchTimeout: time.Second, BackoffMin: 10 * time.Millisecond,
			OnError: func(err error) { errMu.Lock(); errs = append(errs, err); errMu.Unlock() }})
	}()
	<-synced
	if got, _ := s.get(); len(got) != 1 || got["a"] != "1" {
		t.Fatalf("after the list: %v, want a alone (n1's)", got)
	}
	// Past the one-second watch timeout: the next change arrives through a
	// resumed watch.
	time.Sleep(1500 * time.Millisecond)
	srv.Set(path, []fakeapiserver.Object{slice("a", "n1", "2"), slice("c", "n1", "1"), slice("b", "n2", "1")})
	waitFor(t, "a=2 and c", func() bool { got, _ := s.get(); return got["a"] == "2" && got["c"] == "1" })
	if _, lists := s.get(); lists != 1 {
		t.Errorf("%d lists; a resumed watch needs none", lists)
	}
	srv.Compact()
	srv.Set(path, []fakeapiserver.Object{slice("c", "n1", "2")})
	waitFor(t, "a gone and c=2 after the compaction", func() bool { got, _ := s.get(); _, a := got["a"]; return !a && got["c"] == "2" })
	if _, lists := s.get(); lists != 2 {
		t.Errorf("%d lists after a 410, want 2", lists)
	}
	errMu.Lock()
	defer errMu.Unlock()
	if len(errs) != 0 {
		t.Errorf("errors reported for a timeout and a 410, which are not failures: %v", errs)
	}
	cancel()
	<-done
}

// An API server that cannot be reached is reported and retried with
// backoff until the context ends; Run then returns.
func TestRunRetriesAnUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := kubeapi.New(&kubeapi.Config{Host: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, kubeapi.ListWatch{Path: "/api/v1/pods"}, &sink{}, kubeapi.WatchOptions{BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
			OnError: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				if !strings.Contains(err.Error(), "listing /api/v1/pods") {
					t.Errorf("error %v does not say what failed", err)
				}
				n++
			}})
	}()
	waitFor(t, "three failed attempts", func() bool { mu.Lock(); defer mu.Unlock(); return n >= 3 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
