package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// criTimeout is the deadline of every call to the container runtime.
const criTimeout = 2 * time.Second

func newLogger(c *config, w io.Writer) zerolog.Logger {
	out := w
	if c.logFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(out).Level(c.logLevel).With().Timestamp().Logger()
}

// nodeSources are the node's sources: the driver's libraries, the kubelet
// and the host, or with --simulate the simulation wing's stand-ins for them
// (a flag the user set still names a real kubelet or host tree).
func nodeSources(c *config, log zerolog.Logger) (collector.Sources, error) {
	if !c.simulate {
		lib, err := nvmlsampler.NewNVML(c.nvmlLibrary)
		if errors.Is(err, nvmlsampler.ErrNoNVML) {
			return collector.Sources{}, noNVMLError(c.nvmlLibrary)
		}
		if err != nil {
			return collector.Sources{}, err
		}
		kube, err := kubeClient(c)
		if err != nil {
			return collector.Sources{}, err
		}
		resolver, closeResolver, err := processResolver(c, c.procsRoot, c.procsLogDir, log)
		if err != nil {
			return collector.Sources{}, err
		}
		return collector.Sources{NVML: lib, KubeletSocket: c.kubelet.Socket, Kube: kube, Processes: resolver, Sysfs: c.sysfs, Close: closeResolver}, nil
	}
	node, err := simulatedNode(c, log)
	if err != nil {
		return collector.Sources{}, err
	}
	// The pod labels and UIDs come from the API server a kubeconfig names,
	// else from the simulated node's own.
	podMeta := (c.compatPodLabels || c.compatPodUID) && c.kubeconfig == ""
	stand, err := sim.Sources(node, sim.Options{Kubelet: c.kubeletEnabled && !c.kubeletSocketSet, FollowEvery: min(c.interval, time.Second), Sysfs: true,
		APIServer: podMeta, NodeName: podMetaNode(c, node)})
	if err != nil {
		node.Close()
		return collector.Sources{}, err
	}
	src := stand.Sources
	if !podMeta {
		if src.Kube, err = kubeClient(c); err != nil {
			stand.Sources.Close()
			node.Close()
			return collector.Sources{}, err
		}
	}
	if stand.Kubelet != nil {
		log.Info().Str("socket", src.KubeletSocket).Msg("serving the simulated node's pods on a built-in fake kubelet")
	} else {
		src.KubeletSocket = c.kubelet.Socket
	}
	closeStand := src.Close
	src.Close = func() { closeStand(); node.Close() }
	// The simulated host's /proc and container logs unless the flags name
	// others.
	root, logDir := c.procsRoot, c.procsLogDir
	if c.procsEnabled && !c.procsRootSet {
		if root, err = node.HostProc(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	if c.procsEnabled && !c.procsLogDirSet {
		if logDir, err = node.HostLogDir(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	resolver, closeResolver, err := processResolver(c, root, logDir, log)
	if err != nil {
		src.Close()
		return collector.Sources{}, err
	}
	src.Processes = resolver
	closeSim := src.Close
	src.Close = func() { closeResolver(); closeSim() }
	return src, nil
}

// kubeClient is the API server's client for the pod labels and UIDs: from
// --kubernetes.kubeconfig, else the pod's service account; nil when they
// are not asked for.
func kubeClient(c *config) (metadata.Interface, error) {
	if !c.compatPodLabels && !c.compatPodUID {
		return nil, nil
	}
	var cfg *rest.Config
	var err error
	if c.kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
			return nil, inputError{fmt.Errorf("--kubernetes.kubeconfig=%s: %w", c.kubeconfig, err)}
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("pod labels and UIDs (--compat.dcgm-exporter.kubernetes-enable-pod-*) need the API server: %w; run in a pod with a service account token (the chart mounts one when they are on), or give --kubernetes.kubeconfig", err)
	}
	cfg.UserAgent = "gpu-pool-exporter/" + version.Version
	return metadata.NewForConfig(cfg)
}

// podMetaNode is the node whose pods are watched: --node-name, or the
// simulated node's own name.
func podMetaNode(c *config, node *simnode.Node) string {
	if c.nodeName != "" {
		return c.nodeName
	}
	return node.Scenario.Node.Name
}

// simulatedNode builds the simulated node of --simulate.scenario (the
// built-in one without it).
func simulatedNode(c *config, log zerolog.Logger) (*simnode.Node, error) {
	sc := c.scenario
	node, err := simnode.New(sc)
	if err != nil {
		return nil, inputError{fmt.Errorf("--simulate.scenario=%s: %w", c.scenarioFile, err)}
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
func processResolver(c *config, root, logDir string, log zerolog.Logger) (*procs.Resolver, func(), error) {
	nothing := func() {}
	if !c.procsEnabled {
		return nil, nothing, nil
	}
	if err := procs.CheckProcRoot(root); err != nil {
		if c.procsRootSet {
			return nil, nothing, inputError{fmt.Errorf("--procs.proc-root=%s: %w", root, err)}
		}
		log.Warn().Err(err).Msg("per-process accounting is off: per-container use of shared GPUs is unknown")
		return nil, nothing, nil
	}
	cfg := procs.Config{ProcRoot: root}
	closeFn := nothing
	if c.procsCRISocket != "" {
		cri, err := procs.NewCRI(c.procsCRISocket, criTimeout)
		if err != nil { // the path passed check: the failure is in setting up
			return nil, nothing, fmt.Errorf("--procs.cri-socket=%s: %w", c.procsCRISocket, err)
		}
		cfg.Identities, closeFn = cri, func() { cri.Close() }
	} else {
		ld, err := procs.NewLogDir(logDir)
		if err != nil {
			if c.procsLogDirSet {
				return nil, nothing, inputError{fmt.Errorf("--procs.container-log-dir=%s: %w", logDir, err)}
			}
			log.Warn().Err(err).Msg("containers cannot be named: the processes of pods count as outside pods")
		} else {
			cfg.Identities = ld
		}
	}
	log.Info().Str("proc_root", root).Str("container_log_dir", logDir).Str("cri_socket", c.procsCRISocket).Msg("per-process accounting on")
	return procs.NewResolver(cfg), closeFn, nil
}

// nodeConfig is the configuration of every part of the exporter.
func nodeConfig(c *config, log zerolog.Logger) collector.NodeConfig {
	cfg := collector.NodeConfig{
		Log: log,
		Exporter: collector.Config{Interval: c.interval, RuntimeMetrics: true, Derived: c.derived, Groups: c.groups,
			Status:           render.StatusInfo{Version: version.Version, Node: c.nodeName, Simulated: c.simulate},
			NVMLRestartAfter: c.nvmlRestartAfter},
		Sampler: nvmlsampler.SamplerConfig{DeviceTimeout: c.deviceTimeout, InitTimeout: c.nvmlInitTimeout},
		XID:     c.groups.On(render.GroupXID) || c.compatDCGM,
	}
	if c.compatDCGM {
		host := c.nodeName
		if host == "" {
			host, _ = os.Hostname()
		}
		cfg.Exporter.Compat = &render.CompatConfig{Hostname: host, HostnameLabel: c.compatHostnameLabel, VirtualGPUs: c.compatVirtualGPUs,
			Counters: c.compatCounters, PodUID: c.compatPodUID, PodLabels: c.compatPodLabels}
		if c.compatPodLabels || c.compatPodUID {
			cfg.PodMeta = &podmap.MetaConfig{NodeName: host, Labels: c.compatPodLabels, LabelAllowlist: c.compatLabelRegexps}
		}
	}
	if c.dcgmMode != dcgm.ModeOff {
		cfg.DCGM = &dcgm.Config{Mode: c.dcgmMode, HostEngine: c.dcgmHostEngine, Interval: c.interval}
	}
	if c.kubeletEnabled {
		k := c.kubelet // its socket is the sources' (a simulated node's may be its own fake kubelet's)
		cfg.Kubelet = &k
	}
	return cfg
}
