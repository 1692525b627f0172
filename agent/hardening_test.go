package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

// slowBody sends a request whose body is announced and then trickles (one
// byte sent, the rest never), and returns the connection and what the
// server answered (status, Connection header), or -1.
func slowBody(t *testing.T, addr, method, path string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// A guard against a hang, not a timed assertion: net/http would drain
	// the body until its 10 s read timeout.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 200000\r\n\r\nx", method, path, addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, nil
	}
	resp.Body.Close()
	return c, resp
}

// closedByServer reports whether the server closed c (EOF) rather than
// waiting for more of the body.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF
}

// A request body on an endpoint that takes none is refused at once (413,
// Connection: close) and its connection closed, before any scrape slot,
// login or handler: clients sending bodies slowly hold neither the
// --web.max-requests slots nor the probe port, and the scraper and the
// kubelet's probes keep being served beside them.
func TestSlowRequestBodiesAreRefusedAtOnce(t *testing.T) {
	r := startWithAuth(t, bcrypt.MinCost, "--web.max-requests=2", "--web.max-connections=8")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for _, tc := range []struct {
		name, addr, method, path string
		want                     int
	}{
		{"metrics", r.addr, "GET", "/metrics", http.StatusRequestEntityTooLarge},
		{"landing page", r.addr, "GET", "/", http.StatusRequestEntityTooLarge},
		{"probe healthz", r.probe, "POST", "/healthz", http.StatusMethodNotAllowed},
		{"probe readyz", r.probe, "GET", "/readyz", http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// More slow clients than connections and scrape slots.
			for i := 0; i < server.ProbeMaxConnections+4; i++ {
				c, resp := slowBody(t, tc.addr, tc.method, tc.path)
				held = append(held, c)
				if resp == nil {
					t.Fatalf("slow body %d: no answer (connection refused or reset)", i)
				}
				if resp.StatusCode != tc.want || !resp.Close {
					t.Fatalf("slow body %d: %d (Connection: close %v), want %d and close", i, resp.StatusCode, resp.Close, tc.want)
				}
				if !closedByServer(c) {
					t.Fatalf("slow body %d: the server kept the connection open, waiting for the body", i)
				}
			}
			c := &http.Client{Timeout: 20 * time.Second}
			for i := 0; i < 5; i++ {
				if code, body := get(t, c, "http://"+r.addr+"/metrics", "prometheus", "s3cret-scrape"); code != 200 {
					t.Fatalf("scrape %d beside slow bodies: %d %.100s", i, code, body)
				}
				if code, body := get(t, c, "http://"+r.probe+"/healthz", "", ""); code != 200 {
					t.Fatalf("probe %d beside slow bodies: %d %.100s", i, code, body)
				}
			}
		})
	}
}

// Clients that send a body and stop, without waiting for the answer,
// leave the scrape slots free: the refusal takes none.
func TestHeldBodiesLeaveScrapeSlotsFree(t *testing.T) {
	r := startExporter(t, "--collect-interval=1s", "--log.level=warn", "--web.max-requests=2")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 6; i++ {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\nx")
		held = append(held, c)
	}
	client := &http.Client{Timeout: 20 * time.Second}
	for i := 0; i < 10; i++ {
		if code, body := get(t, client, r.url("/metrics"), "", ""); code != 200 {
			t.Fatalf("scrape %d beside 6 held bodies and --web.max-requests=2: %d %.100s", i, code, body)
		}
	}
}

// Methods other than GET and HEAD are refused on every endpoint (405 with
// Allow), as on /metrics.
func TestMethodsRefused(t *testing.T) {
	r := startWithAuth(t, bcrypt.MinCost)
	c := &http.Client{Timeout: 20 * time.Second}
	for _, tc := range []struct {
		name, method, url string
		want              int
	}{
		{"DELETE landing", "DELETE", "http://" + r.addr + "/", 405},
		{"TRACE status.json", "TRACE", "http://" + r.addr + status.Path, 405},
		{"POST healthz", "POST", "http://" + r.addr + "/healthz", 405},
		{"POST metrics", "POST", "http://" + r.addr + "/metrics", 405},
		{"POST probe healthz", "POST", "http://" + r.probe + "/healthz", 405},
		{"PUT probe readyz", "PUT", "http://" + r.probe + "/readyz", 405},
		{"HEAD healthz", "HEAD", "http://" + r.probe + "/healthz", 200},
		{"GET status.json", "GET", "http://" + r.addr + status.Path, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, tc.url, nil)
			req.SetBasicAuth("prometheus", "s3cret-scrape")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow: %q, want \"GET, HEAD\"", resp.Header.Get("Allow"))
			}
		})
	}
}

