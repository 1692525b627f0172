package podmap

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakeapiserver"
)

// pod is a pod as the API server holds it, with the annotations a real pod
// carries, on node.
func pod(ns, name, uid, node string, labels map[string]string) fakeapiserver.Object {
	l := map[string]any{}
	for k, v := range labels {
		l[k] = v
	}
	return fakeapiserver.Object{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"namespace": ns, "name": name, "uid": "uid-" + uid, "labels": l,
			"annotations": map[string]any{"kubectl.kubernetes.io/last-applied-configuration": `{"spec":{}}`}},
		"spec": map[string]any{"nodeName": node, "containers": []any{map[string]any{"name": "main"}}}}
}

// apiServer is a fake API server serving pods (field selector
// spec.nodeName) over HTTP, closed when the test ends.
func apiServer(t *testing.T, pods ...fakeapiserver.Object) *fakeapiserver.Server {
	t.Helper()
	s := fakeapiserver.New()
	t.Cleanup(s.Close)
	s.Serve(PodsPath, "spec.nodeName")
	s.Set(PodsPath, pods)
	return s
}

func metaConfig(t *testing.T, s *fakeapiserver.Server, labels bool) MetaConfig {
	t.Helper()
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	return MetaConfig{Client: c, NodeName: "node-a", Labels: labels}
}

// The watcher lists and watches this node's pods only (the field
// selector: the other node's pod never shows), keeps their UIDs and
// allowed labels, and follows additions, label changes and deletions
// through the watch without a call per lookup.
func TestMetaWatcher(t *testing.T) {
	srv := apiServer(t,
		pod("ml", "train-0", "a", "node-a", map[string]string{"app.kubernetes.io/name": "train", "team": "research"}),
		pod("ml", "elsewhere", "z", "node-b", map[string]string{"app.kubernetes.io/name": "other"}),
	)
	allow, err := ParseLabelAllowlist([]string{`^app\.kubernetes\.io/,^tier$`})
	if err != nil {
		t.Fatal(err)
	}
	cfg := metaConfig(t, srv, true)
	cfg.LabelAllowlist = allow
	w, err := NewMetaWatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runSynced(t, w)

	m, ok := w.Lookup("ml", "train-0")
	if !ok || m.UID != "uid-a" || len(m.Labels) != 1 || m.Labels["app.kubernetes.io/name"] != "train" {
		t.Errorf("train-0: %+v %v; want uid-a with app.kubernetes.io/name alone (team is not allowed)", m, ok)
	}
	if _, ok := w.Lookup("ml", "elsewhere"); ok {
		t.Error("a pod of another node is in the cache: the field selector was not applied")
	}

	// A new pod, a label change and a deletion come through the watch.
	train0 := pod("ml", "train-0", "a", "node-a", map[string]string{"app.kubernetes.io/name": "train", "team": "research"})
	train1 := pod("ml", "train-1", "b", "node-a", map[string]string{"tier": "gold"})
	other := pod("ml", "elsewhere", "z", "node-b", nil)
	srv.Set(PodsPath, []fakeapiserver.Object{train0, train1, other})
	waitUntil(t, "train-1 in the cache", func() bool { m, ok := w.Lookup("ml", "train-1"); return ok && m.Labels["tier"] == "gold" })
	train0 = pod("ml", "train-0", "a", "node-a", map[string]string{"app.kubernetes.io/name": "train-v2"})
	srv.Set(PodsPath, []fakeapiserver.Object{train0, train1, other})
	waitUntil(t, "train-0's new label", func() bool {
		m, _ := w.Lookup("ml", "train-0")
		return m.Labels["app.kubernetes.io/name"] == "train-v2"
	})
	srv.Set(PodsPath, []fakeapiserver.Object{train0, other})
	waitUntil(t, "train-1 gone", func() bool { _, ok := w.Lookup("ml", "train-1"); return !ok })

	// The first list came once; everything after it through the watch.
	if n := srv.Requests()["GET "+PodsPath]; n < 2 {
		t.Errorf("%d requests for pods, want a list and a watch at least", n)
	}
}

// A watch whose version the API server no longer has (410 Gone, as after
// etcd's compaction) lists again and misses nothing that changed
// meanwhile.
func TestMetaWatcherListsAgainAfterGone(t *testing.T) {
	srv := apiServer(t, pod("ml", "a", "a", "node-a", nil))
	w, err := NewMetaWatcher(metaConfig(t, srv, false))
	if err != nil {
		t.Fatal(err)
	}
	runSynced(t, w)
	srv.Compact()
	srv.Set(PodsPath, []fakeapiserver.Object{pod("ml", "b", "b", "node-a", nil)})
	waitUntil(t, "the pod created around the compaction", func() bool {
		_, a := w.Lookup("ml", "a")
		b, ok := w.Lookup("ml", "b")
		return !a && ok && b.UID == "uid-b"
	})
}

// Without Labels, only the UID is kept.
func TestMetaWatcherUIDOnly(t *testing.T) {
	srv := apiServer(t, pod("ml", "train-0", "a", "node-a", map[string]string{"team": "research"}))
	w, err := NewMetaWatcher(metaConfig(t, srv, false))
	if err != nil {
		t.Fatal(err)
	}
	runSynced(t, w)
	if m, ok := w.Lookup("ml", "train-0"); !ok || m.UID != "uid-a" || m.Labels != nil {
		t.Errorf("train-0: %+v %v; want the UID without labels", m, ok)
	}
}

// runSynced runs w until the test ends and waits for its first list.
func runSynced(t *testing.T, w *MetaWatcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-w.FirstRefresh():
	case <-time.After(waitTimeout):
		t.Fatalf("the watcher did not list the pods within %s", waitTimeout)
	}
}

func TestMetaWatcherConfig(t *testing.T) {
	srv := apiServer(t)
	cfg := metaConfig(t, srv, false)
	cfg.NodeName = ""
	if _, err := NewMetaWatcher(cfg); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("no node name: %v, want an error naming --node-name", err)
	}
	if _, err := NewMetaWatcher(MetaConfig{NodeName: "n"}); err == nil {
		t.Error("no client accepted")
	}
	if _, err := ParseLabelAllowlist([]string{"^ok$,([bad"}); err == nil || !regexp.MustCompile(`\(\[bad`).MatchString(err.Error()) {
		t.Errorf("a bad expression: %v; want an error naming it", err)
	}
	res, err := ParseLabelAllowlist([]string{"a, b", "", "c"})
	if err != nil || len(res) != 3 {
		t.Errorf("allowlist a, b / c: %v %v; want three expressions", res, err)
	}
}
