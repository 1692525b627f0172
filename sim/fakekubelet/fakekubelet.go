// Package fakekubelet serves the kubelet's real PodResourcesLister v1 gRPC
// service on a unix socket, with pods and allocatable devices set by the
// test, demo or benchmark that runs it. It counts the calls it answers, so a
// test can prove that no kubelet call happens on a scrape path.
package fakekubelet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Pod is one pod and what its containers hold.
type Pod struct {
	Namespace  string
	Name       string
	Containers []Container
}

// Container is one container: device plugin devices and DRA devices.
type Container struct {
	Name    string
	Devices []Devices
	Dynamic []DynamicResource
}

// Devices are the device IDs of one device plugin resource.
type Devices struct {
	Resource string
	IDs      []string
}

// DynamicResource mirrors podresources v1 DynamicResource: one
// ResourceClaim's devices as a container sees them.
type DynamicResource struct {
	ClaimName      string
	ClaimNamespace string
	ClaimResources []ClaimResource
}

// ClaimResource mirrors podresources v1 ClaimResource.
type ClaimResource struct {
	CDIDevices []string // fully qualified CDI device names
	DriverName string
	PoolName   string
	DeviceName string
	ShareID    string // "" leaves share_id unset
}

// Server is a fake kubelet pod-resources endpoint.
type Server struct {
	socket string

	mu          sync.Mutex
	grpc        *grpc.Server
	done        chan struct{}
	pods        []Pod
	allocatable map[string][]string
	delay       time.Duration
	noAlloc     bool

	calls atomic.Int64
}

// New returns a server for the unix socket path. It does not listen until
// Start.
func New(socket string) *Server { return &Server{socket: socket} }

// Socket returns the socket path.
func (s *Server) Socket() string { return s.socket }

// Start listens on the socket (removing a stale socket file first) and
// serves in the background.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpc != nil {
		return errors.New("fakekubelet: already started")
	}
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fakekubelet: remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("fakekubelet: listen: %w", err)
	}
	gs := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(gs, &service{s: s})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	s.grpc, s.done = gs, done
	return nil
}

// Stop stops serving at once, as a dying kubelet would: open connections
// are closed, calls in flight fail, and the socket file is removed. Stopping
// a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	gs, done := s.grpc, s.done
	s.grpc, s.done = nil, nil
	s.mu.Unlock()
	if gs == nil {
		return
	}
	gs.Stop()
	<-done
	_ = os.Remove(s.socket)
}

// Restart stops the server and starts it again on the same socket, keeping
// pods and allocatable devices, as a kubelet restart does.
func (s *Server) Restart() error {
	s.Stop()
	return s.Start()
}

// SetPods replaces the pods List and Get answer with.
func (s *Server) SetPods(pods []Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = pods
}

// SetAllocatable replaces the allocatable devices (resource name to device
// IDs) GetAllocatableResources answers with.
func (s *Server) SetAllocatable(devs map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.allocatable = devs
}

// SetDelay makes every call wait d (or until the caller gives up) before it
// answers, to exercise call deadlines.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// SetAllocatableUnimplemented makes GetAllocatableResources answer
// Unimplemented, as kubelets without the feature do.
func (s *Server) SetAllocatableUnimplemented(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noAlloc = v
}

// Calls returns the number of calls answered or attempted (List,
// GetAllocatableResources, Get) since the server was created.
func (s *Server) Calls() int64 { return s.calls.Load() }

// begin counts a call, applies the delay and returns the server state.
func (s *Server) begin(ctx context.Context) ([]Pod, map[string][]string, bool, error) {
	s.calls.Add(1)
	s.mu.Lock()
	pods, alloc, delay, noAlloc := s.pods, s.allocatable, s.delay, s.noAlloc
	s.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, nil, false, status.FromContextError(ctx.Err()).Err()
		}
	}
	return pods, alloc, noAlloc, nil
}

type service struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v *service) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	pods, _, _, err := v.s.begin(ctx)
	if err != nil {
		return nil, err
	}
	return ListResponse(pods), nil
}

// ListResponse is the List answer for pods, as the server sends it (to
// measure its encoded size).
func ListResponse(pods []Pod) *podresourcesv1.ListPodResourcesResponse {
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: make([]*podresourcesv1.PodResources, 0, len(pods))}
	for i := range pods {
		resp.PodResources = append(resp.PodResources, toProto(&pods[i]))
	}
	return resp
}

func (v *service) GetAllocatableResources(ctx context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	_, alloc, noAlloc, err := v.s.begin(ctx)
	if err != nil {
		return nil, err
	}
	if noAlloc {
		return nil, status.Error(codes.Unimplemented, "method GetAllocatableResources not implemented")
	}
	names := make([]string, 0, len(alloc))
	for r := range alloc {
		names = append(names, r)
	}
	sort.Strings(names)
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, r := range names {
		resp.Devices = append(resp.Devices, &podresourcesv1.ContainerDevices{
			ResourceName: r,
			DeviceIds:    append([]string(nil), alloc[r]...),
		})
	}
	return resp, nil
}

func (v *service) Get(ctx context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	pods, _, _, err := v.s.begin(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if pods[i].Name == req.GetPodName() && pods[i].Namespace == req.GetPodNamespace() {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: toProto(&pods[i])}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
}

func toProto(p *Pod) *podresourcesv1.PodResources {
	pr := &podresourcesv1.PodResources{Name: p.Name, Namespace: p.Namespace}
	for _, c := range p.Containers {
		cr := &podresourcesv1.ContainerResources{Name: c.Name}
		for _, d := range c.Devices {
			cr.Devices = append(cr.Devices, &podresourcesv1.ContainerDevices{
				ResourceName: d.Resource,
				DeviceIds:    append([]string(nil), d.IDs...),
			})
		}
		for _, dr := range c.Dynamic {
			pdr := &podresourcesv1.DynamicResource{ClaimName: dr.ClaimName, ClaimNamespace: dr.ClaimNamespace}
			for _, r := range dr.ClaimResources {
				pcr := &podresourcesv1.ClaimResource{
					DriverName: r.DriverName,
					PoolName:   r.PoolName,
					DeviceName: r.DeviceName,
				}
				if r.ShareID != "" {
					id := r.ShareID
					pcr.ShareId = &id
				}
				for _, n := range r.CDIDevices {
					pcr.CdiDevices = append(pcr.CdiDevices, &podresourcesv1.CDIDevice{Name: n})
				}
				pdr.ClaimResources = append(pdr.ClaimResources, pcr)
			}
			cr.DynamicResources = append(cr.DynamicResources, pdr)
		}
		pr.Containers = append(pr.Containers, cr)
	}
	return pr
}
