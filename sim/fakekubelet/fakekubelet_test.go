package fakekubelet

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func socketPath(t *testing.T) string {
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

func dial(t *testing.T, socket string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestServer(t *testing.T) {
	sock := socketPath(t)
	srv := New(sock)
	if srv.Socket() != sock {
		t.Fatal("Socket()")
	}
	// A stale socket file is replaced.
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := srv.Start(); err == nil {
		t.Error("second Start succeeded")
	}
	srv.SetPods([]Pod{{Namespace: "ns", Name: "p", Containers: []Container{{
		Name:    "c",
		Devices: []Devices{{Resource: "nvidia.com/gpu", IDs: []string{"nvidia0"}}},
		Dynamic: []DynamicResource{{ClaimName: "cl", ClaimNamespace: "ns", ClaimResources: []ClaimResource{
			{DriverName: "gpu.nvidia.com", PoolName: "node", DeviceName: "gpu-1", CDIDevices: []string{"k8s.gpu.nvidia.com/device=gpu-1"}, ShareID: "s"},
			{DriverName: "gpu.nvidia.com", PoolName: "node", DeviceName: "gpu-2"},
		}}},
	}}}})
	srv.SetAllocatable(map[string][]string{"nvidia.com/gpu": {"nvidia0", "nvidia1"}, "b": {"x"}})

	cl := dial(t, sock)
	list, err := cl.List(ctx(t), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	prs := list.GetPodResources()
	if len(prs) != 1 || prs[0].GetName() != "p" || prs[0].GetNamespace() != "ns" {
		t.Fatalf("List = %v", list)
	}
	c := prs[0].GetContainers()[0]
	if c.GetName() != "c" || c.GetDevices()[0].GetResourceName() != "nvidia.com/gpu" || c.GetDevices()[0].GetDeviceIds()[0] != "nvidia0" {
		t.Errorf("container = %v", c)
	}
	dr := c.GetDynamicResources()[0]
	crs := dr.GetClaimResources()
	if dr.GetClaimName() != "cl" || len(crs) != 2 || crs[0].GetDeviceName() != "gpu-1" ||
		crs[0].GetCdiDevices()[0].GetName() != "k8s.gpu.nvidia.com/device=gpu-1" || crs[0].ShareId == nil ||
		crs[0].GetShareId() != "s" || crs[1].ShareId != nil || crs[1].GetPoolName() != "node" {
		t.Errorf("dynamic = %v", dr)
	}

	alloc, err := cl.GetAllocatableResources(ctx(t), &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := alloc.GetDevices(); len(d) != 2 || d[0].GetResourceName() != "b" || len(d[1].GetDeviceIds()) != 2 {
		t.Errorf("allocatable = %v", alloc)
	}

	got, err := cl.Get(ctx(t), &podresourcesv1.GetPodResourcesRequest{PodName: "p", PodNamespace: "ns"})
	if err != nil || got.GetPodResources().GetName() != "p" {
		t.Errorf("Get = %v, %v", got, err)
	}
	_, err = cl.Get(ctx(t), &podresourcesv1.GetPodResourcesRequest{PodName: "p", PodNamespace: "other"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("Get of a missing pod = %v, want NotFound", err)
	}
	if n := srv.Calls(); n != 4 {
		t.Errorf("Calls = %d, want 4", n)
	}

	srv.SetAllocatableUnimplemented(true)
	if _, err := cl.GetAllocatableResources(ctx(t), &podresourcesv1.AllocatableResourcesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("GetAllocatableResources = %v, want Unimplemented", err)
	}

	srv.SetDelay(time.Hour)
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := cl.List(short, &podresourcesv1.ListPodResourcesRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("delayed List = %v, want DeadlineExceeded", err)
	}
}

func TestStopRestart(t *testing.T) {
	sock := socketPath(t)
	srv := New(sock)
	srv.Stop() // stopping a server never started is fine
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	srv.SetPods([]Pod{{Namespace: "a", Name: "b"}})
	srv.Stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket still there after Stop: %v", err)
	}
	srv.Stop()
	cl := dial(t, sock)
	if _, err := cl.List(ctx(t), &podresourcesv1.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("List on a stopped server = %v, want Unavailable", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	// Pods survive a restart; a fresh connection sees them.
	list, err := dial(t, sock).List(ctx(t), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil || len(list.GetPodResources()) != 1 {
		t.Fatalf("List after restart = %v, %v", list, err)
	}
}
