package apiserver

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nodecondition"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

var (
	serviceAccountsGVR = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	vapGVR             = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}
	vapBindingGVR      = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}
)

// docsPolicy is docs/node-condition.md's ValidatingAdmissionPolicy block, as
// its objects.
func docsPolicy(t *testing.T) []map[string]any {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "node-condition.md"))
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, part := range strings.Split(string(b), "```yaml\n")[1:] {
		text, _, _ := strings.Cut(part, "```")
		if strings.Contains(text, "kind: ValidatingAdmissionPolicy\n") {
			block = text
		}
	}
	if block == "" {
		t.Fatal("docs/node-condition.md has no ValidatingAdmissionPolicy block")
	}
	var out []map[string]any
	for _, doc := range strings.Split(block, "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("docs/node-condition.md's policy: %v", err)
		}
		out = append(out, o)
	}
	return out
}

// tokenFor is a service account token the API server issues bound to a
// pod: it carries the pod's node (authentication.kubernetes.io/node-name).
func tokenFor(t *testing.T, c *cluster, ns, sa, pod string) string {
	t.Helper()
	admin := c.client(t, adminToken)
	p, err := admin.Resource(podsGVR).Namespace(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The dynamic client names the service account by the object's name.
	tr := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"metadata": map[string]any{"name": sa},
		"spec": map[string]any{"expirationSeconds": int64(3600),
			"boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": string(p.GetUID())}}}}
	got, err := admin.Resource(serviceAccountsGVR).Namespace(ns).Create(context.Background(), tr, metav1.CreateOptions{}, "token")
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, pod, err)
	}
	tok, _, _ := unstructured.NestedString(got.Object, "status", "token")
	if tok == "" {
		t.Fatalf("no token in %v", got.Object)
	}
	return tok
}

// writes runs the node condition's writer for node with client k and
// reports whether its first write succeeded.
func writes(t *testing.T, k *kubeapi.Client, node string) (bool, string) {
	t.Helper()
	w, err := nodecondition.New(nodecondition.Config{Client: k, NodeName: node, Log: zerolog.New(io.Discard), BackoffMin: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	w.Observe(&state.State{})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if w.Written() != nil {
			return true, ""
		}
		if st := w.CollectorStatus(); !st.Up {
			return false, "down"
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false, "no write within 10s"
}

// docs/node-condition.md's ValidatingAdmissionPolicy on a real API server, with
// the tokens it issues for the exporter's pods: the node condition's writer
// on node-a writes node-a's condition, and is refused node-b's; a write of
// the kubelet's Ready condition is refused on its own node too.
func TestNodeConditionAdmissionPolicy(t *testing.T) {
	c := startCluster(t)
	admin := c.client(t, adminToken)
	const ns = "gpu-pool-exporter"
	apply(t, admin, namespacesGVR, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	apply(t, admin, serviceAccountsGVR, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"namespace": ns, "name": "gpu-pool-exporter"}})
	createNode(t, admin, "node-a")
	createNode(t, admin, "node-b")
	for _, n := range []string{"a", "b"} {
		apply(t, admin, podsGVR, map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"namespace": ns, "name": "exporter-" + n},
			"spec": map[string]any{"nodeName": "node-" + n, "serviceAccountName": "gpu-pool-exporter", "containers": []any{map[string]any{"name": "exporter", "image": "gpu-pool-exporter"}}}})
	}
	apply(t, admin, clusterRolesGVR, map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "gpu-pool-exporter-node-condition"},
		"rules":    []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"nodes/status"}, "verbs": []any{"patch"}}}})
	apply(t, admin, clusterRoleBindingsGVR, map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "gpu-pool-exporter-node-condition"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-pool-exporter-node-condition"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "namespace": ns, "name": "gpu-pool-exporter"}}})
	k := c.metaClient(t, tokenFor(t, c, ns, "gpu-pool-exporter", "exporter-a"))

	// Without the policy the token may write any node's status.
	if ok, why := writes(t, k, "node-b"); !ok {
		t.Fatalf("without the policy, node-b's status: %s (is the RBAC wrong?)", why)
	}
	for _, o := range docsPolicy(t) {
		gvr := vapGVR
		if o["kind"] == "ValidatingAdmissionPolicyBinding" {
			gvr = vapBindingGVR
		}
		apply(t, admin, gvr, o)
	}
	// The policy takes effect once the API server has compiled it.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, _ := writes(t, k, "node-b")
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the policy did not refuse node-b's status within 60s")
		}
		time.Sleep(500 * time.Millisecond)
	}
	err := k.Patch(context.Background(), "/api/v1/nodes/node-b/status", kubeapi.StrategicMergePatch,
		[]byte(`{"status":{"conditions":[{"type":"GPUPoolExporterFault","status":"True","reason":"Test","message":"test"}]}}`), nil)
	if !kubeapi.IsStatus(err, http.StatusForbidden) || !strings.Contains(err.Error(), "may only write the status of its own node") {
		t.Errorf("node-b's status from node-a's exporter: %v, want 403 naming its own node", err)
	}
	if ok, why := writes(t, k, "node-a"); !ok {
		t.Errorf("node-a's status from node-a's exporter: %s", why)
	}
	if c := conditions(t, admin, "node-a")[conditionType]; c == nil || c["status"] != "False" {
		t.Errorf("node-a's condition: %v", c)
	}
	err = k.Patch(context.Background(), "/api/v1/nodes/node-a/status", kubeapi.StrategicMergePatch,
		[]byte(`{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Test","message":"test"}]}}`), nil)
	if !kubeapi.IsStatus(err, http.StatusForbidden) || !strings.Contains(err.Error(), "may only write its own condition") {
		t.Errorf("the kubelet's Ready condition from the exporter: %v, want 403", err)
	}
	if r := conditions(t, admin, "node-a")["Ready"]; r["status"] != "True" {
		t.Errorf("Ready after the refused write: %v", r)
	}
}
