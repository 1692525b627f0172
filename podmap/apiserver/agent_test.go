package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// The node agent itself (cmd/gpu-pool-exporter, no simulation linked) on
// the fake libnvidia-ml, its kubelet a fake PodResources server on a unix
// socket, its API server the real one: only the hardware is a stand-in.

var (
	libOnce sync.Once
	libPath string
	libErr  error
)

// fakeNVML is the fake libnvidia-ml.so.1, built once per test process.
func fakeNVML(t *testing.T) string {
	t.Helper()
	libOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpe-apiserver-nvml-")
		if err != nil {
			libErr = err
			return
		}
		libPath, libErr = fakenvml.NewBuilder(dir).Library(fakenvml.Full)
	})
	if libErr != nil {
		t.Fatal(libErr)
	}
	return libPath
}

// agentBinary is GPE_TEST_BINARY (make builds it once), else a build of
// cmd/gpu-pool-exporter into dir.
func agentBinary(t *testing.T, dir string) string {
	t.Helper()
	if b := os.Getenv("GPE_TEST_BINARY"); b != "" {
		return b
	}
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, "gpu-pool-exporter")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/gpu-pool-exporter")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// agent is the running node agent.
type agent struct {
	t      *testing.T
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	log    strings.Builder
	exited chan struct{}
}

func (a *agent) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.Write(p)
}

func (a *agent) logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.log.String()
}

// startAgent runs the agent on the node file nodePath with args (the fake
// library, a free port, 1s samples and no DCGM are given) and waits until
// it listens.
func startAgent(t *testing.T, dir, nodePath string, args ...string) *agent {
	t.Helper()
	all := append([]string{"--nvml.library=" + fakeNVML(t), "--dcgm.mode=off", "--web.listen-address=127.0.0.1:0",
		"--collect-interval=1s", "--nvml.device-timeout=500ms"}, args...)
	a := &agent{t: t, exited: make(chan struct{})}
	a.cmd = exec.Command(agentBinary(t, dir), all...)
	a.cmd.Env = append(os.Environ(), fakenvml.EnvNode+"="+nodePath, "LD_LIBRARY_PATH=")
	pr, pw := io.Pipe()
	a.cmd.Stderr = io.MultiWriter(a, pw)
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); pw.Close(); close(a.exited) }()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var l struct{ Message, Address string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "serving /metrics" && l.Address != "" {
				select {
				case addr <- l.Address:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.exited:
		case <-time.After(20 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.exited
		}
		if t.Failed() {
			t.Logf("the agent's log:\n%s", lastLines(a.logs(), 40))
		}
	})
	select {
	case a.addr = <-addr:
	case <-a.exited:
		t.Fatalf("the agent exited at start:\n%s", a.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent did not listen within 60s:\n%s", a.logs())
	}
	return a
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// scrape reads the agent's page.
func (a *agent) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + a.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	return parser.TextToMetricFamilies(resp.Body)
}

// waitPage scrapes until ok says the page is what the test waits for.
func (a *agent) waitPage(what string, ok func(page) bool) page {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-a.exited:
			a.t.Fatalf("the agent died waiting for %s:\n%s", what, lastLines(a.logs(), 40))
		default:
		}
		f, err := a.scrape()
		if err == nil && ok(page(f)) {
			return page(f)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	a.t.Fatalf("no page with %s within 60s (last error %v)", what, last)
	return nil
}

// waitRegistered waits until every GPU is registered for NVML's events:
// NVML delivers no event raised before.
func (a *agent) waitRegistered() {
	a.t.Helper()
	a.waitPage("every GPU registered for XID events", func(p page) bool {
		v, ok := p.value("gpu_exporter_xid_unregistered_gpus", nil)
		return ok && v == 0
	})
}

// page is a parsed page.
type page map[string]*dto.MetricFamily

// find returns the series of name whose labels include want.
func (p page) find(name string, want map[string]string) []map[string]string {
	var out []map[string]string
	mf := p[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		out = append(out, have)
	}
	return out
}

// value is the value of the first series of name whose labels include
// want.
func (p page) value(name string, want map[string]string) (float64, bool) {
	mf := p[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.Metric {
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		}
	}
	return 0, false
}

func writeNode(t *testing.T, n *fakenvml.Node, path string) {
	t.Helper()
	if err := n.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// apply creates obj (unstructured, as a manifest) or replaces the one of
// its name.
func apply(t *testing.T, admin dynamic.Interface, gvr schema.GroupVersionResource, obj map[string]any) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: obj}
	var res dynamic.ResourceInterface = admin.Resource(gvr)
	if ns := u.GetNamespace(); ns != "" {
		res = admin.Resource(gvr).Namespace(ns)
	}
	ctx := context.Background()
	cur, err := res.Get(ctx, u.GetName(), metav1.GetOptions{})
	if err != nil {
		got, err := res.Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s %s: %v", gvr.Resource, u.GetName(), err)
		}
		return got
	}
	u.SetResourceVersion(cur.GetResourceVersion())
	got, err := res.Update(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update %s %s: %v", gvr.Resource, u.GetName(), err)
	}
	return got
}

// grant binds the exporter's identity to a ClusterRole of rules.
func grant(t *testing.T, admin dynamic.Interface, name string, rules []any) {
	t.Helper()
	apply(t, admin, clusterRolesGVR, map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": name}, "rules": rules})
	apply(t, admin, clusterRoleBindingsGVR, map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": name},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
		"subjects": []any{map[string]any{"kind": "User", "name": exporterUser}}})
}
