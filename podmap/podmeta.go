package podmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

// PodsPath is the collection the watch lists: core/v1 pods, read as
// metadata only (PartialObjectMetadata), the same RBAC verbs as full pods.
const PodsPath = "/api/v1/pods"

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
	// API server sends no spec or status.
	Client *kubeapi.Client
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
// on the API server (kubeapi's list-watch over the metadata API: one list,
// then a watch that resumes by itself). Lookup reads its cache and never
// calls the API server, so nothing of it happens on the scrape or sample
// path.
type MetaWatcher struct {
	cfg      MetaConfig
	synced   chan struct{}
	syncOnce sync.Once
	isSynced atomic.Bool

	mu   sync.RWMutex
	pods map[string]PodMeta // namespace/name -> what Lookup returns
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
	return &MetaWatcher{cfg: cfg, synced: make(chan struct{}), pods: map[string]PodMeta{}}, nil
}

// podObject is what the watcher reads of a pod's metadata.
type podObject struct {
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		UID       string            `json:"uid"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
}

// decode reads a pod and keeps its UID and allowed labels: a pod's
// annotations and managed fields, most of its metadata, are dropped as
// they arrive.
func (w *MetaWatcher) decode(raw json.RawMessage) (string, PodMeta, bool) {
	var p podObject
	if err := json.Unmarshal(raw, &p); err != nil || p.Metadata.Name == "" {
		return "", PodMeta{}, false
	}
	m := PodMeta{UID: p.Metadata.UID}
	if w.cfg.Labels {
		m.Labels = w.allowed(p.Metadata.Labels)
	}
	return p.Metadata.Namespace + "/" + p.Metadata.Name, m, true
}

// Replace, Upsert and Delete are the list-watch's Sink.

// Replace takes the whole list.
func (w *MetaWatcher) Replace(items []json.RawMessage) {
	pods := make(map[string]PodMeta, len(items))
	for _, raw := range items {
		if k, m, ok := w.decode(raw); ok {
			pods[k] = m
		}
	}
	w.mu.Lock()
	w.pods = pods
	w.mu.Unlock()
}

// Upsert takes a pod added or changed.
func (w *MetaWatcher) Upsert(raw json.RawMessage) {
	if k, m, ok := w.decode(raw); ok {
		w.mu.Lock()
		w.pods[k] = m
		w.mu.Unlock()
	}
}

// Delete drops a deleted pod.
func (w *MetaWatcher) Delete(raw json.RawMessage) {
	if k, _, ok := w.decode(raw); ok {
		w.mu.Lock()
		delete(w.pods, k)
		w.mu.Unlock()
	}
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
	start := time.Now()
	w.cfg.Client.Run(ctx, kubeapi.ListWatch{Path: PodsPath, FieldSelector: "spec.nodeName=" + w.cfg.NodeName, Metadata: true}, w, kubeapi.WatchOptions{
		OnSynced: func() {
			w.isSynced.Store(true)
			w.syncOnce.Do(func() { close(w.synced) })
			w.mu.RLock()
			n := len(w.pods)
			w.mu.RUnlock()
			w.cfg.Logger.Info().Str("node", w.cfg.NodeName).Int("pods", n).Dur("took", time.Since(start)).
				Msg("watching this node's pods on the API server for their UIDs and labels")
		},
		OnError: func(err error) {
			msg := err.Error()
			if prev := w.watchErr.Swap(&msg); prev == nil || *prev != msg {
				w.cfg.Logger.Warn().Err(err).Str("node", w.cfg.NodeName).Msg("watching this node's pods on the API server failed; pod UIDs and labels stay as last seen, retrying")
			}
		},
	})
}

// FirstRefresh is closed once the first list of this node's pods is in the
// cache: the exporter's first page waits for it (up to a bound), so that
// the series do not change their labels right after a start.
func (w *MetaWatcher) FirstRefresh() <-chan struct{} { return w.synced }

// Synced reports whether the first list is in the cache.
func (w *MetaWatcher) Synced() bool { return w.isSynced.Load() }

// Lookup returns what the cache holds of a pod; it never calls the API
// server.
func (w *MetaWatcher) Lookup(namespace, name string) (PodMeta, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	m, ok := w.pods[namespace+"/"+name]
	return m, ok
}
