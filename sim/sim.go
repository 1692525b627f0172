// Package sim is the simulation wing: everything that stands in for a real
// GPU node, for gpu-pool-exporter-sim, the tests and the benchmarks. Production
// packages never import it (a depguard rule in .golangci.yml says so); it
// imports them, to hand the exporter a simulated node's sources.
//
//	simnode      a whole simulated node driven by a scenario (go-nvml's mock
//	             server for the boards; telemetry, faults, pods, processes)
//	fakenvml     a fake libnvidia-ml.so.1 at the C ABI, per driver branch
//	fakedcgm     a fake DCGM host engine (collector/dcgm's Client)
//	fakekubelet  the kubelet's real PodResources gRPC service on a unix socket
//	fakehost     a host /proc and /var/log/containers tree
//	simagent     the agent.Simulation of cmd/gpu-pool-exporter-sim
//
// NVIDIA's MIG geometry (miggeometry/, at the top of the tree) is reference
// data, not a stand-in: the fakes answer from it and the analytics read it.
//
// This package joins them: Sources turns a simulated node into the
// collector.Sources the exporter is assembled from.
package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakeapiserver"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// Options says which stand-ins Sources starts.
type Options struct {
	// Kubelet serves the node's pods from a fake kubelet on a private unix
	// socket.
	Kubelet bool
	// FollowEvery, when not zero, brings the fake kubelet up to the node's
	// present this often in the background (pods that start and stop, a
	// device plugin that loses its devices); zero leaves that to Sync.
	FollowEvery time.Duration
	// Processes names the containers of the node's processes from its
	// generated host /proc and /var/log/containers.
	Processes bool
	// Sysfs writes the GPUs' sysfs tree (their NUMA nodes) into a private
	// directory: their bus IDs are not this machine's.
	Sysfs bool
	// Now is the process resolver's clock (nil: time.Now).
	Now func() time.Time
	// APIServer serves the node's pods (UIDs, labels), its DRA
	// ResourceSlices (flavour dra) and its Node object (whose status the
	// node condition patches) from a fake API server over HTTP, as node
	// NodeName; pods and slices kept up to date with the fake kubelet
	// (FollowEvery, Sync).
	APIServer bool
	NodeName  string
}

// Stand is a simulated node's stand-ins as the exporter's sources.
type Stand struct {
	Node    *simnode.Node
	Sources collector.Sources
	// Kubelet is the fake kubelet (nil without Options.Kubelet).
	Kubelet *fakekubelet.Server
	// API is the fake API server (nil without Options.APIServer).
	API *fakeapiserver.Server

	stop     chan struct{}
	wg       sync.WaitGroup
	dirs     []string
	once     sync.Once
	nodeName string
}

