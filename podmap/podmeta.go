package podmap

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
)

// PodsResource is the resource the watch lists: core/v1 pods, read as
// metadata only (PartialObjectMetadata), the same RBAC verbs as full pods.
var PodsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// PodMeta is what the API server says of one pod beyond what the kubelet's
// PodResources API gives: its UID and labels.
type PodMeta struct {
	UID string
	// Labels are the pod's labels that the allowlist lets through (all of
	// them without one); nil unless MetaConfig.Labels.
	Labels map[string]string
}

// MetaConfig configures a MetaWatcher.
type MetaConfig struct {
	// Client talks to the API server. It asks for pods' metadata only: the
	// API server sends no spec or status, and the exporter carries no
	// typed clients or API types it would not use.
	Client metadata.Interface
	// NodeName is this node: only its pods are listed and watched (a field
	// selector on spec.nodeName), never the cluster's.
	NodeName string
	// Labels keeps each pod's labels (UIDs are always kept).
	Labels bool
	// LabelAllowlist, when not empty, keeps only the labels whose key one
	// of the expressions matches (dcgm-exporter's
	// --kubernetes-pod-label-allowlist-regex; unanchored, as there).
	LabelAllowlist []*regexp.Regexp
	// Logger receives the watch's state changes.
	Logger zerolog.Logger
}

// ParseLabelAllowlist compiles dcgm-exporter's allowlist: each value holds
// one or more expressions separated by commas, as its
// --kubernetes-pod-label-allowlist-regex and its environment variable take
// them. An expression that does not compile is an error naming it.
func ParseLabelAllowlist(values []string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	var errs []error
	for _, v := range values {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			re, err := regexp.Compile(p)
			if err != nil {
				errs = append(errs, fmt.Errorf("pod label allowlist expression %q: %w", p, err))
				continue
			}
			out = append(out, re)
		}
	}
	return out, errors.Join(errs...)
}

// MetaWatcher keeps the UIDs and labels of this node's pods from a watch
// on the API server (client-go's informer over the metadata API: one list,
// then a watch that resumes by itself). Lookup reads its cache and never calls the API
// server, so nothing of it happens on the scrape or sample path.
type MetaWatcher struct {
	cfg      MetaConfig
	informer cache.SharedIndexInformer
	synced   chan struct{}
	syncOnce sync.Once
	// watchErr is the watch's last error logged: each new one is logged
	// once.
	watchErr atomic.Pointer[string]
}

// NewMetaWatcher checks cfg and builds the watcher; Run starts it.
func NewMetaWatcher(cfg MetaConfig) (*MetaWatcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("podmap: pod metadata needs an API server client")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("podmap: pod metadata needs the node's name (--node-name, NODE_NAME): only this node's pods are watched")
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	pods := cfg.Client.Resource(PodsResource)
	// The client says whether it streams the first list as a watch
	// (client-go's WatchList); one that does not gets a plain list.
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pods.Watch(ctx, o)
		},
	}, cfg.Client)
	w := &MetaWatcher{cfg: cfg, synced: make(chan struct{}),
		informer: cache.NewSharedIndexInformer(lw, &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})}
	// The cache keeps what Lookup reads and no more: a pod's annotations
	// and managed fields are most of its metadata.
	if err := w.informer.SetTransform(w.trim); err != nil {
		return nil, err
	}
	if err := w.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		msg := err.Error()
		if prev := w.watchErr.Swap(&msg); prev == nil || *prev != msg {
			cfg.Logger.Warn().Err(err).Str("node", cfg.NodeName).Msg("watching this node's pods on the API server failed; pod UIDs and labels stay as last seen, retrying")
		}
	}); err != nil {
		return nil, err
	}
	return w, nil
}

// trim keeps a pod's name, namespace, UID and allowed labels.
func (w *MetaWatcher) trim(obj any) (any, error) {
	p, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil // a deleted pod's tombstone
	}
	t := &metav1.PartialObjectMetadata{TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}}
	if w.cfg.Labels {
		t.Labels = w.allowed(p.Labels)
	}
	return t, nil
}

// allowed are the labels the allowlist lets through.
func (w *MetaWatcher) allowed(labels map[string]string) map[string]string {
	if len(w.cfg.LabelAllowlist) == 0 {
		return maps.Clone(labels)
	}
	out := map[string]string{}
	for k, v := range labels {
		for _, re := range w.cfg.LabelAllowlist {
			if re.MatchString(k) {
				out[k] = v
				break
			}
		}
	}
	return out
}

// Run lists and watches this node's pods until ctx is done.
func (w *MetaWatcher) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() { defer close(done); w.informer.RunWithContext(ctx) }()
	start := time.Now()
	if cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		w.syncOnce.Do(func() { close(w.synced) })
		w.cfg.Logger.Info().Str("node", w.cfg.NodeName).Int("pods", len(w.informer.GetStore().ListKeys())).Dur("took", time.Since(start)).
			Msg("watching this node's pods on the API server for their UIDs and labels")
	}
	<-ctx.Done()
	<-done
}

// FirstRefresh is closed once the first list of this node's pods is in the
// cache: the exporter's first page waits for it (up to a bound), so that
// the series do not change their labels right after a start.
func (w *MetaWatcher) FirstRefresh() <-chan struct{} { return w.synced }

// Synced reports whether the first list is in the cache.
func (w *MetaWatcher) Synced() bool { return w.informer.HasSynced() }

// Lookup returns what the cache holds of a pod; it never calls the API
// server.
func (w *MetaWatcher) Lookup(namespace, name string) (PodMeta, bool) {
	obj, ok, err := w.informer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return PodMeta{}, false
	}
	p, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return PodMeta{}, false
	}
	return PodMeta{UID: string(p.UID), Labels: p.Labels}, true
}
