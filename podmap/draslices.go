package podmap

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

// ResourceSlicesPath is the collection of DRA ResourceSlices:
// resource.k8s.io/v1, GA (and served by default) since Kubernetes 1.34.
const ResourceSlicesPath = "/apis/resource.k8s.io/v1/resourceslices"

// SliceDevice is one device a DRA driver publishes in a ResourceSlice of
// this node, with what the NVIDIA DRA driver's attributes say of it and
// the taints on it.
type SliceDevice struct {
	Driver, Pool, Name string
	// Type is the attribute type: gpu, mig or vfio (NVIDIA's driver).
	Type string
	// UUID is the GPU's (GPU-...) or a static MIG device's (MIG-...)
	// UUID; a dynamic MIG device has none (KEP-4815: it exists once a
	// claim has it).
	UUID string
	// ParentUUID and Profile are a MIG device's GPU and MIG profile.
	ParentUUID, Profile string
	Taints              []SliceTaint
}

// SliceTaint is a device taint (resource.k8s.io/v1 DeviceTaint).
type SliceTaint struct {
	Key, Value string
	// Effect is None, NoSchedule or NoExecute.
	Effect string
}

// SliceConfig configures a SliceWatcher.
type SliceConfig struct {
	// Client talks to the API server (RBAC: get, list and watch
	// resourceslices in resource.k8s.io).
	Client *kubeapi.Client
	// NodeName is this node: only its slices are listed and watched (the
	// API server's spec.nodeName field selector), never the cluster's.
	NodeName string
	// Drivers are extra DRA driver names whose devices are GPUs, beside
	// NVIDIA's (DRADriverNVIDIA, DRADriverNVIDIALegacy).
	Drivers []string
	Logger  zerolog.Logger
}

// SliceWatcher keeps the devices of this node's ResourceSlices from a
// list-watch on the API server. Devices reads its cache and never calls
// the API server: nothing of it happens on the scrape or sample path.
type SliceWatcher struct {
	cfg      SliceConfig
	drivers  map[string]bool
	synced   atomic.Bool
	watchErr atomic.Pointer[string]

	mu     sync.RWMutex
	slices map[string]sliceObject // by name
	// devices is what Devices returns, rebuilt on each change.
	devices []SliceDevice
}

// NewSliceWatcher checks cfg and builds the watcher; Run starts it.
func NewSliceWatcher(cfg SliceConfig) (*SliceWatcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("podmap: the ResourceSlice watch needs an API server client")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("podmap: the ResourceSlice watch needs the node's name (--node-name, NODE_NAME): only this node's slices are watched")
	}
	d := map[string]bool{DRADriverNVIDIA: true, DRADriverNVIDIALegacy: true}
	for _, n := range cfg.Drivers {
		d[n] = true
	}
	return &SliceWatcher{cfg: cfg, drivers: d, slices: map[string]sliceObject{}}, nil
}

// sliceObject is what the watcher reads of a ResourceSlice (v1: no
// "basic" wrapper around a device, unlike v1beta1).
type sliceObject struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Driver   string  `json:"driver"`
		NodeName *string `json:"nodeName"`
		Pool     struct {
			Name       string `json:"name"`
			Generation int64  `json:"generation"`
		} `json:"pool"`
		Devices []struct {
			Name       string `json:"name"`
			Attributes map[string]struct {
				String *string `json:"string"`
			} `json:"attributes"`
			Taints []SliceTaint `json:"taints"`
		} `json:"devices"`
	} `json:"spec"`
}

func (w *SliceWatcher) decode(raw json.RawMessage) (sliceObject, bool) {
	var s sliceObject
	if err := json.Unmarshal(raw, &s); err != nil || s.Metadata.Name == "" {
		return s, false
	}
	return s, true
}

// Replace, Upsert and Delete are the list-watch's Sink.

// Replace takes the whole list.
func (w *SliceWatcher) Replace(items []json.RawMessage) {
	m := make(map[string]sliceObject, len(items))
	for _, raw := range items {
		if s, ok := w.decode(raw); ok {
			m[s.Metadata.Name] = s
		}
	}
	w.mu.Lock()
	w.slices = m
	w.rebuild()
	w.mu.Unlock()
	w.watchErr.Store(nil)
}

