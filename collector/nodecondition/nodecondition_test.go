package nodecondition

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakeapiserver"
)

const nodesPath = "/api/v1/nodes"

// apiServer serves two nodes, each with the kubelet's Ready condition.
func apiServer(t *testing.T) *fakeapiserver.Server {
	t.Helper()
	s := fakeapiserver.New()
	t.Cleanup(s.Close)
	s.Serve(nodesPath, "metadata.name")
	var nodes []fakeapiserver.Object
	for _, n := range []string{"node-a", "node-b"} {
		nodes = append(nodes, fakeapiserver.Object{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": n},
			"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady"}}}})
	}
	s.Set(nodesPath, nodes)
	return s
}

func conditions(t *testing.T, s *fakeapiserver.Server, node string) map[string]map[string]any {
	t.Helper()
	o, ok := s.Get(nodesPath, "", node)
	if !ok {
		t.Fatalf("no node %s", node)
	}
	out := map[string]map[string]any{}
	st, _ := o["status"].(map[string]any)
	l, _ := st["conditions"].([]any)
	for _, c := range l {
		m := c.(map[string]any)
		out[m["type"].(string)] = m
	}
	return out
}

func writer(t *testing.T, s *fakeapiserver.Server, now *time.Time) *Writer {
	t.Helper()
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Client: c, NodeName: "node-a", Log: zerolog.Nop(), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var xid79 = state.Fault{GPU: 1, UUID: "GPU-11111111-2222-3333-4444-555555555555", Kind: state.FaultXID, XID: xid.Lookup(79), GPUInstance: -1,
	Since: time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)}

// The writer patches its own node's status with its condition alone (the
// kubelet's stays; the other node is never written): False without a
// fault, True with the fault's GPU, UUID and XID, its transition time kept
// while the status holds; a conflict and a server error are tried again
// at once, a refusal marks the writer down until a write succeeds.
func TestWriter(t *testing.T) {
	s := apiServer(t)
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	w := writer(t, s, &now)
	if st := w.CollectorStatus(); st.Name != "node_condition" || !st.Up {
		t.Errorf("before any write: %+v, want node_condition up", st)
	}

	w.Observe(&state.State{})
	waitFor(t, "the False condition", func() bool { return w.Written() != nil })
	c := conditions(t, s, "node-a")
	if got := c[DefaultType]; got["status"] != "False" || got["reason"] != ReasonNoFault || got["lastTransitionTime"] != "2026-12-06T10:00:00Z" {
		t.Errorf("no fault: %v", got)
	}
	if c["Ready"]["reason"] != "KubeletReady" {
		t.Errorf("the kubelet's condition after the patch: %v", c["Ready"])
	}

	// A conflict and a server error, then the fault: written at the third try.
	before := s.Requests()["PATCH "+nodesPath+"/node-a/status"]
	s.Fail(http.MethodPatch, nodesPath+"/node-a/status", http.StatusConflict, 1)
	s.Fail(http.MethodPatch, nodesPath+"/node-a/status", http.StatusInternalServerError, 1)
	now = now.Add(time.Minute)
	w.Observe(&state.State{Faults: []state.Fault{xid79}})
	waitFor(t, "the True condition", func() bool { return w.Written().Status == "True" })
	got := conditions(t, s, "node-a")[DefaultType]
	if got["status"] != "True" || got["reason"] != "GPU1Xid79" || !strings.Contains(got["message"].(string), xid79.UUID) ||
		!strings.Contains(got["message"].(string), "XID 79 (GPU has fallen off the bus)") || got["lastTransitionTime"] != "2026-12-06T10:01:00Z" {
		t.Errorf("XID 79: %v", got)
	}
	if n := s.Requests()["PATCH "+nodesPath+"/node-a/status"] - before; n != 3 {
		t.Errorf("%d patches for the fault, want 3 (a conflict and a server error tried again at once)", n)
	}

	// Refused (RBAC): down, tried again with backoff, up once allowed.
	s.Fail(http.MethodPatch, nodesPath+"/node-a/status", http.StatusForbidden, 3)
	now = now.Add(time.Minute)
	second := state.Fault{GPU: 3, UUID: "GPU-3", Kind: state.FaultRowRemapFailed, GPUInstance: -1}
	w.Observe(&state.State{Faults: []state.Fault{xid79, second}})
	waitFor(t, "the writer down", func() bool { return !w.CollectorStatus().Up })
	waitFor(t, "the writer up again", func() bool { return w.CollectorStatus().Up })
	got = conditions(t, s, "node-a")[DefaultType]
	if got["reason"] != "GPU1Xid79And1More" || !strings.Contains(got["message"].(string), "GPU 3 (GPU-3): row remapping failed") ||
		got["lastTransitionTime"] != "2026-12-06T10:01:00Z" || got["lastHeartbeatTime"] != "2026-12-06T10:02:00Z" {
		t.Errorf("two faults: %v; want the first's reason and both in the message, the transition of 10:01 kept", got)
	}

	if _, ok := conditions(t, s, "node-b")[DefaultType]; ok || s.Requests()["PATCH "+nodesPath+"/node-b/status"] != 0 {
		t.Error("node-b was written")
	}
	for k := range s.Requests() {
		if !strings.HasPrefix(k, "PATCH "+nodesPath+"/node-a/status") {
			t.Errorf("request %s: the writer only patches its node's status (it never reads the node)", k)
		}
	}
}

// An unchanged condition is not written again before the heartbeat.
func TestWriterWritesOnChange(t *testing.T) {
	s := apiServer(t)
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	w := writer(t, s, &now)
	for i := 0; i < 20; i++ {
		w.Observe(&state.State{})
	}
	waitFor(t, "the condition", func() bool { return w.Written() != nil })
	time.Sleep(100 * time.Millisecond)
	if n := s.Requests()["PATCH "+nodesPath+"/node-a/status"]; n != 1 {
		t.Errorf("%d patches for 20 samples of the same condition, want 1", n)
	}
}

func TestDesiredMessageBounded(t *testing.T) {
	var faults []state.Fault
	for i := 0; i < 64; i++ {
		f := xid79
		f.GPU = i
		faults = append(faults, f)
	}
	c := Desired(DefaultType, faults)
	if len(c.Message) > maxMessage || !strings.HasSuffix(c.Message, "...") || c.Reason != "GPU0Xid79And63More" {
		t.Errorf("64 faults: reason %q, message of %d bytes", c.Reason, len(c.Message))
	}
}

func TestNewNeedsNodeName(t *testing.T) {
	s := apiServer(t)
	c, _ := s.Client()
	if _, err := New(Config{Client: c}); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("no node name: %v", err)
	}
}
