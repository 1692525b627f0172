package podmap

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Defaults of Config.
const (
	DefaultSocket          = "/var/lib/kubelet/pod-resources/kubelet.sock"
	DefaultRefreshInterval = 10 * time.Second
	DefaultCallTimeout     = 5 * time.Second
	// DefaultMaxRecvMsgSize is above gRPC's 4 MiB default, which List
	// answers on big nodes exceed, and fits the chart's 100 MiB memory
	// limit: a refresh costs about 6.4 bytes of allocation per byte of
	// answer and keeps about 3.2 (docs/performance.md), while the previous
	// map is still held, so a 6 MiB answer needs about 60 MiB on top of
	// the exporter's own 25-30 MiB.
	DefaultMaxRecvMsgSize = 6 << 20
	DefaultBackoffMin     = 1 * time.Second
	DefaultBackoffMax     = 30 * time.Second
)

// maxSocketPath is the longest path a unix socket address can hold
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

// Config configures a Client. Zero values take the defaults.
type Config struct {
	// Socket is the kubelet's pod-resources socket; a "unix://" prefix is
	// accepted. Default DefaultSocket.
	Socket string
	// RefreshInterval is the time between successful refreshes. Default 10s.
	RefreshInterval time.Duration
	// CallTimeout bounds every call to the kubelet. Default 5s.
	CallTimeout time.Duration
	// MaxRecvMsgSize is the largest answer accepted from the kubelet, in
	// bytes; a larger answer fails the refresh before it is read. Default
	// 6 MiB.
	MaxRecvMsgSize int
	// ExtraResourceNames are device plugin resource names that hold NVIDIA
	// GPUs beside nvidia.com/gpu, nvidia.com/gpu.shared and nvidia.com/mig-*
	// (a renamed or custom plugin). An entry ending in '*' matches by prefix.
	ExtraResourceNames []string
	// ExtraDRADrivers are DRA driver names whose devices are GPUs beside
	// gpu.nvidia.com and gpu.resource.nvidia.com.
	ExtraDRADrivers []string
	// BackoffMin and BackoffMax bound the exponential backoff between
	// failed refreshes (the kubelet gone or restarting). Default 1s and 30s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// Logger receives connection state changes. The zero Logger discards.
	Logger zerolog.Logger
	// Now stamps Snapshot.Time, which the exporter compares with its
	// sample time to tell a stale pod map. Default time.Now; tests with a
	// fixed clock give theirs.
	Now func() time.Time
}

// Snapshot is the result of the latest refresh. Snapshots are immutable and
// shared: callers must not modify them or anything they point to.
//
// When a refresh fails, Up is false and Errors counts the consecutive
// failures, but Holdings, Allocatable and Time stay those of the last
// successful refresh: the caller (the collector) decides whether to keep
// reporting them (Time tells their age) or to drop them.
type Snapshot struct {
	Time     time.Time // of the last successful refresh (zero if never)
	Up       bool      // the last refresh succeeded
	Holdings []Holding // one per (container, resource, device ID), sorted
	// Allocatable maps each GPU resource name to its number of allocatable
	// device IDs (GetAllocatableResources). A GPU resource that containers
	// hold but the kubelet no longer lists (a dead device plugin) has 0. nil
	// if the kubelet does not implement GetAllocatableResources.
	Allocatable     map[string]int
	AllocatableIDs  map[string][]string // sorted, distinct
	RefreshDuration time.Duration       // of the last refresh attempt
	Errors          int                 // consecutive failed refreshes
	Err             error               // why the last refresh failed; nil if Up
}

// Client keeps a current view of the kubelet's pod resources. Run refreshes
// it in the background; Snapshot reads it without ever calling the kubelet.
type Client struct {
	cfg     Config
	socket  string // plain path
	match   *resourceMatcher
	snap    atomic.Pointer[Snapshot]
	refresh sync.Mutex // serialises refreshes; guards the fields below

	conn         *grpc.ClientConn
	lister       podresourcesv1.PodResourcesListerClient
	loggedUnimpl bool
	everUp       bool

	// first is closed when the first refresh has ended, answered or failed.
	first     chan struct{}
	firstOnce sync.Once
}

// NewClient checks cfg, fills in defaults and returns a client. It does not
// connect; Run (or Refresh) does.
func NewClient(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:    cfg,
		socket: cfg.Socket,
		match:  newResourceMatcher(cfg.ExtraResourceNames, cfg.ExtraDRADrivers),
		first:  make(chan struct{}),
	}
	c.snap.Store(&Snapshot{})
	return c, nil
}

