package podmap

import (
	"context"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakeapiserver"
)

// slice is a ResourceSlice (resource.k8s.io/v1) of driver on node, in
// pool generation gen, with devices.
func slice(name, driver, node string, gen int, devices ...any) fakeapiserver.Object {
	return fakeapiserver.Object{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"driver": driver, "nodeName": node,
			"pool": map[string]any{"name": node, "generation": gen, "resourceSliceCount": 1}, "devices": devices}}
}

func device(name string, attrs map[string]string, taints ...map[string]any) map[string]any {
	a := map[string]any{}
	for k, v := range attrs {
		a[k] = map[string]any{"string": v}
	}
	d := map[string]any{"name": name, "attributes": a}
	if len(taints) > 0 {
		l := make([]any, len(taints))
		for i, t := range taints {
			l[i] = t
		}
		d["taints"] = l
	}
	return d
}

// The watcher keeps this node's GPU devices (the field selector: another
// node's slice never shows; another driver's devices are left out), of
// each pool's newest generation only, with their attributes and taints,
// and follows changes through the watch.
func TestSliceWatcher(t *testing.T) {
	srv := fakeapiserver.New()
	t.Cleanup(srv.Close)
	srv.Serve(ResourceSlicesPath, "spec.nodeName", "spec.driver")
	xid := map[string]any{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}
	srv.Set(ResourceSlicesPath, []fakeapiserver.Object{
		slice("a-gpu", DRADriverNVIDIA, "node-a", 2,
			device("gpu-0", map[string]string{"type": "gpu", "uuid": "GPU-0"}, xid),
			device("gpu-1-mig-1g10gb-19-0", map[string]string{"type": "mig", "parentUUID": "GPU-1", "profile": "1g.10gb"})),
		slice("a-gpu-old", DRADriverNVIDIA, "node-a", 1, device("gpu-7", map[string]string{"type": "gpu", "uuid": "GPU-7"})),
		slice("a-nic", "nic.example.com", "node-a", 1, device("nic-0", nil)),
		slice("b-gpu", DRADriverNVIDIA, "node-b", 1, device("gpu-0", map[string]string{"type": "gpu", "uuid": "GPU-B0"})),
	})
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewSliceWatcher(SliceConfig{Client: c, NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "the first list", func() bool { _, synced, _ := w.Devices(); return synced })

	devs, _, lastErr := w.Devices()
	if lastErr != "" {
		t.Errorf("last error %q", lastErr)
	}
	if len(devs) != 2 {
		t.Fatalf("devices %+v; want gpu-0 and the MIG device of node-a's newest generation", devs)
	}
	if d := devs[0]; d.Name != "gpu-0" || d.Type != "gpu" || d.UUID != "GPU-0" || d.Pool != "node-a" || d.Driver != DRADriverNVIDIA ||
		len(d.Taints) != 1 || d.Taints[0] != (SliceTaint{Key: "gpu.nvidia.com/xid", Value: "48", Effect: "NoSchedule"}) {
		t.Errorf("gpu-0: %+v", d)
	}
	if d := devs[1]; d.Type != "mig" || d.UUID != "" || d.ParentUUID != "GPU-1" || d.Profile != "1g.10gb" || len(d.Taints) != 0 {
		t.Errorf("the dynamic MIG device: %+v", d)
	}

	// The taint is lifted through the watch.
	srv.Set(ResourceSlicesPath, []fakeapiserver.Object{
		slice("a-gpu", DRADriverNVIDIA, "node-a", 2, device("gpu-0", map[string]string{"type": "gpu", "uuid": "GPU-0"})),
	})
	waitUntil(t, "the taint lifted", func() bool {
		devs, _, _ := w.Devices()
		return len(devs) == 1 && len(devs[0].Taints) == 0
	})
	if n := srv.Requests()["GET "+ResourceSlicesPath]; n > 3 {
		t.Errorf("%d GETs of the slices: the watch should carry the change, not a list per change", n)
	}
}

func TestSliceWatcherConfig(t *testing.T) {
	if _, err := NewSliceWatcher(SliceConfig{NodeName: "n"}); err == nil {
		t.Error("no client: no error")
	}
	srv := fakeapiserver.New()
	t.Cleanup(srv.Close)
	c, _ := srv.Client()
	if _, err := NewSliceWatcher(SliceConfig{Client: c}); err == nil {
		t.Error("no node name: no error")
	}
}
