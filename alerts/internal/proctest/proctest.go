// Package proctest runs the processes of the rules' tests: promtool (2.42
// and 3.x) for the promtool tests (alerts, alerts/churn), and the servers of
// the end-to-end tests (alerts/e2e, alerts/thanos): exporters, Prometheus,
// Thanos, each a process on a free loopback port, stopped when the test
// ends.
package proctest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// promtoolInstall says how to get promtool; CI runs `make test`, which
// installs it.
const promtoolInstall = "install it with `apt-get install -y prometheus` (Debian/Ubuntu: it ships promtool), " +
	"or download a release from https://prometheus.io/download/ and put promtool on PATH"

// promtool3Install says how to get the Prometheus 3.x promtool.
const promtool3Install = "build it with scripts/install-tools.sh (`make tools`), which installs " +
	"github.com/prometheus/prometheus/cmd/promtool@" + promtool3Version + " as promtool3 in $(go env GOPATH)/bin"

// promtool3Version is the prometheus module version of promtool3 (Prometheus
// 3.x); scripts/install-tools.sh builds the same.
const promtool3Version = "v0.316.0"

// Promtools are the promtool binaries the rules are tested with: Debian's
// promtool (Prometheus 2.42) and promtool3 (Prometheus 3.x), keyed by name.
// Without one the tests fail in CI (env CI set) and run with the other
// elsewhere (skipped without both).
func Promtools(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	var missing []string
	for name, how := range map[string]string{"promtool": promtoolInstall, "promtool3": promtool3Install} {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name+" not found on PATH: "+how)
			continue
		}
		out[name] = p
	}
	sort.Strings(missing)
	if len(missing) > 0 && os.Getenv("CI") != "" {
		t.Fatalf("CI is set, so the rules must be tested on Prometheus 2.x and 3.x:\n%s", strings.Join(missing, "\n"))
	}
	for _, m := range missing {
		t.Log(m)
	}
	if len(out) == 0 {
		t.Skip("no promtool")
	}
	return out
}

// PromtoolCommand runs promtool with GOGC=400: promtool test rules
// allocates much per evaluation while its heap stays small (under 300 MB
// for every test file at once), so collecting a quarter as often saves
// about a quarter of its CPU time, the largest part of the rules' tests.
func PromtoolCommand(pt string, args ...string) *exec.Cmd {
	cmd := exec.Command(pt, args...)
	cmd.Env = append(os.Environ(), "GOGC=400")
	return cmd
}

// ExporterBinary returns the gpu-pool-exporter-sim binary to run (the
// agent on a simulated node, as the end-to-end tests need): the one in
// $GPE_TEST_SIM_BINARY (make test builds it once for every package), else
// one built from root into dst.
func ExporterBinary(t testing.TB, ctx context.Context, root, dst string) string {
	t.Helper()
	if bin := os.Getenv("GPE_TEST_SIM_BINARY"); bin != "" {
		return bin
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", dst, "./cmd/gpu-pool-exporter-sim")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpu-pool-exporter-sim: %v\n%s", err, out)
	}
	return dst
}

// GpupoolBinary returns the gpupool binary (the command for people:
// status, fleet, recommend, report): $GPE_TEST_GPUPOOL_BINARY, else one
// built from root into dst.
func GpupoolBinary(t testing.TB, ctx context.Context, root, dst string) string {
	t.Helper()
	if bin := os.Getenv("GPE_TEST_GPUPOOL_BINARY"); bin != "" {
		return bin
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", dst, "./cmd/gpupool")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpupool: %v\n%s", err, out)
	}
	return dst
}

// RepoRoot is the repository's top directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// FreeAddr returns a free local TCP address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs a command until the test ends, its output in logFile; at the
// end it is interrupted, and killed if it has not exited 10 s later.
func Start(t testing.TB, ctx context.Context, logFile, bin string, args ...string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		f.Close()
	})
}

// WaitHTTP waits for a 200 from u; on timeout it logs the end of logFile
// and fails the test.
func WaitHTTP(t testing.TB, u string, timeout time.Duration, logFile string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	TailFile(t, logFile, 40)
	t.Fatalf("%s did not answer 200 within %s", u, timeout)
}

// TailFile logs the last n lines of a file.
func TailFile(t testing.TB, path string, n int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("last lines of %s:\n%s", filepath.Base(path), strings.Join(lines, "\n"))
}

// GetJSON decodes a JSON answer; Prometheus' 400 and 422 carry an error
// object, so they are decoded too.
func GetJSON(u string, v any) error {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusUnprocessableEntity {
		return fmt.Errorf("%s: HTTP %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// ShortenFor rewrites every `for: <duration>` of a rules file to d.
func ShortenFor(rules, d string) string {
	return forRE.ReplaceAllString(rules, "${1}"+d)
}

var forRE = regexp.MustCompile(`(?m)^(\s+for:\s*)\S+\s*$`)
