package podmap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
)

// socketPath returns a unix socket path short enough for sun_path (t.TempDir
// can be too long on some systems).
func socketPath(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 80 {
		d, err := os.MkdirTemp("", "pr")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	return filepath.Join(dir, "kubelet.sock")
}

// startFake starts a fake kubelet and stops it when the test ends.
func startFake(t testing.TB) *fakekubelet.Server {
	t.Helper()
	srv := fakekubelet.New(socketPath(t))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// syncBuffer is a concurrency-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fastConfig is a config for tests: short intervals.
func fastConfig(socket string) Config {
	return Config{
		Socket:          socket,
		RefreshInterval: 20 * time.Millisecond,
		CallTimeout:     2 * time.Second,
		BackoffMin:      10 * time.Millisecond,
		BackoffMax:      50 * time.Millisecond,
	}
}

// runClient starts c.Run and stops it when the test ends, checking that Run
// returns once its context is done.
func runClient(t testing.TB, c *Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
}

func TestNewClientDefaults(t *testing.T) {
	c, err := NewClient(Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.Config()
	if cfg.Socket != DefaultSocket || cfg.RefreshInterval != DefaultRefreshInterval ||
		cfg.CallTimeout != DefaultCallTimeout || cfg.MaxRecvMsgSize != DefaultMaxRecvMsgSize ||
		cfg.BackoffMin != DefaultBackoffMin || cfg.BackoffMax != DefaultBackoffMax {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if DefaultMaxRecvMsgSize <= 4<<20 {
		t.Error("default receive limit is not above gRPC's 4 MiB")
	}
	s := c.Snapshot()
	if s == nil || s.Up || !s.Time.IsZero() || s.Holdings != nil {
		t.Errorf("initial snapshot = %+v", s)
	}
	c2, err := NewClient(Config{Socket: "unix:///run/x.sock"})
	if err != nil || c2.Config().Socket != "/run/x.sock" {
		t.Errorf("unix:// prefix: %v %v", c2, err)
	}
}

func TestNewClientInvalid(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{RefreshInterval: -1}, "refresh interval must not be negative"},
		{Config{CallTimeout: -time.Second}, "call timeout must not be negative"},
		{Config{MaxRecvMsgSize: -5}, "max receive message size must not be negative"},
		{Config{BackoffMin: time.Minute, BackoffMax: time.Second}, "minimum backoff 1m0s is above maximum backoff 1s"},
		{Config{BackoffMin: -1}, "minimum backoff must not be negative"},
		{Config{Socket: "/" + strings.Repeat("d", 120) + "/kubelet.sock"}, "unix socket paths must be at most 107"},
		{Config{ExtraResourceNames: []string{""}}, "empty extra resource name"},
		{Config{ExtraResourceNames: []string{"a b"}}, "white space"},
		{Config{ExtraResourceNames: []string{"a/*b"}}, "only allowed at the end"},
		{Config{ExtraResourceNames: []string{"*"}}, "every device plugin resource"},
		{Config{ExtraDRADrivers: []string{"gpu.*"}}, "patterns are not supported"},
		{Config{ExtraDRADrivers: []string{"x\ny"}}, "control characters"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			c, err := NewClient(tt.cfg)
			if err == nil {
				t.Fatalf("NewClient(%+v) = %v, want error", tt.cfg, c)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "podmap: invalid config") {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
	// Several problems are all reported.
	_, err := NewClient(Config{RefreshInterval: -1, CallTimeout: -1})
	if err == nil || !strings.Contains(err.Error(), "refresh interval") || !strings.Contains(err.Error(), "call timeout") {
		t.Errorf("joined error = %v", err)
	}
}

func gkeNode(srv *fakekubelet.Server) {
	srv.SetPods([]fakekubelet.Pod{
		{Namespace: "ml", Name: "train-0", Containers: []fakekubelet.Container{
			{Name: "trainer", Devices: []fakekubelet.Devices{
				{Resource: "nvidia.com/gpu", IDs: []string{"nvidia0", "nvidia2"}},
				{Resource: "example.com/nic", IDs: []string{"nic0"}},
			}},
			{Name: "sidecar"},
		}},
		{Namespace: "ml", Name: "infer-0", Containers: []fakekubelet.Container{
			{Name: "server", Devices: []fakekubelet.Devices{{Resource: "nvidia.com/gpu", IDs: []string{"nvidia1/vgpu0"}}}},
		}},
		{Namespace: "ml", Name: "infer-1", Containers: []fakekubelet.Container{
			{Name: "server", Devices: []fakekubelet.Devices{{Resource: "nvidia.com/gpu", IDs: []string{"nvidia1/vgpu1"}}}},
		}},
		{Namespace: "kube-system", Name: "no-gpu", Containers: []fakekubelet.Container{{Name: "x"}}},
	})
	srv.SetAllocatable(map[string][]string{
		"nvidia.com/gpu":  {"nvidia0", "nvidia1/vgpu0", "nvidia1/vgpu1", "nvidia2"},
		"example.com/nic": {"nic0"},
	})
}

func TestClientIntegration(t *testing.T) {
	srv := startFake(t)
	gkeNode(srv)
	c, err := NewClient(fastConfig(srv.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	s := waitFor(t, "first refresh", func(s *Snapshot) bool { return s.Up }, c)

	if s.Time.IsZero() || s.Errors != 0 || s.Err != nil || s.RefreshDuration <= 0 {
		t.Errorf("snapshot metadata: %+v", s)
	}
	var got []string
	for _, h := range s.Holdings {
		got = append(got, fmt.Sprintf("%s/%s/%s %s %s", h.Namespace, h.Pod, h.Container, h.Resource, h.DeviceID))
		if h.ParseErr != nil || h.Ref.Kind != GKEMinor {
			t.Errorf("holding %+v", h)
		}
	}
	want := []string{
		"ml/infer-0/server nvidia.com/gpu nvidia1/vgpu0",
		"ml/infer-1/server nvidia.com/gpu nvidia1/vgpu1",
		"ml/train-0/trainer nvidia.com/gpu nvidia0",
		"ml/train-0/trainer nvidia.com/gpu nvidia2",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("holdings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(s.Allocatable) != 1 || s.Allocatable["nvidia.com/gpu"] != 4 || len(s.AllocatableIDs["nvidia.com/gpu"]) != 4 {
		t.Errorf("allocatable = %v %v", s.Allocatable, s.AllocatableIDs)
	}

	// Time-sliced GPU: both replicas credit both pods with the same GPU, and
	// GKE minors are not indices.
	inv := &Inventory{GPUs: []InventoryGPU{
		{Index: 0, UUID: "GPU-" + testUUID(1, 0), Minor: 1},
		{Index: 1, UUID: "GPU-" + testUUID(1, 1), Minor: 0},
		{Index: 2, UUID: "GPU-" + testUUID(1, 2), Minor: 2},
	}}
	matched, unmatched := Match(s, inv)
	if len(unmatched) != 0 || len(matched) != 4 {
		t.Fatalf("matched %d unmatched %d", len(matched), len(unmatched))
	}
	if matched[0].Target.GPU != 0 || matched[1].Target.GPU != 0 || matched[2].Target.GPU != 1 || matched[3].Target.GPU != 2 {
		t.Errorf("targets: %+v", matched)
	}

	// Changes on the node show up in a later snapshot by themselves.
	srv.SetPods(nil)
	waitFor(t, "pods gone", func(s *Snapshot) bool { return s.Up && len(s.Holdings) == 0 }, c)
}

func TestSnapshotNeverCallsKubelet(t *testing.T) {
	srv := startFake(t)
	gkeNode(srv)
	cfg := fastConfig(srv.Socket())
	cfg.RefreshInterval = time.Hour // one refresh, then quiet
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitFor(t, "first refresh", func(s *Snapshot) bool { return s.Up }, c)
	before := srv.Calls()
	if before != 2 {
		t.Errorf("one refresh made %d calls, want 2 (List, GetAllocatableResources)", before)
	}
	inv := &Inventory{GPUs: []InventoryGPU{{Index: 0, UUID: "GPU-" + testUUID(1, 0), Minor: 0}}}
	for i := 0; i < 1000; i++ {
		s := c.Snapshot()
		Match(s, inv)
	}
	if after := srv.Calls(); after != before {
		t.Fatalf("Snapshot/Match made %d kubelet calls", after-before)
	}
	// Snapshot does not block even while a refresh hangs in the kubelet.
	srv.SetDelay(300 * time.Millisecond)
	go func() { _ = c.Refresh(context.Background()) }()
	waitUntil(t, "the refresh to reach the kubelet", func() bool { return srv.Calls() != before })
	start := time.Now()
	c.Snapshot()
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("Snapshot took %v during a refresh", d)
	}
}

func TestClientKubeletRestart(t *testing.T) {
	srv := startFake(t)
	gkeNode(srv)
	logs := &syncBuffer{}
	cfg := fastConfig(srv.Socket())
	cfg.Logger = zerolog.New(logs)
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	up := waitFor(t, "first refresh", func(s *Snapshot) bool { return s.Up }, c)

	srv.Stop()
	down := waitFor(t, "Up=false after the kubelet stopped", func(s *Snapshot) bool { return !s.Up }, c)
	if down.Err == nil || down.Errors < 1 {
		t.Errorf("down snapshot: Errors=%d Err=%v", down.Errors, down.Err)
	}
	// The previous holdings stay, with the time of the last success.
	if len(down.Holdings) != len(up.Holdings) || !down.Time.Equal(up.Time) {
		t.Errorf("down snapshot lost the last holdings: %d vs %d, %v vs %v", len(down.Holdings), len(up.Holdings), down.Time, up.Time)
	}
	waitFor(t, "several consecutive failures", func(s *Snapshot) bool { return s.Errors >= 3 }, c)

	// The kubelet comes back with other pods; the client recovers by itself.
	srv.SetPods([]fakekubelet.Pod{{Namespace: "a", Name: "b", Containers: []fakekubelet.Container{
		{Name: "c", Devices: []fakekubelet.Devices{{Resource: "nvidia.com/gpu", IDs: []string{"nvidia3"}}}},
	}}})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := waitFor(t, "recovery", func(s *Snapshot) bool { return s.Up }, c)
	if back.Errors != 0 || back.Err != nil || len(back.Holdings) != 1 || !back.Time.After(up.Time) {
		t.Errorf("recovered snapshot: %+v", back)
	}

	// A restart (stop and start at once) is also survived.
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	calls := srv.Calls()
	waitFor(t, "refresh after restart", func(s *Snapshot) bool { return s.Up && srv.Calls() >= calls+4 }, c)

	out := logs.String()
	for _, want := range []string{"connected to kubelet pod-resources", "pod mapping is down", "pod mapping restored"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "pod mapping is down"); n > 3 {
		t.Errorf("failure logged %d times; should be rate limited", n)
	}
}

func TestClientStartsBeforeKubelet(t *testing.T) {
	sock := socketPath(t)
	c, err := NewClient(fastConfig(sock))
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	waitFor(t, "failures while the socket is missing", func(s *Snapshot) bool { return s.Errors >= 2 && !s.Up }, c)
	srv := fakekubelet.New(sock)
	gkeNode(srv)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	s := waitFor(t, "connection once the kubelet is up", func(s *Snapshot) bool { return s.Up }, c)
	if len(s.Holdings) != 4 {
		t.Errorf("holdings = %d", len(s.Holdings))
	}
}

func TestClientCallTimeout(t *testing.T) {
	srv := startFake(t)
	gkeNode(srv)
	srv.SetDelay(time.Hour)
	cfg := fastConfig(srv.Socket())
	cfg.CallTimeout = 50 * time.Millisecond
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 1)
	go func() { errc <- c.Refresh(context.Background()) }()
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second):
		srv.Stop() // lets the hung call end, so that cleanup can Close
		t.Fatal("a hanging kubelet held the refresh past its call timeout")
	}
	if err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("Refresh = %v, want a deadline error", err)
	}
	if s := c.Snapshot(); s.Up || s.Errors != 1 {
		t.Errorf("snapshot after timeout: %+v", s)
	}
	srv.SetDelay(0)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh after the kubelet recovered: %v", err)
	}
	if s := c.Snapshot(); !s.Up || s.Errors != 0 {
		t.Errorf("snapshot after recovery: %+v", s)
	}
}

func TestClientCancelledRefreshPublishesNothing(t *testing.T) {
	srv := startFake(t)
	srv.SetDelay(time.Hour)
	c, err := NewClient(fastConfig(srv.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Cancelled, as Run's context is at shutdown (a deadline would race
	// with the same deadline the server enforces).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("cancelled refresh succeeded")
	}
	if s := c.Snapshot(); s.Errors != 0 {
		t.Errorf("shutdown counted as a failure: %+v", s)
	}
}

func TestClientAllocatableUnimplemented(t *testing.T) {
	srv := startFake(t)
	gkeNode(srv)
	srv.SetAllocatableUnimplemented(true)
	logs := &syncBuffer{}
	cfg := fastConfig(srv.Socket())
	cfg.Logger = zerolog.New(logs)
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 3; i++ {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s := c.Snapshot()
	if !s.Up || len(s.Holdings) != 4 || s.Allocatable != nil {
		t.Errorf("snapshot: Up=%v holdings=%d allocatable=%v", s.Up, len(s.Holdings), s.Allocatable)
	}
	if n := strings.Count(logs.String(), "does not implement GetAllocatableResources"); n != 1 {
		t.Errorf("unimplemented logged %d times, want 1", n)
	}
}

func TestClientDeadDevicePlugin(t *testing.T) {
	// The seed failure mode: the device plugin died, the kubelet lists no
	// allocatable GPUs, pods still hold them.
	srv := startFake(t)
	gkeNode(srv)
	srv.SetAllocatable(nil)
	c, err := NewClient(fastConfig(srv.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := c.Snapshot()
	if n, ok := s.Allocatable["nvidia.com/gpu"]; !ok || n != 0 {
		t.Errorf("allocatable = %v, want nvidia.com/gpu: 0", s.Allocatable)
	}
}

func TestClientDRA(t *testing.T) {
	srv := startFake(t)
	migUUID := "MIG-" + testUUID(2, 12)
	srv.SetPods([]fakekubelet.Pod{
		{Namespace: "dra", Name: "p1", Containers: []fakekubelet.Container{{Name: "c", Dynamic: []fakekubelet.DynamicResource{
			{ClaimName: "gpu-claim", ClaimNamespace: "dra", ClaimResources: []fakekubelet.ClaimResource{
				{DriverName: DRADriverNVIDIA, PoolName: "node-a", DeviceName: "gpu-2",
					CDIDevices: []string{"k8s.gpu.nvidia.com/device=gpu-2"}},
				{DriverName: DRADriverNVIDIA, PoolName: "node-a", DeviceName: "gpu-0-mig-1g10gb-me-19-6", ShareID: "abc"},
			}},
		}}}},
		{Namespace: "dra", Name: "p2", Containers: []fakekubelet.Container{{Name: "c", Dynamic: []fakekubelet.DynamicResource{
			{ClaimName: "mig", ClaimNamespace: "dra", ClaimResources: []fakekubelet.ClaimResource{
				{DriverName: DRADriverNVIDIALegacy, PoolName: "node-a", DeviceName: "mig-dev",
					CDIDevices: []string{"k8s.gpu.resource.nvidia.com/device=" + migUUID}},
			}},
			{ClaimName: "net", ClaimNamespace: "dra", ClaimResources: []fakekubelet.ClaimResource{
				{DriverName: "dra.net", PoolName: "node-a", DeviceName: "eth1"},
			}},
			{ClaimName: "vm", ClaimNamespace: "dra", ClaimResources: []fakekubelet.ClaimResource{
				{DriverName: DRADriverNVIDIA, PoolName: "node-a", DeviceName: "gpu-vfio-0"},
			}},
		}}}},
	})
	c, err := NewClient(fastConfig(srv.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	s := waitFor(t, "first refresh", func(s *Snapshot) bool { return s.Up }, c)
	if len(s.Holdings) != 4 {
		t.Fatalf("holdings: %+v", s.Holdings)
	}
	for _, h := range s.Holdings {
		if h.Dynamic == nil || h.Dynamic.PoolName != "node-a" || h.Dynamic.ClaimNamespace != "dra" {
			t.Errorf("holding without DRA details: %+v", h)
		}
	}
	if s.Holdings[0].Dynamic.ShareID != "abc" || s.Holdings[1].Dynamic.ShareID != "" {
		t.Errorf("share IDs: %+v %+v", s.Holdings[0].Dynamic, s.Holdings[1].Dynamic)
	}
	matched, unmatched := Match(s, testInventory())
	if len(matched) != 3 || len(unmatched) != 1 || unmatched[0].DeviceID != "gpu-vfio-0" {
		t.Fatalf("matched %+v\nunmatched %+v", matched, unmatched)
	}
	byPod := map[string][]Target{}
	for _, a := range matched {
		byPod[a.Pod] = append(byPod[a.Pod], a.Target)
	}
	inv := testInventory()
	want := map[string][]Target{
		"p1": {
			{GPU: 1, UUID: inv.GPUs[1].UUID, GPUInstance: 9, MIGProfile: "1g.10gb+me"}, // gpu-0: minor 0 is index 1
			{GPU: 0, UUID: inv.GPUs[0].UUID, GPUInstance: -1, ComputeInstance: -1},     // gpu-2: minor 2 is index 0
		},
		"p2": {{GPU: 1, UUID: inv.GPUs[1].UUID, GPUInstance: 2, MIGProfile: "1g.10gb"}},
	}
	if fmt.Sprint(byPod) != fmt.Sprint(want) {
		t.Errorf("targets %v, want %v", byPod, want)
	}
}

// bigNode returns n pods with long names, each holding one GPU replica.
func bigNode(n int) []fakekubelet.Pod {
	pods := make([]fakekubelet.Pod, n)
	pad := strings.Repeat("x", 200)
	for i := range pods {
		pods[i] = fakekubelet.Pod{
			Namespace: "team-" + pad[:50],
			Name:      fmt.Sprintf("job-%06d-%s", i, pad),
			Containers: []fakekubelet.Container{
				{Name: "worker-" + pad[:100], Devices: []fakekubelet.Devices{
					{Resource: "nvidia.com/gpu", IDs: []string{fmt.Sprintf("GPU-%s::%d", testUUID(1, i%8), i)}},
				}},
				{Name: "sidecar-" + pad[:100]},
			},
		}
	}
	return pods
}

func TestClientLargeListAnswer(t *testing.T) {
	srv := startFake(t)
	const pods = 9000 // about 5 MiB of List answer
	srv.SetPods(bigNode(pods))
	cfg := fastConfig(srv.Socket())
	cfg.CallTimeout = time.Minute // the size is under test, not the time
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh of a >4 MiB answer: %v", err)
	}
	if s := c.Snapshot(); len(s.Holdings) != pods {
		t.Fatalf("holdings = %d, want %d", len(s.Holdings), pods)
	}

	// The same answer does not fit gRPC's default 4 MiB limit: this test
	// really exercises a large message.
	cfg = fastConfig(srv.Socket())
	cfg.MaxRecvMsgSize = 4 << 20
	cfg.CallTimeout = time.Minute // the size is under test, not the time
	small, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	err = small.Refresh(context.Background())
	if err == nil || !strings.Contains(err.Error(), "ResourceExhausted") || !strings.Contains(err.Error(), "--kubelet.max-response-bytes") {
		t.Fatalf("Refresh with a 4 MiB limit = %v, want ResourceExhausted naming the flag to raise", err)
	}
	if s := small.Snapshot(); s.Err == nil || !strings.Contains(s.Err.Error(), "larger than the limit") {
		t.Errorf("snapshot error after an answer over the limit: %v", s.Err)
	}
}

// An allocatable answer over the limit (a node with a huge device list)
// fails the refresh with an error naming the flag that raises the limit, as
// a List answer over it does.
func TestClientLargeAllocatableAnswer(t *testing.T) {
	srv := startFake(t)
	srv.SetPods(bigNode(10))
	ids := make([]string, 120000) // about 5 MiB of answer
	for i := range ids {
		ids[i] = fmt.Sprintf("GPU-%s::%d", testUUID(1, i%8), i)
	}
	srv.SetAllocatable(map[string][]string{"nvidia.com/gpu": ids})
	cfg := fastConfig(srv.Socket())
	cfg.MaxRecvMsgSize = 4 << 20
	cfg.CallTimeout = time.Minute // the size is under test, not the time
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Refresh(context.Background())
	if err == nil || !strings.Contains(err.Error(), "GetAllocatableResources") || !strings.Contains(err.Error(), "--kubelet.max-response-bytes") {
		t.Fatalf("Refresh with a 4 MiB limit and a bigger allocatable answer = %v, want an error naming the call and --kubelet.max-response-bytes", err)
	}
}

func TestBackoff(t *testing.T) {
	c, err := NewClient(Config{BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	prevMax := time.Duration(0)
	for n := 1; n <= 10; n++ {
		d := c.backoff(n)
		nominal := min(100*time.Millisecond<<(n-1), time.Second)
		if d > nominal || d < nominal*4/5 {
			t.Errorf("backoff(%d) = %v, want within [%v, %v]", n, d, nominal*4/5, nominal)
		}
		prevMax = max(prevMax, d)
	}
	if prevMax > time.Second {
		t.Errorf("backoff exceeded its cap: %v", prevMax)
	}
}

func BenchmarkRefresh(b *testing.B) {
	srv := startFake(b)
	// 200 pods on an 8 GPU x 7 MIG node.
	inv := benchInventory()
	pods := make([]fakekubelet.Pod, 200)
	var alloc []string
	for i := range pods {
		g := inv.GPUs[(i/7)%8]
		id := g.MIG[i%7].UUID
		pods[i] = fakekubelet.Pod{Namespace: "ns", Name: fmt.Sprintf("pod-%03d", i), Containers: []fakekubelet.Container{
			{Name: "main", Devices: []fakekubelet.Devices{{Resource: "nvidia.com/mig-1g.10gb", IDs: []string{id}}}},
		}}
	}
	for _, g := range inv.GPUs {
		for _, m := range g.MIG {
			alloc = append(alloc, m.UUID)
		}
	}
	srv.SetPods(pods)
	srv.SetAllocatable(map[string][]string{"nvidia.com/mig-1g.10gb": alloc})
	c, err := NewClient(Config{Socket: srv.Socket()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if s := c.Snapshot(); len(s.Holdings) != 200 || s.Allocatable["nvidia.com/mig-1g.10gb"] != 56 {
		b.Fatalf("holdings %d allocatable %v", len(s.Holdings), s.Allocatable)
	}
}

// FirstRefresh closes once the first refresh has ended, failed too, with
// its result already in the snapshot, and not before.
func TestFirstRefresh(t *testing.T) {
	c, err := NewClient(Config{Socket: filepath.Join(t.TempDir(), "none.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-c.FirstRefresh():
		t.Fatal("closed before any refresh")
	default:
	}
	if err := c.Refresh(context.Background()); err == nil {
		t.Fatal("a refresh without a kubelet succeeded")
	}
	select {
	case <-c.FirstRefresh():
	default:
		t.Fatal("not closed after the first refresh failed")
	}
	if s := c.Snapshot(); s.Errors != 1 || s.Err == nil {
		t.Errorf("snapshot after the first refresh: Errors=%d Err=%v", s.Errors, s.Err)
	}
	_ = c.Refresh(context.Background()) // closed once: no panic
}
