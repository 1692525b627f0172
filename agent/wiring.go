package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

// criTimeout is the deadline of every call to the container runtime.
const criTimeout = 2 * time.Second

// NewLogger is the log c asks for, on w.
func NewLogger(c *Config, w io.Writer) zerolog.Logger {
	out := w
	if c.LogFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(out).Level(c.LogLevel).With().Timestamp().Logger()
}

// nodeSources are the node's sources: the driver's library, the kubelet
// and the host, or sim's stand-ins for them.
func nodeSources(c *Config, sim Simulation, log zerolog.Logger) (collector.Sources, error) {
	if sim != nil {
		return sim.Sources(c, log)
	}
	lib, err := nvmlsampler.NewNVML(c.NVMLLibrary)
	if errors.Is(err, nvmlsampler.ErrNoNVML) {
		return collector.Sources{}, noNVMLError(c.NVMLLibrary)
	}
	if err != nil {
		return collector.Sources{}, err
	}
	kube, err := KubeClient(c)
	if err != nil {
		return collector.Sources{}, err
	}
	src := collector.Sources{NVML: lib, Kube: kube, Sysfs: c.Sysfs}
	if c.Kubelet != nil {
		src.KubeletSocket = c.Kubelet.Socket
	}
	if c.Procs != nil {
		resolver, closeResolver, err := ProcessResolver(c.Procs, c.Procs.Root, c.Procs.LogDir, log)
		if err != nil {
			return collector.Sources{}, err
		}
		src.Processes, src.Close = resolver, closeResolver
	}
	return src, nil
}

// KubeClient is the API server's client for the pod labels and UIDs, the
// ResourceSlice watch and the node condition: from
// --kubernetes.kubeconfig, else the pod's service account; nil when none
// of them is asked for (the exporter then never calls the API server).
func KubeClient(c *Config) (*kubeapi.Client, error) {
	if c.PodMeta == nil && c.Slices == nil && c.NodeCondition == nil {
		return nil, nil
	}
	var cfg *kubeapi.Config
	var err error
	if c.Kubeconfig != "" {
		if cfg, err = kubeapi.LoadKubeconfig(c.Kubeconfig); err != nil {
			return nil, InputError{fmt.Errorf("--kubernetes.kubeconfig=%s: %w", c.Kubeconfig, err)}
		}
	} else if cfg, err = kubeapi.InCluster(); err != nil {
		return nil, fmt.Errorf("%s need the API server: %w; run in a pod with a service account token (the chart mounts one when they are on), or give --kubernetes.kubeconfig", apiUsers(c), err)
	}
	cfg.UserAgent = "gpu-pool-exporter/" + version.Version
	return kubeapi.New(cfg)
}

// apiUsers names the features that call the API server.
func apiUsers(c *Config) string {
	var out []string
	if c.PodMeta != nil {
		out = append(out, "pod labels and UIDs (--compat.dcgm-exporter.kubernetes-enable-pod-*)")
	}
	if c.Slices != nil {
		out = append(out, "the ResourceSlice watch (--kubernetes.resource-slices)")
	}
	if c.NodeCondition != nil {
		out = append(out, "the node condition (--node-condition)")
	}
	return strings.Join(out, " and ")
}

// noNVMLError says which library failed to load, where it was looked for,
// and the two ways out: --nvml.library and --simulate.
func noNVMLError(path string) error {
	const hint = "point --nvml.library at libnvidia-ml.so.1 (on GKE: --nvml.library=/usr/local/nvidia/lib64/libnvidia-ml.so.1), " +
		"or run gpu-pool-exporter-sim to try the exporter on a simulated GPU node"
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

// ProcessResolver sets up per-process accounting (p) over the host /proc
// at root and the container log directory logDir. A path the user named
// that cannot be read is an error; the defaults that cannot be read (no
// host /proc mounted) turn accounting off with a warning, so a minimal
// deployment still starts.
func ProcessResolver(p *ProcsConfig, root, logDir string, log zerolog.Logger) (*procs.Resolver, func(), error) {
	nothing := func() {}
	if err := procs.CheckProcRoot(root); err != nil {
		if p.RootNamed {
			return nil, nothing, InputError{fmt.Errorf("--procs.proc-root=%s: %w", root, err)}
		}
		log.Warn().Err(err).Msg("per-process accounting is off: per-container use of shared GPUs is unknown")
		return nil, nothing, nil
	}
	cfg := procs.Config{ProcRoot: root}
	closeFn := nothing
	if p.CRISocket != "" {
		cri, err := procs.NewCRI(p.CRISocket, criTimeout)
		if err != nil { // the path passed check: the failure is in setting up
			return nil, nothing, fmt.Errorf("--procs.cri-socket=%s: %w", p.CRISocket, err)
		}
		cfg.Identities, closeFn = cri, func() { cri.Close() }
	} else {
		ld, err := procs.NewLogDir(logDir)
		if err != nil {
			if p.LogDirNamed {
				return nil, nothing, InputError{fmt.Errorf("--procs.container-log-dir=%s: %w", logDir, err)}
			}
			log.Warn().Err(err).Msg("containers cannot be named: the processes of pods count as outside pods")
		} else {
			cfg.Identities = ld
		}
	}
	log.Info().Str("proc_root", root).Str("container_log_dir", logDir).Str("cri_socket", p.CRISocket).Msg("per-process accounting on")
	return procs.NewResolver(cfg), closeFn, nil
}

// nodeConfig is the configuration of every part of the exporter.
func nodeConfig(c *Config, simulated bool, log zerolog.Logger) collector.NodeConfig {
	cfg := collector.NodeConfig{
		Log: log,
		Exporter: collector.Config{Interval: c.Interval, RuntimeMetrics: true, Derived: c.Derived, Groups: c.Groups,
			Status:           render.StatusInfo{Version: version.Version, Node: c.NodeName, Simulated: simulated},
			NVMLRestartAfter: c.NVMLRestartAfter, Compat: c.Compat},
		Sampler: c.Sampler,
		XID:     c.Groups.On(render.GroupXID) || c.Compat != nil,
		DCGM:    c.DCGM,
		Kubelet: c.Kubelet,
		PodMeta: c.PodMeta,
		Slices:  c.Slices,
		// The node condition's writer: nil when off.
		NodeCondition: c.NodeCondition,
	}
	return cfg
}
