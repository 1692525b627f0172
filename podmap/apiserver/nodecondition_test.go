package apiserver

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

var nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

const conditionType = "GPUPoolExporterFault"

// createNode creates a Node with the kubelet's Ready condition.
func createNode(t *testing.T, admin dynamic.Interface, name string) {
	t.Helper()
	n := apply(t, admin, nodesGVR, map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}})
	now := time.Now().UTC().Format(time.RFC3339)
	n.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady",
		"message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}}}
	if _, err := admin.Resource(nodesGVR).UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// conditions are a node's conditions by type.
func conditions(t *testing.T, admin dynamic.Interface, name string) map[string]map[string]any {
	t.Helper()
	n, err := admin.Resource(nodesGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	l, _, _ := unstructured.NestedSlice(n.Object, "status", "conditions")
	for _, c := range l {
		m := c.(map[string]any)
		out[m["type"].(string)] = m
	}
	return out
}

// managers are the field managers that wrote a node (its managedFields).
func managers(t *testing.T, admin dynamic.Interface, name string) []string {
	t.Helper()
	n, err := admin.Resource(nodesGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range n.GetManagedFields() {
		out = append(out, m.Manager)
	}
	return out
}

func waitCondition(t *testing.T, admin dynamic.Interface, node, what string, ok func(c map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c := conditions(t, admin, node)[conditionType]
		if c != nil && ok(c) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: no %s condition %s within 60s (now %v)", node, conditionType, what, c)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The node condition on a real API server, with the RBAC the chart grants
// it (patch nodes/status, nothing else): False on the exporter's own node
// from the start; an XID 79 (the GPU falls off the bus) makes it True, with
// the GPU, its UUID and the XID in reason and message, by the sample after
// the one that first shows the XID; the GPU answering again clears it.
// The kubelet's own condition, written meanwhile by another client, stays;
// another node is never written. With the API server away the exporter
// serves on, and writes the condition once it is back. Without
// --node-condition the exporter writes nothing, though it may.
func TestNodeConditionOnARealAPIServer(t *testing.T) {
	c := startCluster(t)
	admin := c.client(t, adminToken)
	grant(t, admin, "gpu-pool-exporter-node-condition", []any{map[string]any{"apiGroups": []any{""},
		"resources": []any{"nodes/status"}, "verbs": []any{"patch"}}})
	createNode(t, admin, "node-a")
	createNode(t, admin, "node-b")

	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	nodePath := filepath.Join(c.dir, "node-a.conf")
	writeNode(t, node, nodePath)
	kubeconfig := c.kubeconfig(t, exporterToken)
	a := startAgent(t, c.dir, nodePath, "--node-name=node-a", "--no-kubelet.enabled", "--node-condition", "--kubernetes.kubeconfig="+kubeconfig)

	cond := waitCondition(t, admin, "node-a", "False", func(c map[string]any) bool { return c["status"] == "False" })
	if cond["reason"] != "NoGPUFault" {
		t.Errorf("healthy node: reason %v, want NoGPUFault", cond["reason"])
	}

	// The kubelet goes on updating its own condition (a read-modify-write
	// of the whole list, retried on conflict, as client-go's UpdateStatus
	// with RetryOnConflict): the exporter's patches and these interleave.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var kubeletWrites, kubeletConflicts int
	wg.Go(func() {
		for ctx.Err() == nil {
			n, err := admin.Resource(nodesGVR).Get(ctx, "node-a", metav1.GetOptions{})
			if err != nil {
				continue
			}
			l, _, _ := unstructured.NestedSlice(n.Object, "status", "conditions")
			for _, x := range l {
				if m := x.(map[string]any); m["type"] == "Ready" {
					m["lastHeartbeatTime"] = time.Now().UTC().Format(time.RFC3339)
				}
			}
			_ = unstructured.SetNestedSlice(n.Object, l, "status", "conditions")
			_, err = admin.Resource(nodesGVR).UpdateStatus(ctx, n, metav1.UpdateOptions{})
			switch {
			case err == nil:
				kubeletWrites++
			case apierrors.IsConflict(err):
				kubeletConflicts++
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	defer func() { stop(); wg.Wait() }()

	a.waitRegistered()
	// XID 79 on GPU 1, which then falls off the bus.
	node.Events = append(node.Events, fakenvml.Event{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 79})
	writeNode(t, node, nodePath)
	first := a.waitPage("XID 79", func(p page) bool {
		_, ok := p.value("gpu_xid_errors_total", map[string]string{"gpu": "1", "xid": "79"})
		return ok
	})
	firstAt, _ := first.value("gpu_exporter_last_sample_timestamp_seconds", nil)
	a.waitPage("the sample after", func(p page) bool {
		at, _ := p.value("gpu_exporter_last_sample_timestamp_seconds", nil)
		return at > firstAt
	})
	cond = conditions(t, admin, "node-a")[conditionType]
	uuid := node.GPUs[1].UUID
	if cond["status"] != "True" || !strings.HasPrefix(cond["reason"].(string), "GPU1Xid79") ||
		!strings.Contains(cond["message"].(string), uuid) || !strings.Contains(cond["message"].(string), "XID 79") {
		t.Errorf("the sample after the one that first showed XID 79: condition %v; want True, reason GPU1Xid79..., the GPU's UUID %s and XID 79 in the message", cond, uuid)
	}
	transition := cond["lastTransitionTime"]
	node.GPUs[1].Lost = true
	writeNode(t, node, nodePath)
	a.waitPage("GPU 1 lost", func(p page) bool {
		v, ok := p.value("gpu_up", map[string]string{"gpu": "1", "gpu_instance": ""})
		return ok && v == 0
	})
	if cond := conditions(t, admin, "node-a")[conditionType]; cond["status"] != "True" || cond["lastTransitionTime"] != transition {
		t.Errorf("GPU 1 lost after its XID 79: %v; want still True since %v", cond, transition)
	}

	// GPU 1 answers again (reset): the condition clears.
	node.GPUs[1].Lost = false
	writeNode(t, node, nodePath)
	cond = waitCondition(t, admin, "node-a", "False again", func(c map[string]any) bool { return c["status"] == "False" })
	if cond["reason"] != "NoGPUFault" || cond["lastTransitionTime"] == transition {
		t.Errorf("recovered: %v; want reason NoGPUFault and a new lastTransitionTime", cond)
	}
	stop()
	wg.Wait()
	if kubeletWrites == 0 {
		t.Fatal("the kubelet's writer wrote nothing: the test did not interleave writes")
	}
	t.Logf("the kubelet's writer: %d writes, %d conflicts retried", kubeletWrites, kubeletConflicts)
	if r := conditions(t, admin, "node-a")["Ready"]; r == nil || r["status"] != "True" || r["reason"] != "KubeletReady" {
		t.Errorf("the kubelet's Ready condition after the exporter's patches: %v", r)
	}

	// The API server goes away; the exporter serves on and counts the
	// writes it cannot make; an XID 79 on GPU 0 meanwhile reaches the node
	// once the API server is back.
	c.stopAPIServer(t)
	node.Events = append(node.Events, fakenvml.Event{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 79})
	writeNode(t, node, nodePath)
	a.waitPage("XID 79 on GPU 0 and the writer down, the API server away", func(p page) bool {
		_, xid := p.value("gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "79"})
		up, _ := p.value("gpu_exporter_collector_up", map[string]string{"collector": "node_condition"})
		return xid && up == 0
	})
	c.startAPIServer(t)
	waitCondition(t, admin, "node-a", "True for GPU 0 after the API server came back", func(c map[string]any) bool {
		return c["status"] == "True" && strings.HasPrefix(c["reason"].(string), "GPU0Xid79")
	})
	a.waitPage("the writer up again", func(p page) bool {
		up, _ := p.value("gpu_exporter_collector_up", map[string]string{"collector": "node_condition"})
		return up == 1
	})

	// Never another node.
	if cond := conditions(t, admin, "node-b")[conditionType]; cond != nil {
		t.Errorf("node-b has the exporter's condition: %v", cond)
	}
	for _, m := range managers(t, admin, "node-b") {
		if strings.Contains(m, "gpu-pool-exporter") {
			t.Errorf("node-b was written by %s", m)
		}
	}

	// Without --node-condition: an exporter on node-b, allowed to patch,
	// sees an XID 79 and writes nothing.
	nodeB := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	pathB := filepath.Join(c.dir, "node-b.conf")
	writeNode(t, nodeB, pathB)
	b := startAgent(t, c.dir, pathB, "--node-name=node-b", "--no-kubelet.enabled", "--kubernetes.kubeconfig="+kubeconfig)
	b.waitRegistered()
	nodeB.Events = append(nodeB.Events, fakenvml.Event{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 79})
	writeNode(t, nodeB, pathB)
	p := b.waitPage("XID 79 on node-b", func(p page) bool {
		_, ok := p.value("gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "79"})
		return ok
	})
	for _, l := range p.find("gpu_exporter_collector_up", nil) {
		if l["collector"] == "node_condition" || l["collector"] == "dra_slices" {
			t.Errorf("without the flags the page has collector %s", l["collector"])
		}
	}
	time.Sleep(3 * time.Second) // three more samples
	if cond := conditions(t, admin, "node-b")[conditionType]; cond != nil {
		t.Errorf("without --node-condition node-b has the condition: %v", cond)
	}
	for _, m := range managers(t, admin, "node-b") {
		if strings.Contains(m, "gpu-pool-exporter") {
			t.Errorf("without --node-condition node-b was written by %s", m)
		}
	}
}