// Validate checks cfg as NewClient does, without building a client.
func (cfg Config) Validate() error {
	_, err := cfg.withDefaults()
	return err
}

// withDefaults is cfg checked, with the defaults filled in and the socket as
// an absolute plain path.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	socket := strings.TrimPrefix(cfg.Socket, "unix://")
	if socket == "" {
		socket = DefaultSocket
	}
	if abs, err := filepath.Abs(socket); err != nil {
		errs = append(errs, fmt.Errorf("socket %q: %v", socket, err))
	} else {
		socket = abs
	}
	if len(socket) > maxSocketPath {
		errs = append(errs, fmt.Errorf("socket path %q is %d bytes; unix socket paths must be at most %d", socket, len(socket), maxSocketPath))
	}
	cfg.Socket = socket

	dur := func(name string, v *time.Duration, def time.Duration) {
		switch {
		case *v < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative (got %v)", name, *v))
		case *v == 0:
			*v = def
		}
	}
	dur("refresh interval", &cfg.RefreshInterval, DefaultRefreshInterval)
	dur("call timeout", &cfg.CallTimeout, DefaultCallTimeout)
	dur("minimum backoff", &cfg.BackoffMin, DefaultBackoffMin)
	dur("maximum backoff", &cfg.BackoffMax, DefaultBackoffMax)
	if cfg.BackoffMin > 0 && cfg.BackoffMax > 0 && cfg.BackoffMin > cfg.BackoffMax {
		errs = append(errs, fmt.Errorf("minimum backoff %v is above maximum backoff %v", cfg.BackoffMin, cfg.BackoffMax))
	}
	switch {
	case cfg.MaxRecvMsgSize < 0:
		errs = append(errs, fmt.Errorf("max receive message size must not be negative (got %d)", cfg.MaxRecvMsgSize))
	case cfg.MaxRecvMsgSize == 0:
		cfg.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	checkName := func(what, n string) {
		switch {
		case n == "":
			errs = append(errs, fmt.Errorf("empty %s", what))
		case strings.IndexFunc(n, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
			errs = append(errs, fmt.Errorf("%s %q contains white space or control characters", what, n))
		case strings.Contains(strings.TrimSuffix(n, "*"), "*"):
			errs = append(errs, fmt.Errorf("%s %q: '*' is only allowed at the end", what, n))
		}
	}
	for _, n := range cfg.ExtraResourceNames {
		checkName("extra resource name", n)
		if n == "*" {
			errs = append(errs, errors.New(`extra resource name "*" would count every device plugin resource as a GPU`))
		}
	}
	for _, n := range cfg.ExtraDRADrivers {
		checkName("extra DRA driver name", n)
		if strings.HasSuffix(n, "*") {
			errs = append(errs, fmt.Errorf("extra DRA driver name %q: patterns are not supported", n))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, fmt.Errorf("podmap: invalid config: %w", err)
	}
	return cfg, nil
}

// Config returns the client's configuration with defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// FirstRefresh is closed once the first refresh has ended, with the
// kubelet's answer or its failure in the snapshot: the exporter's first
// page waits for it, so that it names the holders.
func (c *Client) FirstRefresh() <-chan struct{} { return c.first }

// Snapshot returns the latest snapshot. It never blocks and never calls the
// kubelet. Before the first refresh it is an empty snapshot with Up false.
func (c *Client) Snapshot() *Snapshot { return c.snap.Load() }

// Run refreshes the snapshot every RefreshInterval until ctx is done. When
// the kubelet is gone or restarting, it drops the connection and retries with
// exponential backoff (BackoffMin doubling up to BackoffMax, with jitter),
// reconnecting by itself. It returns only when ctx is done, and closes the
// connection then. The last snapshot stays readable after Run returns.
func (c *Client) Run(ctx context.Context) {
	defer func() { _ = c.Close() }()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wait := c.cfg.RefreshInterval
		if err := c.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = c.backoff(c.Snapshot().Errors)
		}
		timer.Reset(wait)
	}
}