// Upsert takes a slice added or changed.
func (w *SliceWatcher) Upsert(raw json.RawMessage) {
	if s, ok := w.decode(raw); ok {
		w.mu.Lock()
		w.slices[s.Metadata.Name] = s
		w.rebuild()
		w.mu.Unlock()
		w.watchErr.Store(nil)
	}
}

// Delete drops a deleted slice.
func (w *SliceWatcher) Delete(raw json.RawMessage) {
	if s, ok := w.decode(raw); ok {
		w.mu.Lock()
		delete(w.slices, s.Metadata.Name)
		w.rebuild()
		w.mu.Unlock()
		w.watchErr.Store(nil)
	}
}

// attr is a string attribute of a device; the NVIDIA driver writes bare
// names (its own domain implied), others may qualify them.
func attr(attrs map[string]struct {
	String *string `json:"string"`
}, driver, name string) string {
	for _, k := range []string{name, driver + "/" + name} {
		if a, ok := attrs[k]; ok && a.String != nil {
			return *a.String
		}
	}
	return ""
}

// rebuild recomputes the device list (w.mu held): the GPU drivers'
// devices of each pool's newest generation, as the scheduler reads a pool
// (a slice of an older generation is on its way out while the driver
// republishes).
func (w *SliceWatcher) rebuild() {
	newest := map[[2]string]int64{}
	for _, s := range w.slices {
		k := [2]string{s.Spec.Driver, s.Spec.Pool.Name}
		if g, ok := newest[k]; !ok || s.Spec.Pool.Generation > g {
			newest[k] = s.Spec.Pool.Generation
		}
	}
	var out []SliceDevice
	for _, s := range w.slices {
		if !w.drivers[s.Spec.Driver] || s.Spec.Pool.Generation != newest[[2]string{s.Spec.Driver, s.Spec.Pool.Name}] {
			continue
		}
		for _, d := range s.Spec.Devices {
			out = append(out, SliceDevice{
				Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Name: d.Name,
				Type: attr(d.Attributes, s.Spec.Driver, "type"), UUID: attr(d.Attributes, s.Spec.Driver, "uuid"),
				ParentUUID: attr(d.Attributes, s.Spec.Driver, "parentUUID"), Profile: attr(d.Attributes, s.Spec.Driver, "profile"),
				Taints: slices.Clone(d.Taints),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Driver != b.Driver {
			return a.Driver < b.Driver
		}
		if a.Pool != b.Pool {
			return a.Pool < b.Pool
		}
		return a.Name < b.Name
	})
	w.devices = out
}

// Run lists and watches this node's ResourceSlices until ctx is done.
func (w *SliceWatcher) Run(ctx context.Context) {
	start := time.Now()
	w.cfg.Client.Run(ctx, kubeapi.ListWatch{Path: ResourceSlicesPath, FieldSelector: "spec.nodeName=" + w.cfg.NodeName}, w, kubeapi.WatchOptions{
		OnSynced: func() {
			w.synced.Store(true)
			w.mu.RLock()
			n, d := len(w.slices), len(w.devices)
			w.mu.RUnlock()
			w.cfg.Logger.Info().Str("node", w.cfg.NodeName).Int("slices", n).Int("gpu_devices", d).Dur("took", time.Since(start)).
				Msg("watching this node's DRA ResourceSlices on the API server for device taints")
		},
		OnError: func(err error) {
			msg := err.Error()
			if prev := w.watchErr.Swap(&msg); prev == nil || *prev != msg {
				w.cfg.Logger.Warn().Err(err).Str("node", w.cfg.NodeName).Msg("watching this node's DRA ResourceSlices failed; device taints stay as last seen, retrying")
			}
		},
	})
}

// Devices returns the GPU devices of this node's slices as last seen,
// whether the first list has come, and the watch's last error since the
// API server last answered with slices ("" when it has since).
func (w *SliceWatcher) Devices() (devices []SliceDevice, synced bool, lastErr string) {
	w.mu.RLock()
	devices = w.devices
	w.mu.RUnlock()
	if p := w.watchErr.Load(); p != nil {
		lastErr = *p
	}
	return devices, w.synced.Load(), lastErr
}
