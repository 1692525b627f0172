package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
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
func derivedConfig(o *options) (state.DerivedConfig, error) {
	shapes, _ := fragmentation.ParseShapes(o.shapes) // checked in validate
	dc := state.DerivedConfig{
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

// nodeSources are the node's sources: the driver's libraries, the kubelet
// and the host, or with --simulate the simulation wing's stand-ins for them
// (a flag the user set still names a real kubelet or host tree).
func nodeSources(o *options, log zerolog.Logger) (collector.Sources, error) {
	if !o.simulate {
		lib, err := nvmlsampler.NewNVML(o.nvmlLibrary)
		if errors.Is(err, nvmlsampler.ErrNoNVML) {
			return collector.Sources{}, noNVMLError(o.nvmlLibrary)
		}
		if err != nil {
			return collector.Sources{}, err
		}
		resolver, closeResolver, err := processResolver(o, o.procsRoot, o.procsLogDir, log)
		if err != nil {
			return collector.Sources{}, err
		}
		return collector.Sources{NVML: lib, KubeletSocket: o.kubeletSocket, Processes: resolver, Sysfs: o.sysfs, Close: closeResolver}, nil
	}
	node, err := simulatedNode(o, log)
	if err != nil {
		return collector.Sources{}, err
	}
	stand, err := sim.Sources(node, sim.Options{Kubelet: o.kubeletEnabled && !o.kubeletSocketSet, FollowEvery: min(o.interval, time.Second), Sysfs: true})
	if err != nil {
		node.Close()
		return collector.Sources{}, err
	}
	src := stand.Sources
	if stand.Kubelet != nil {
		log.Info().Str("socket", src.KubeletSocket).Msg("serving the simulated node's pods on a built-in fake kubelet")
	} else {
		src.KubeletSocket = o.kubeletSocket
	}
	closeStand := src.Close
	src.Close = func() { closeStand(); node.Close() }
	// The simulated host's /proc and container logs unless the flags name
	// others.
	root, logDir := o.procsRoot, o.procsLogDir
	if o.procsEnabled && !o.procsRootSet {
		if root, err = node.HostProc(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	if o.procsEnabled && !o.procsLogDirSet {
		if logDir, err = node.HostLogDir(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	resolver, closeResolver, err := processResolver(o, root, logDir, log)
	if err != nil {
		src.Close()
		return collector.Sources{}, err
	}
	src.Processes = resolver
	closeSim := src.Close
	src.Close = func() { closeResolver(); closeSim() }
	return src, nil
}

// simulatedNode builds the simulated node of --simulate.scenario (the
// built-in one without it).
func simulatedNode(o *options, log zerolog.Logger) (*simnode.Node, error) {
	sc := simnode.DefaultScenario()
	if o.simulateFile != "" {
		var err error
		if sc, err = simnode.LoadScenario(o.simulateFile); err != nil {
			return nil, inputError{err}
		}
	}
	if o.simulateSeedSet || sc.Seed == 0 {
		sc.Seed = o.simulateSeed
	}
	node, err := simnode.New(sc)
	if err != nil {
		return nil, inputError{fmt.Errorf("--simulate.scenario=%s: %w", o.simulateFile, err)}
	}
	log.Warn().Str("model", sc.Node.Model).Int("gpus", sc.Node.Count).Str("flavour", sc.Node.Flavour).Msg("running on a SIMULATED GPU node; no real GPU is read")
	return node, nil
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

// processResolver sets up per-process accounting over the host /proc at
// root and the container log directory logDir. A path the user set that
// cannot be read is an error; the defaults that cannot be read (no host
// /proc mounted) turn accounting off with a warning, so a minimal
// deployment still starts.
func processResolver(o *options, root, logDir string, log zerolog.Logger) (*procs.Resolver, func(), error) {
	nothing := func() {}
	if !o.procsEnabled {
		return nil, nothing, nil
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

// nodeConfig is the configuration of every part of the exporter.
func nodeConfig(o *options, derived state.DerivedConfig, log zerolog.Logger) collector.NodeConfig {
	cfg := collector.NodeConfig{
		Log: log,
		Exporter: collector.Config{Interval: o.interval, RuntimeMetrics: true, Derived: derived, Groups: o.groups,
			Status:           render.StatusInfo{Version: version.Version, Node: o.nodeName, Simulated: o.simulate},
			NVMLRestartAfter: o.nvmlRestartAfter},
		Sampler: nvmlsampler.SamplerConfig{DeviceTimeout: o.deviceTimeout, InitTimeout: o.nvmlInitTimeout},
		XID:     o.groups.On(render.GroupXID) || o.compatDCGM,
	}
	if o.compatDCGM {
		host := o.nodeName
		if host == "" {
			host, _ = os.Hostname()
		}
		cfg.Exporter.Compat = &render.CompatConfig{Hostname: host, HostnameLabel: o.compatHostnameLabel, VirtualGPUs: o.compatVirtualGPUs}
	}
	if dcgm.Mode(o.dcgmMode) != dcgm.ModeOff {
		cfg.DCGM = &dcgm.Config{Mode: dcgm.Mode(o.dcgmMode), HostEngine: o.dcgmHostEngine, Interval: o.interval}
	}
	if o.kubeletEnabled {
		cfg.Kubelet = &podmap.Config{RefreshInterval: o.kubeletRefresh, CallTimeout: o.kubeletTimeout,
			MaxRecvMsgSize: int(o.kubeletMaxBytes), ExtraResourceNames: o.kubeletResources}
	}
	return cfg
}