// backoff returns the wait after n consecutive failures (n >= 1).
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.BackoffMin
	for i := 1; i < n && d < c.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.BackoffMax)
	// Up to 20% less, so that many exporters do not retry in lockstep.
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// Refresh asks the kubelet once (List, then GetAllocatableResources, each
// under CallTimeout) and publishes the result as the new snapshot. On failure
// it publishes Up=false, keeps the previous holdings, drops the connection so
// that the next attempt dials afresh, and returns the error. If ctx is done,
// nothing is published. Run calls it; call it directly only for one-shot use
// (and Close afterwards).
func (c *Client) Refresh(ctx context.Context) error {
	c.refresh.Lock()
	defer c.refresh.Unlock()

	start := time.Now()
	holdings, counts, ids, err := c.fetch(ctx)
	elapsed := time.Since(start)
	prev := c.snap.Load()
	log := c.cfg.Logger

	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		defer c.firstOnce.Do(func() { close(c.first) })
		_ = c.closeLocked()
		next := *prev
		next.Up = false
		next.Errors = prev.Errors + 1
		next.RefreshDuration = elapsed
		next.Err = err
		c.snap.Store(&next)
		if next.Errors == 1 || next.Errors%20 == 0 {
			log.Warn().Err(err).Str("socket", c.socket).Int("consecutive_failures", next.Errors).
				Msg("kubelet pod-resources refresh failed; pod mapping is down, retrying with backoff")
		} else {
			log.Debug().Err(err).Int("consecutive_failures", next.Errors).Msg("kubelet pod-resources refresh failed")
		}
		return err
	}

	defer c.firstOnce.Do(func() { close(c.first) })
	now := time.Now
	if c.cfg.Now != nil {
		now = c.cfg.Now
	}
	c.snap.Store(&Snapshot{
		Time:            now(),
		Up:              true,
		Holdings:        holdings,
		Allocatable:     counts,
		AllocatableIDs:  ids,
		RefreshDuration: elapsed,
	})
	switch {
	case !c.everUp:
		log.Info().Str("socket", c.socket).Int("gpu_holdings", len(holdings)).Dur("took", elapsed).
			Msg("connected to kubelet pod-resources")
	case prev.Errors > 0:
		log.Info().Str("socket", c.socket).Int("failures", prev.Errors).
			Msg("kubelet pod-resources is back; pod mapping restored")
	}
	c.everUp = true
	return nil
}

// fetch runs List and GetAllocatableResources. Called with c.refresh held.
func (c *Client) fetch(ctx context.Context) ([]Holding, map[string]int, map[string][]string, error) {
	if err := c.dialLocked(); err != nil {
		return nil, nil, nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	list, err := c.lister.List(lctx, &podresourcesv1.ListPodResourcesRequest{})
	cancel()
	if err != nil {
		return nil, nil, nil, c.callError("List", err)
	}
	holdings := holdingsFromList(list, c.match)

	actx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	alloc, err := c.lister.GetAllocatableResources(actx, &podresourcesv1.AllocatableResourcesRequest{})
	cancel()
	if status.Code(err) == codes.Unimplemented {
		// Kubelets before 1.23, or with the KubeletPodResourcesGetAllocatable
		// feature gate off, do not have it: not an error of the refresh.
		if !c.loggedUnimpl {
			c.loggedUnimpl = true
			c.cfg.Logger.Info().Err(err).Msg("kubelet does not implement GetAllocatableResources; allocatable device counts unavailable")
		}
		return holdings, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, c.callError("GetAllocatableResources", err)
	}
	counts, ids := allocatableFrom(alloc, c.match, holdings)
	return holdings, counts, ids, nil
}

// callError says which kubelet call failed; an answer over the size limit
// names the flag that raises it.
func (c *Client) callError(call string, err error) error {
	if status.Code(err) == codes.ResourceExhausted {
		return fmt.Errorf("kubelet %s: the answer is larger than the limit of %d bytes (%w); raise --kubelet.max-response-bytes, and the memory limit by about 10 bytes per byte of answer", call, c.cfg.MaxRecvMsgSize, err)
	}
	return fmt.Errorf("kubelet %s: %w", call, err)
}

// dialLocked creates the connection if there is none. grpc.NewClient does
// not connect; the first call does, under its deadline.
func (c *Client) dialLocked() error {
	if c.conn != nil {
		return nil
	}
	conn, err := grpc.NewClient("unix://"+c.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxRecvMsgSize)),
	)
	if err != nil {
		return fmt.Errorf("kubelet pod-resources client for %s: %w", c.socket, err)
	}
	c.conn = conn
	c.lister = podresourcesv1.NewPodResourcesListerClient(conn)
	return nil
}

func (c *Client) closeLocked() error {
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn, c.lister = nil, nil
	return err
}

// Close drops the connection to the kubelet. The snapshot stays readable; a
// later Refresh reconnects.
func (c *Client) Close() error {
	c.refresh.Lock()
	defer c.refresh.Unlock()
	return c.closeLocked()
}
