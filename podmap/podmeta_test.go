package podmap

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
)

// pod is a pod's metadata as the API server's metadata API serves it, with
// the annotations and managed fields a real pod carries.
func pod(ns, name, uid string, labels map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + uid), Labels: labels,
			Annotations:   map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"spec":{}}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}},
	}
}

func fakeClient(t *testing.T, pods ...runtime.Object) *fake.FakeMetadataClient {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewSimpleMetadataClient(scheme, pods...)
}

// The watcher lists and watches this node's pods only (a field selector on
// spec.nodeName: client-go's fake does not filter by it, so the test reads
// the selector the requests carry), keeps their UIDs and allowed labels,
// and follows changes without a call per lookup.
func TestMetaWatcher(t *testing.T) {
	client := fakeClient(t,
		pod("ml", "train-0", "a", map[string]string{"app.kubernetes.io/name": "train", "team": "research"}),
	)
	// The reactors run on the informer's goroutines.
	var mu sync.Mutex
	var selectors []string
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(selectors) }
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		selectors = append(selectors, "list "+a.(k8stesting.ListAction).GetListRestrictions().Fields.String())
		return false, nil, nil
	})
	client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		selectors = append(selectors, "watch "+a.(k8stesting.WatchAction).GetWatchRestrictions().Fields.String())
		return false, nil, nil
	})
	allow, err := ParseLabelAllowlist([]string{`^app\.kubernetes\.io/,^tier$`})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewMetaWatcher(MetaConfig{Client: client, NodeName: "node-a", Labels: true, LabelAllowlist: allow})
	if err != nil {
		t.Fatal(err)
	}
	runSynced(t, w)

	m, ok := w.Lookup("ml", "train-0")
	if !ok || m.UID != "uid-a" || len(m.Labels) != 1 || m.Labels["app.kubernetes.io/name"] != "train" {
		t.Errorf("train-0: %+v %v; want uid-a with app.kubernetes.io/name alone (team is not allowed)", m, ok)
	}
	// The watch starts after the first list is in the cache.
	waitUntil(t, "a list and a watch", func() bool { return len(seen()) >= 2 })
	for _, s := range seen() {
		if _, sel, _ := strings.Cut(s, " "); sel != "spec.nodeName=node-a" {
			t.Errorf("%s: a request for pods with field selector %q, want spec.nodeName=node-a", s, sel)
		}
	}
	// The cache keeps no annotations or managed fields: most of a pod's
	// metadata is not held.
	objs := w.informer.GetStore().List()
	if p := objs[0].(*metav1.PartialObjectMetadata); len(p.Annotations)+len(p.ManagedFields) != 0 {
		t.Errorf("the cache keeps the pod's annotations or managed fields: %+v", p.ObjectMeta)
	}

	// A new pod, a label change and a deletion come through the watch.
	ctx2 := context.Background()
	pods := client.Resource(PodsResource).Namespace("ml").(fake.MetadataClient)
	if _, err := pods.CreateFake(pod("ml", "train-1", "b", map[string]string{"tier": "gold"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "train-1 in the cache", func() bool { m, ok := w.Lookup("ml", "train-1"); return ok && m.Labels["tier"] == "gold" })
	up := pod("ml", "train-0", "a", map[string]string{"app.kubernetes.io/name": "train-v2"})
	if _, err := pods.UpdateFake(up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "train-0's new label", func() bool {
		m, _ := w.Lookup("ml", "train-0")
		return m.Labels["app.kubernetes.io/name"] == "train-v2"
	})
	if err := client.Resource(PodsResource).Namespace("ml").Delete(ctx2, "train-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "train-1 gone", func() bool { _, ok := w.Lookup("ml", "train-1"); return !ok })
}

// Without Labels, only the UID is kept.
func TestMetaWatcherUIDOnly(t *testing.T) {
	client := fakeClient(t, pod("ml", "train-0", "a", map[string]string{"team": "research"}))
	w, err := NewMetaWatcher(MetaConfig{Client: client, NodeName: "node-a"})
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
	if _, err := NewMetaWatcher(MetaConfig{Client: fakeClient(t)}); err == nil {
		t.Error("no node name accepted")
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