// Sources starts the stand-ins opt asks for around node. The node itself
// is the NVML library and XID source, its fake host engine the DCGM. The
// returned Sources' Close stops them and removes their files; the node
// stays the caller's.
func Sources(node *simnode.Node, opt Options) (*Stand, error) {
	s := &Stand{Node: node, stop: make(chan struct{})}
	s.Sources = collector.Sources{NVML: node, OpenDCGM: node.DCGM().Open, Close: s.close}
	ok := false
	defer func() {
		if !ok {
			s.close()
		}
	}()
	if opt.Sysfs {
		dir, err := s.tempDir("gpu-pool-exporter-sysfs", "sysfs")
		if err != nil {
			return nil, err
		}
		if err := node.WriteSysfs(dir); err != nil {
			return nil, fmt.Errorf("simulated sysfs: %w", err)
		}
		s.Sources.Sysfs = dir
	}
	if opt.Processes {
		r, err := HostResolver(node, opt.Now)
		if err != nil {
			return nil, err
		}
		s.Sources.Processes = r
	}
	if opt.APIServer {
		s.API = fakeapiserver.New()
		s.API.Serve(podmap.PodsPath, "spec.nodeName")
		s.API.Serve(podmap.ResourceSlicesPath, "spec.nodeName", "spec.driver")
		s.API.Serve(NodesPath, "metadata.name")
		s.nodeName = opt.NodeName
		s.API.Set(NodesPath, []fakeapiserver.Object{{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": opt.NodeName, "labels": map[string]any{"kubernetes.io/hostname": opt.NodeName}},
			"status":   map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status (simulated)"}}}}})
		c, err := s.API.Client()
		if err != nil {
			return nil, err
		}
		s.Sources.Kube = c
		s.syncAPI()
	}
	if opt.Kubelet {
		// Not t.TempDir or a deep path: a unix socket path must stay under
		// about 100 bytes.
		dir, err := s.tempDir("gpe-kubelet-", "kubelet socket")
		if err != nil {
			return nil, err
		}
		s.Kubelet = fakekubelet.New(filepath.Join(dir, "kubelet.sock"))
		s.Kubelet.SetDelay(time.Duration(node.Scenario.Node.KubeletLatency))
		s.Sync()
		if err := s.Kubelet.Start(); err != nil {
			return nil, fmt.Errorf("fake kubelet: %w", err)
		}
		s.Sources.KubeletSocket = s.Kubelet.Socket()
	}
	if opt.FollowEvery > 0 && (s.Kubelet != nil || s.API != nil) {
		s.wg.Go(func() { s.follow(opt.FollowEvery) })
	}
	ok = true
	return s, nil
}

// HostResolver names the containers of node's processes from its generated
// host /proc and /var/log/containers.
func HostResolver(node *simnode.Node, now func() time.Time) (*procs.Resolver, error) {
	root, err := node.HostProc()
	if err != nil {
		return nil, err
	}
	logDir, err := node.HostLogDir()
	if err != nil {
		return nil, err
	}
	ids, err := procs.NewLogDir(logDir)
	if err != nil {
		return nil, err
	}
	return procs.NewResolver(procs.Config{ProcRoot: root, Identities: ids, Now: now}), nil
}

// Sync brings the fake kubelet and API server up to the node's present.
func (s *Stand) Sync() {
	if s.Kubelet != nil {
		s.Kubelet.SetPods(s.Node.KubeletPods())
		s.Kubelet.SetAllocatable(s.Node.KubeletAllocatable())
	}
	s.syncAPI()
}

// NodesPath is the collection of Node objects.
const NodesPath = "/api/v1/nodes"

// syncAPI makes the fake API server hold the pods that run now, on this
// node, and the node's ResourceSlices as they are now.
func (s *Stand) syncAPI() {
	if s.API == nil {
		return
	}
	var pods []fakeapiserver.Object
	for _, p := range s.Node.APIPods() {
		labels := map[string]any{}
		for k, v := range p.Labels {
			labels[k] = v
		}
		pods = append(pods, fakeapiserver.Object{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"namespace": p.Namespace, "name": p.Name, "uid": p.UID, "labels": labels},
			"spec":     map[string]any{"nodeName": s.nodeName}})
	}
	s.API.Set(podmap.PodsPath, pods)
	var slices []fakeapiserver.Object
	slices = append(slices, s.Node.DRASlices(s.nodeName)...)
	s.API.Set(podmap.ResourceSlicesPath, slices)
}

func (s *Stand) follow(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sync()
		}
	}
}

// tempDir makes a private directory for what (named in the error).
func (s *Stand) tempDir(prefix, what string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", fmt.Errorf("cannot create the simulated node's %s directory in %s (TMPDIR): %w", what, os.TempDir(), err)
	}
	s.dirs = append(s.dirs, dir)
	return dir, nil
}

// close stops the fake kubelet and removes the private directories.
func (s *Stand) close() {
	s.once.Do(func() {
		close(s.stop)
		s.wg.Wait()
		if s.Kubelet != nil {
			s.Kubelet.Stop()
		}
		if s.API != nil {
			s.API.Close()
		}
		for _, d := range s.dirs {
			_ = os.RemoveAll(d)
		}
	})
}
