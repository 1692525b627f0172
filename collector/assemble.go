package collector

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nodecondition"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// Sources are what a node offers the exporter to read: the driver's
// libraries, the kubelet and the host. The command builds them from the
// real node; the simulation wing (sim/) builds them from a simulated one.
// Which of them are read is the NodeConfig's to say.
type Sources struct {
	// NVML is the driver's library (nvmlsampler.NewNVML) or a stand-in.
	NVML nvmlsampler.NVML
	// OpenDCGM opens DCGM; nil: dcgm.DefaultOpen (the library, or the host
	// engine of standalone mode).
	OpenDCGM func(dcgm.Config) (dcgm.Client, error)
	// XIDEvents is where XID events come from; nil: NVML's event set, gated
	// by the driver's life cycle (Sampler.XIDSource).
	XIDEvents xid.EventSource
	// KubeletSocket is the kubelet's PodResources socket.
	KubeletSocket string
	// Kube is the API server's client, for the pod metadata, the
	// ResourceSlices and the node condition (nil: none).
	Kube *kubeapi.Client
	// Processes names the containers of the processes NVML lists; nil: no
	// per-process accounting.
	Processes *procs.Resolver
	// Sysfs is where sysfs is mounted, for each GPU's NUMA node; empty:
	// nvmlsampler.DefaultSysfs.
	Sysfs string
	// Close releases what the sources hold (clients, temporary trees); nil
	// when there is nothing to release. Node.Close calls it.
	Close func()
}

// NodeConfig configures every part of the exporter of one node. A part
// whose configuration is nil (or false) is off.
type NodeConfig struct {
	// Log is every part's log (each part's own Log is replaced).
	Log zerolog.Logger
	// Now replaces time.Now in every part whose own Now is nil (tests).
	Now func() time.Time
	// Exporter configures the sampling loop and the page. Its Pods, XID,
	// DCGM and Processes are set by Assemble from the parts below.
	Exporter Config
	// Sampler configures the NVML sampler; Sysfs and Processes come from
	// the Sources when it leaves them empty.
	Sampler nvmlsampler.SamplerConfig
	// XID counts XID events, where the sources have events.
	XID bool
	// XIDWaitTimeout bounds one wait for events (0: the reader's default).
	XIDWaitTimeout time.Duration
	// DCGM, when set, reads DCGM's profiling fields and health watches.
	DCGM *dcgm.Config
	// Kubelet, when set, maps devices to pods through the PodResources API
	// at Sources.KubeletSocket.
	Kubelet *podmap.Config
	// PodMeta, when set, watches this node's pods on the API server
	// (Sources.Kube) for their UIDs and labels.
	PodMeta *podmap.MetaConfig
	// Slices, when set, watches this node's DRA ResourceSlices on the API
	// server (Sources.Kube) for the taints on its devices.
	Slices *podmap.SliceConfig
	// NodeCondition, when set, keeps a condition on this node's Node
	// object (Sources.Kube) while a GPU has a fatal fault.
	NodeCondition *nodecondition.Config
	// Stepped: nothing runs in the background; the caller drives every part
	// through Node.Step on its own clock (alerts/pages, tests).
	Stepped bool
}

// Node is the exporter of one node, assembled from its sources: the
// sampler, the sources read beside it and the exporter that joins them.
type Node struct {
	Exporter *Exporter
	Sampler  *nvmlsampler.Sampler
	XID      *xid.Reader          // nil when XID events are not counted
	DCGM     *dcgm.Sampler        // nil when DCGM is off
	Pods     *podmap.Client       // nil when pod mapping is off
	PodMeta  *podmap.MetaWatcher  // nil when pod metadata is off
	Slices   *podmap.SliceWatcher // nil when the ResourceSlice watch is off
	// NodeCondition writes the node condition; nil when it is off.
	NodeCondition *nodecondition.Writer

	cfg     NodeConfig
	src     Sources
	stepped *steppedDCGM
	once    sync.Once
}

