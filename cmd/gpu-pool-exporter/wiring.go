package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap/fakekubelet"
)

func newLogger(o *options, w io.Writer) zerolog.Logger {
	out := w
	if o.logFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	lvl, _ := zerolog.ParseLevel(o.logLevel)
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// derivedConfig reads the idle, price and fragmentation settings.
func derivedConfig(o *options) (collector.DerivedConfig, error) {
	shapes, _ := fragmentation.ParseShapes(o.shapes) // checked in validate
	dc := collector.DerivedConfig{
		Idle:   fragmentation.IdleConfig{Threshold: o.idleThreshold, Window: o.idleWindow},
		Shapes: shapes,
	}
	var prices *fragmentation.PriceList
	if o.priceFile != "" {
		var err error
		if prices, err = fragmentation.LoadPriceList(o.priceFile); err != nil {
			return dc, inputError{fmt.Errorf("--idle.price-file: %w", err)}
		}
	}
	extra, _ := fragmentation.ParsePriceFlag(o.priceFlag)
	if len(extra) > 0 {
		if prices == nil {
			prices = &fragmentation.PriceList{PerGPUHour: map[string]float64{}}
		}
		for k, v := range extra {
			prices.PerGPUHour[k] = v
		}
	}
	dc.Prices = prices
	return dc, nil
}

// openNVML loads the driver's NVML, or builds the simulated node (returned
// twice: as the NVML the sampler reads, and as the node the fake kubelet,
// DCGM and /proc are served from).
func openNVML(o *options, log zerolog.Logger) (nvmlsampler.NVML, *simnode.Node, error) {
	if !o.simulate {
		lib, err := nvmlsampler.NewNVML(o.nvmlLibrary)
		if errors.Is(err, nvmlsampler.ErrNoNVML) {
			return nil, nil, noNVMLError(o.nvmlLibrary)
		}
		return lib, nil, err
	}
	sc := simnode.DefaultScenario()
	if o.simulateFile != "" {
		var err error
		if sc, err = simnode.LoadScenario(o.simulateFile); err != nil {
			return nil, nil, inputError{err}
		}
	}
	if o.simulateSeedSet || sc.Seed == 0 {
		sc.Seed = o.simulateSeed
	}
	node, err := simnode.New(sc)
	if err != nil {
		return nil, nil, inputError{fmt.Errorf("--simulate.scenario=%s: %w", o.simulateFile, err)}
	}
	log.Warn().Str("model", sc.Node.Model).Int("gpus", sc.Node.Count).Str("flavour", sc.Node.Flavour).Msg("running on a SIMULATED GPU node; no real GPU is read")
	return node, node, nil
}

// noNVMLError says which library failed to load, where it was looked for,
// and the two ways out: --nvml.library and --simulate.
func noNVMLError(path string) error {
	const hint = "point --nvml.library at libnvidia-ml.so.1 (on GKE: --nvml.library=/usr/local/nvidia/lib64/libnvidia-ml.so.1), " +
		"or pass --simulate to run on a simulated GPU node"
	if path == "" {
		where := "the loader's search path (LD_LIBRARY_PATH is empty)"
		if p := os.Getenv("LD_LIBRARY_PATH"); p != "" {
			where = "the loader's search path (LD_LIBRARY_PATH=" + p + ")"
		}
		return fmt.Errorf("cannot load libnvidia-ml.so.1 (NVIDIA's NVML library) from %s: install the NVIDIA driver, %s", where, hint)
	}
	why := "it could not be loaded (not an NVML library for this architecture?)"
	if fi, err := os.Stat(path); err != nil {
		why = "no such file"
		if !errors.Is(err, os.ErrNotExist) {
			why = err.Error()
		}
	} else if fi.IsDir() {
		why = "it is a directory; give the file"
	}
	return fmt.Errorf("cannot load --nvml.library=%s: %s; %s", path, why, hint)
}

// processResolver sets up per-process accounting. With --simulate it reads
// the simulated host's generated /proc and log directory unless the flags
// name others. A path the user set that cannot be read is an error; the
// defaults that cannot be read (no host /proc mounted) turn accounting off
// with a warning, so a minimal deployment still starts. The simulated host
// tree that cannot be written is a setup failure, not the user's.
func processResolver(o *options, node *simnode.Node, log zerolog.Logger) (*procs.Resolver, func(), error) {
	nothing := func() {}
	if !o.procsEnabled {
		return nil, nothing, nil
	}
	root, logDir := o.procsRoot, o.procsLogDir
	if node != nil {
		var err error
		if !o.procsRootSet {
			if root, err = node.HostProc(); err != nil {
				return nil, nothing, err
			}
		}
		if !o.procsLogDirSet {
			if logDir, err = node.HostLogDir(); err != nil {
				return nil, nothing, err
			}
		}
	}
	if err := procs.CheckProcRoot(root); err != nil {
		if o.procsRootSet {
			return nil, nothing, inputError{fmt.Errorf("--procs.proc-root=%s: %w", root, err)}
		}
		log.Warn().Err(err).Msg("per-process accounting is off: per-container use of shared GPUs is unknown")
		return nil, nothing, nil
	}
	cfg := procs.Config{ProcRoot: root}
	closeFn := nothing
	if o.procsCRISocket != "" {
		c, err := procs.NewCRI(o.procsCRISocket, criTimeout)
		if err != nil { // the path passed validate: the failure is in setting up
			return nil, nothing, fmt.Errorf("--procs.cri-socket=%s: %w", o.procsCRISocket, err)
		}
		cfg.Identities, closeFn = c, func() { c.Close() }
	} else {
		ld, err := procs.NewLogDir(logDir)
		if err != nil {
			if o.procsLogDirSet {
				return nil, nothing, inputError{fmt.Errorf("--procs.container-log-dir=%s: %w", logDir, err)}
			}
			log.Warn().Err(err).Msg("containers cannot be named: the processes of pods count as outside pods")
		} else {
			cfg.Identities = ld
		}
	}
	log.Info().Str("proc_root", root).Str("container_log_dir", logDir).Str("cri_socket", o.procsCRISocket).Msg("per-process accounting on")
	return procs.NewResolver(cfg), closeFn, nil
}

// simulatedSysfs writes the simulated GPUs' sysfs into a private directory
// (their bus IDs are not this machine's) and returns it, or "" when it
// cannot, leaving --path.sysfs in use.
func simulatedSysfs(node *simnode.Node) string {
	dir, err := os.MkdirTemp("", "gpu-pool-exporter-sysfs")
	if err != nil {
		return ""
	}
	if node.WriteSysfs(dir) != nil {
		os.RemoveAll(dir)
		return ""
	}
	return dir
}

// collectorConfig is the exporter's configuration. It starts the sources
// that run beside the sampler (XID events, DCGM, the pod map), each until
// ctx is done and counted in wg.
func collectorConfig(ctx context.Context, wg *sync.WaitGroup, o *options, sampler *nvmlsampler.Sampler, node *simnode.Node,
	derived collector.DerivedConfig, resolver *procs.Resolver, log zerolog.Logger) (collector.Config, error) {
	cfg := collector.Config{Interval: o.interval, Log: log, RuntimeMetrics: true, Derived: derived, Groups: o.groups,
		Status: collector.StatusInfo{Version: version.Version, Node: o.nodeName, Simulated: o.simulate}, Processes: resolver,
		NVMLRestartAfter: o.nvmlRestartAfter}
	if o.compatDCGM {
		host := o.nodeName
		if host == "" {
			host, _ = os.Hostname()
		}
		cfg.Compat = &collector.CompatConfig{Hostname: host, HostnameLabel: o.compatHostnameLabel, VirtualGPUs: o.compatVirtualGPUs}
	}
	if src, ok := sampler.XIDSource(); ok && (o.groups.On(collector.GroupXID) || o.compatDCGM) {
		cfg.XID = startXID(ctx, wg, src, log)
	}
	if dcgm.Mode(o.dcgmMode) != dcgm.ModeOff {
		cfg.DCGM = startDCGM(ctx, wg, o, node, log)
	}
	if o.kubeletEnabled {
		pods, err := startPodMap(ctx, wg, o, node, log)
		if err != nil {
			return cfg, err
		}
		cfg.Pods = pods
	}
	return cfg, nil
}

func startXID(ctx context.Context, wg *sync.WaitGroup, src xid.EventSource, log zerolog.Logger) *xid.Reader {
	r := xid.NewReader(src, nil)
	r.Logf = func(f string, a ...any) { log.Warn().Msgf(f, a...) }
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	return r
}

// startDCGM samples DCGM in the background: the simulated node's when
// there is one, else the library or host engine --dcgm.mode names.
func startDCGM(ctx context.Context, wg *sync.WaitGroup, o *options, node *simnode.Node, log zerolog.Logger) *dcgm.Sampler {
	dcfg := dcgm.Config{Mode: dcgm.Mode(o.dcgmMode), HostEngine: o.dcgmHostEngine, Interval: o.interval, Log: log.With().Str("component", "dcgm").Logger()}
	open := dcgm.DefaultOpen
	if node != nil {
		open = node.DCGM().Open
	}
	ds := dcgm.NewSampler(dcfg, open)
	wg.Add(1)
	go func() { defer wg.Done(); ds.Run(ctx) }()
	return ds
}

// startPodMap keeps the GPU-to-pod map from the kubelet's PodResources
// API; a simulated node gets a fake kubelet unless
// --kubelet.pod-resources-socket names a real one.
func startPodMap(ctx context.Context, wg *sync.WaitGroup, o *options, node *simnode.Node, log zerolog.Logger) (*podmap.Client, error) {
	socket := o.kubeletSocket
	if node != nil && !o.kubeletSocketSet {
		fake, err := startFakeKubelet(ctx, wg, node, o.interval, log)
		if err != nil {
			return nil, err
		}
		socket = fake
	}
	client, err := podmap.NewClient(podmap.Config{Socket: socket, RefreshInterval: o.kubeletRefresh, CallTimeout: o.kubeletTimeout,
		MaxRecvMsgSize:     int(o.kubeletMaxBytes),
		ExtraResourceNames: o.kubeletResources, Logger: log.With().Str("component", "podmap").Logger()})
	if err != nil { // its settings passed validate: the failure is in setting up
		return nil, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		client.Run(ctx)
		client.Close() // after Run has returned, never under it
	}()
	return client, nil
}

// startFakeKubelet serves the simulated node's pods on a private socket and
// keeps them in step with the scenario (pods that start and stop, a device
// plugin that loses its devices).
func startFakeKubelet(ctx context.Context, wg *sync.WaitGroup, node *simnode.Node, every time.Duration, log zerolog.Logger) (string, error) {
	dir, err := os.MkdirTemp("", "gpe-kubelet-")
	if err != nil {
		return "", fmt.Errorf("fake kubelet: %w", err)
	}
	socket := filepath.Join(dir, "kubelet.sock")
	srv := fakekubelet.New(socket)
	update := func() {
		srv.SetPods(node.KubeletPods())
		srv.SetAllocatable(node.KubeletAllocatable())
	}
	update()
	if err := srv.Start(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("fake kubelet: %w", err)
	}
	log.Info().Str("socket", socket).Msg("serving the simulated node's pods on a built-in fake kubelet")
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer os.RemoveAll(dir)
		defer srv.Stop()
		t := time.NewTicker(min(every, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				update()
			}
		}
	}()
	return socket, nil
}
