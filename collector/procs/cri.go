package procs

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// The kubelet's labels on every container it creates.
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelContainerName = "io.kubernetes.container.name"
)

// CRI reads identities from the container runtime's CRI socket
// (containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock):
// one ContainerStatus call per new container, cached.
type CRI struct {
	conn    *grpc.ClientConn
	timeout time.Duration
	mu      sync.Mutex
	known   map[string]Identity
	missing map[string]int // not a Kubernetes container, or gone: the Refresh generation it was marked in
	gen     int
	calls   int
}

// NewCRI connects (lazily) to a CRI runtime socket.
func NewCRI(socket string, timeout time.Duration) (*CRI, error) {
	if err := CheckCRISocket(socket); err != nil {
		return nil, err
	}
	socket = strings.TrimPrefix(socket, "unix://")
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return &CRI{conn: conn, timeout: timeout,
		known: map[string]Identity{}, missing: map[string]int{}}, nil
}

// CheckCRISocket checks a runtime socket path as NewCRI does, without
// building a client: it must be given, and be a valid unix target for gRPC.
func CheckCRISocket(socket string) error {
	socket = strings.TrimPrefix(socket, "unix://")
	if socket == "" {
		return fmt.Errorf("CRI socket path is empty: pass the runtime's socket, e.g. /run/containerd/containerd.sock")
	}
	if _, err := url.Parse("unix://" + socket); err != nil {
		return fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return nil
}

// Close closes the connection.
func (c *CRI) Close() error { return c.conn.Close() }

// Calls is the number of ContainerStatus calls made (tests check the cache).
func (c *CRI) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// Lookup implements IdentitySource.
func (c *CRI) Lookup(ctx context.Context, id string) (Identity, bool, error) {
	c.mu.Lock()
	if i, ok := c.known[id]; ok {
		c.mu.Unlock()
		return i, true, nil
	}
	if _, ok := c.missing[id]; ok {
		c.mu.Unlock()
		return Identity{}, false, nil
	}
	c.calls++
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var resp []byte
	err := c.conn.Invoke(ctx, containerStatusMethod, containerStatusRequest(id), &resp, grpc.ForceCodecV2(rawCodec{}))
	var l map[string]string
	if err == nil {
		l, err = containerLabels(resp)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if status.Code(err) == codes.NotFound {
			c.missing[id] = c.gen
			return Identity{}, false, nil
		}
		return Identity{}, false, fmt.Errorf("CRI ContainerStatus %s: %w", id, err)
	}
	i := Identity{Namespace: l[labelPodNamespace], Pod: l[labelPodName], Container: l[labelContainerName]}
	if !i.Known() {
		c.missing[id] = c.gen // a container the kubelet did not make
		return Identity{}, false, nil
	}
	c.known[id] = i
	return i, true, nil
}

// Refresh implements IdentitySource: containers found unknown before the
// previous refresh are asked again (one just asked is not asked twice).
func (c *CRI) Refresh(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for id, g := range c.missing {
		if g < c.gen-1 {
			delete(c.missing, id)
		}
	}
	if len(c.known) > maxKnown {
		clear(c.known) // containers come and go; ask again rather than grow
	}
	return nil
}

// maxKnown bounds the identity cache.
const maxKnown = 4096