// Assemble builds the exporter of one node from its sources and config.
// Nothing runs until Start (or Step, when cfg.Stepped). On an error what
// was built is released, the sources included.
func Assemble(cfg NodeConfig, src Sources) (n *Node, err error) {
	if src.NVML == nil {
		return nil, errors.New("assemble: no NVML library among the sources")
	}
	n = &Node{cfg: cfg, src: src}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	scfg := cfg.Sampler
	if scfg.Sysfs == "" {
		scfg.Sysfs = src.Sysfs
	}
	scfg.Log = cfg.Log
	if scfg.Now == nil {
		scfg.Now = cfg.Now
	}
	scfg.Processes = scfg.Processes || src.Processes != nil
	if n.Sampler, err = nvmlsampler.NewSampler(src.NVML, scfg); err != nil {
		return nil, err
	}
	ecfg := cfg.Exporter
	ecfg.Log = cfg.Log
	if ecfg.Now == nil {
		ecfg.Now = cfg.Now
	}
	if src.Processes != nil {
		ecfg.Processes = src.Processes
	}
	if cfg.XID {
		events, ok := src.XIDEvents, src.XIDEvents != nil
		if !ok {
			events, ok = n.Sampler.XIDSource()
		}
		if ok {
			n.XID = xid.NewReader(events, nil)
			n.XID.Instances = n.Sampler
			if cfg.XIDWaitTimeout > 0 {
				n.XID.WaitTimeout = cfg.XIDWaitTimeout
			}
			log := cfg.Log
			n.XID.Logf = func(f string, a ...any) { log.Warn().Msgf(f, a...) }
			ecfg.XID = n.XID
		}
	}
	if cfg.DCGM != nil {
		open := src.OpenDCGM
		if open == nil {
			open = dcgm.DefaultOpen
		}
		dcfg := *cfg.DCGM
		dcfg.Log = cfg.Log.With().Str("component", "dcgm").Logger()
		n.DCGM = dcgm.NewSampler(dcfg, open)
		ecfg.DCGM = n.DCGM
		if cfg.Stepped {
			// A stepped DCGM serves the snapshot of its last Step: the
			// values of the page's own moment, on the caller's clock.
			n.stepped = &steppedDCGM{s: n.DCGM}
			ecfg.DCGM = n.stepped
		}
	}
	if cfg.Kubelet != nil {
		pcfg := *cfg.Kubelet
		pcfg.Socket = src.KubeletSocket
		pcfg.Logger = cfg.Log.With().Str("component", "podmap").Logger()
		if pcfg.Now == nil {
			pcfg.Now = cfg.Now
		}
		if n.Pods, err = podmap.NewClient(pcfg); err != nil {
			return nil, err
		}
		ecfg.Pods = n.Pods
	}
	if cfg.PodMeta != nil {
		mcfg := *cfg.PodMeta
		if mcfg.Client == nil {
			mcfg.Client = src.Kube
		}
		mcfg.Logger = cfg.Log.With().Str("component", "podmeta").Logger()
		if n.PodMeta, err = podmap.NewMetaWatcher(mcfg); err != nil {
			return nil, err
		}
		ecfg.PodMeta = n.PodMeta
	}
	if cfg.Slices != nil {
		scfg := *cfg.Slices
		if scfg.Client == nil {
			scfg.Client = src.Kube
		}
		scfg.Logger = cfg.Log.With().Str("component", "draslices").Logger()
		if n.Slices, err = podmap.NewSliceWatcher(scfg); err != nil {
			return nil, err
		}
		ecfg.Slices = n.Slices
	}
	if cfg.NodeCondition != nil {
		ncfg := *cfg.NodeCondition
		if ncfg.Client == nil {
			ncfg.Client = src.Kube
		}
		ncfg.Log = cfg.Log.With().Str("component", "nodecondition").Logger()
		if n.NodeCondition, err = nodecondition.New(ncfg); err != nil {
			return nil, err
		}
		ecfg.OnState = n.NodeCondition.Observe
		ecfg.Reporters = append(ecfg.Reporters, n.NodeCondition)
	}
	if ecfg.PodMapWait == 0 {
		switch {
		case n.Pods != nil:
			// One refresh: List and GetAllocatableResources, each bounded
			// by the kubelet's call timeout.
			ecfg.PodMapWait = 2 * n.Pods.Config().CallTimeout
		case n.PodMeta != nil:
			ecfg.PodMapWait = podmap.DefaultCallTimeout
		}
	}
	if n.Exporter, err = New(ecfg, n.Sampler); err != nil {
		return nil, err
	}
	return n, nil
}

// Start runs the XID reader, DCGM, the pod map and the sampling loop in the
// background until ctx is done, each counted in wg.
func (n *Node) Start(ctx context.Context, wg *sync.WaitGroup) {
	if n.cfg.Stepped {
		panic("collector: Start on a stepped node; call Step")
	}
	if n.XID != nil {
		wg.Go(func() { _ = n.XID.Run(ctx) })
	}
	if n.DCGM != nil {
		wg.Go(func() { n.DCGM.Run(ctx) })
	}
	if n.Pods != nil {
		wg.Go(func() { n.Pods.Run(ctx) })
	}
	if n.PodMeta != nil {
		wg.Go(func() { n.PodMeta.Run(ctx) })
	}
	if n.Slices != nil {
		wg.Go(func() { n.Slices.Run(ctx) })
	}
	if n.NodeCondition != nil {
		wg.Go(func() { n.NodeCondition.Run(ctx) })
	}
	wg.Go(func() { n.Exporter.Run(ctx) })
}

// StartXID runs only the XID reader in the background (a stepped node's
// events arrive on their own time); it stops when ctx is done, and done is
// closed after.
func (n *Node) StartXID(ctx context.Context) (done <-chan struct{}) {
	ch := make(chan struct{})
	if n.XID == nil {
		close(ch)
		return ch
	}
	go func() { defer close(ch); _ = n.XID.Run(ctx) }()
	return ch
}

// Step refreshes the pod map, samples a stepped DCGM and takes one sample,
// all in the caller's goroutine at the exporter's Now. A failing part shows
// on the page, as it would in the background.
func (n *Node) Step(ctx context.Context) {
	if n.Pods != nil {
		_ = n.Pods.Refresh(ctx)
	}
	if n.stepped != nil {
		n.stepped.snap, _ = n.DCGM.Step(ctx, n.Exporter.cfg.Now())
	}
	n.Exporter.SampleOnce(ctx)
}

// Close releases the pod map client, NVML (unless a call is stuck in the
// driver) and the sources. Call it after everything Start ran has stopped.
func (n *Node) Close() {
	n.once.Do(func() {
		if n.Pods != nil {
			_ = n.Pods.Close()
		}
		if n.Sampler != nil {
			n.Sampler.Close()
		}
		if n.src.Close != nil {
			n.src.Close()
		}
	})
}

// steppedDCGM serves the snapshot of the DCGM sampler's last Step.
type steppedDCGM struct {
	s    *dcgm.Sampler
	snap *dcgm.Snapshot
}

func (d *steppedDCGM) Snapshot() *dcgm.Snapshot { return d.snap }

// SetXIDSink hands DCGM's XIDs to the sampler, as an unstepped one does.
func (d *steppedDCGM) SetXIDSink(sink func(gpu int, uuid string, code int, at time.Time)) {
	d.s.SetXIDSink(sink)
}