// A scrape holds its slot while its answer is prepared, not while the
// client reads it: clients that stop reading (a full TCP window; an HTTP/2
// stream at window 0 is the same) leave the scrape slots free.
func TestSlowReadersLeaveScrapeSlotsFree(t *testing.T) {
	r := startExporter(t, "--collect-interval=1s", "--log.level=warn", "--web.max-requests=2",
		"--collector.profile=full", "--compat.dcgm-exporter")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 6; i++ {
		c, code := slowConn(t, r.addr)
		held = append(held, c)
		if code != 200 {
			t.Errorf("slow reader %d got %d, want 200", i, code)
		}
	}
	client := &http.Client{Timeout: 20 * time.Second}
	for i := 0; i < 10; i++ {
		if code, body := get(t, client, r.url("/metrics"), "", ""); code != 200 {
			t.Fatalf("scrape %d beside 6 slow readers and --web.max-requests=2: %d %.100s", i, code, body)
		}
	}
}

// SIGHUP reads the web config again, logs it, and the exporter keeps
// serving (it used to exit with 129, without a shutdown). (The file watch
// sees this change too, by its change time: the reload the signal made is
// told by its reason in the log. The server's tests read an unchanged file
// again at SIGHUP.)
func TestSIGHUPReloadsWebConfig(t *testing.T) {
	hash := func(pass string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
	cfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(cfg, []byte("basic_auth_users:\n  prometheus: "+hash("old-password")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(cfg)
	r := startWithConfig(t, cfg, "--log.level=info")
	c := &http.Client{Timeout: 20 * time.Second}
	url := "http://" + r.addr + "/metrics"
	if code, _ := get(t, c, url, "prometheus", "old-password"); code != 200 {
		t.Fatalf("old password before the change: %d", code)
	}
	// The same size (bcrypt hashes are 60 bytes) and modification time.
	if err := os.WriteFile(cfg, []byte("basic_auth_users:\n  prometheus: "+hash("new-password")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(cfg, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := get(t, c, url, "prometheus", "new-password")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new password still gets %d 20s after SIGHUP; log:\n%s", code, r.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, _ := get(t, c, url, "prometheus", "old-password"); code == 200 {
		t.Error("the old password still works after the reload")
	}
	if !strings.Contains(r.logs.String(), "SIGHUP received: reloading the web config") {
		t.Errorf("log lacks the SIGHUP:\n%s", r.logs.String())
	}
	if !pollUntil(10*time.Second, func() bool {
		for _, line := range strings.Split(r.logs.String(), "\n") {
			if strings.Contains(line, "web config reloaded") && strings.Contains(line, "SIGHUP") {
				return true
			}
		}
		return false
	}) {
		t.Errorf("no reload for the SIGHUP in the log:\n%s", r.logs.String())
	}
}

// --help says what happens past the connection cap: connections are closed
// (evicted or refused), never queued in the kernel.
func TestHelpSaysWhatTheConnectionCapDoes(t *testing.T) {
	var out strings.Builder
	if code := run(context.Background(), []string{"--help"}, &out, io.Discard); code != exitOK {
		t.Fatalf("--help exit %d", code)
	}
	help := strings.Join(strings.Fields(out.String()), " ")
	i := strings.Index(help, "--web.max-connections")
	if i < 0 {
		t.Fatal("--help lacks --web.max-connections")
	}
	text := help[i:min(len(help), i+400)]
	if strings.Contains(text, "accept queue") || !strings.Contains(text, "one without a request in flight") {
		t.Errorf("--web.max-connections help: %q", text)
	}
}
