package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/units"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nodecondition"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

// Config is the command line, parsed and checked once (ParseConfig): the
// values the wiring and the server take, each in the type its part uses.
// Nothing here is parsed again; a part that is off is nil.
type Config struct {
	// Serving: where, the web config (nil: plain HTTP, no auth), the
	// limits and the extras.
	Listen          server.ListenConfig
	WebConfig       *server.WebConfig
	MaxRequests     int
	MaxConnections  int
	Pprof           bool
	ShutdownTimeout time.Duration

	// Sampling: the interval, the NVML sampler's timeouts, when a driver
	// that stays away fails /healthz, the library and the sysfs tree.
	Interval         time.Duration
	Sampler          nvmlsampler.SamplerConfig
	NVMLRestartAfter time.Duration
	NVMLLibrary      string
	Sysfs            string

	LogLevel  zerolog.Level
	LogFormat string // json or console
	NodeName  string

	// Derived gauges (idle threshold and window, prices, task shapes) and
	// the metric groups served.
	Derived state.DerivedConfig
	Groups  render.GroupSet

	// The sources read beside NVML; nil where off.
	DCGM    *dcgm.Config
	Kubelet *podmap.Config
	Procs   *ProcsConfig
	// KubeletSocketNamed: the user named the kubelet's socket (the
	// simulated node then maps through it instead of its own fake kubelet).
	KubeletSocketNamed bool

	// The dcgm-exporter families (nil: off), and the watch of this node's
	// pods on the API server for their UIDs and labels (nil: off), through
	// Kubeconfig (empty: the pod's service account).
	Compat     *render.CompatConfig
	PodMeta    *podmap.MetaConfig
	Kubeconfig string
	// Slices watches this node's DRA ResourceSlices for device taints, and
	// NodeCondition keeps the node condition (nil: off); both through
	// Kubeconfig.
	Slices        *podmap.SliceConfig
	NodeCondition *nodecondition.Config

	// Simulation is what a Simulation read from its own flags (nil for
	// the agent).
	Simulation any
}

// ProcsConfig is per-process accounting: where the host's /proc and the
// container logs are, and the runtime's socket. A path the user named
// that cannot be read is an error; a default that cannot be read turns
// the part it serves off with a warning.
type ProcsConfig struct {
	Root        string
	RootNamed   bool
	LogDir      string
	LogDirNamed bool
	CRISocket   string
}

// flagValues are the flags as given, before check turns them into a
// Config; the *Set fields say whether the user gave a flag whose default
// depends on another flag.
type flagValues struct {
	listen          server.ListenConfig
	listenSet       bool
	webConfigFile   string
	maxRequests     int
	maxConnections  int
	pprof           bool
	shutdownTimeout time.Duration

	interval         time.Duration
	deviceTimeout    time.Duration
	deviceTimeoutSet bool
	nvmlInitTimeout  time.Duration
	nvmlRestartAfter time.Duration
	nvmlLibrary      string
	sysfs            string

	logLevel  zerolog.Level
	logFormat string
	nodeName  string

	idle      fragmentation.IdleConfig
	shapes    []fragmentation.Shape
	priceFile string
	prices    map[string]float64

	dcgmMode       dcgm.Mode
	dcgmHostEngine string
	dcgmOn         bool
	dcgmOnSet      bool

	kubeletEnabled    bool
	kubelet           podmap.Config
	kubeletSocketSet  bool
	kubeletTimeoutSet bool
	kubeletMaxBytes   units.Base2Bytes
	kubeletOn         bool
	kubeletOnSet      bool

	procsEnabled   bool
	procsRoot      string
	procsRootSet   bool
	procsLogDir    string
	procsLogDirSet bool
	procsCRISocket string

	profile    string
	groupFlags map[render.Group]*groupFlag

	compatDCGM           bool
	compatRelease        string
	compatHostnameLabel  string
	compatResourceNames  []string
	compatXIDWindowMS    int64
	compatVirtualGPUs    bool
	compatCollectors     string
	compatPodLabels      bool
	compatPodUID         bool
	compatLabelAllowlist []string
	compatDRA            bool
	kubeconfig           string

	resourceSlices    bool
	nodeCondition     bool
	nodeConditionType string

	// simulated: a Simulation stands in for the node (its own name then
	// serves where --node-name is needed).
	simulated bool
}

// groupFlag is one --[no-]collector.<group> flag and whether it was given.
type groupFlag struct {
	on, set bool
}

// Upper bounds of duration flags: past them a typo (1000000h) would leave
// the exporter serving a page that never changes.
const (
	maxInterval        = 5 * time.Minute
	maxShutdownTimeout = 5 * time.Minute
	maxKubeletRefresh  = 2 * time.Minute
)

// Bounds of --kubelet.max-response-bytes: gRPC's own 4 MiB default is
// the least a big node needs; 1 GiB of answer would need about 10 GiB.
const (
	minKubeletMaxBytes = 4 << 20
	maxKubeletMaxBytes = 1 << 30
)

// check checks the parsed flags across each other, settles what depends
// on other flags (defaults bounded by an interval, modes implied by another
// flag, the metric groups), reads the files the flags name (web config,
// price list, counters file) and builds the Config. Each error names the
// flag, what was wrong and what it accepts, and is the user's (exit 2)
// unless the machine failed (exit 1). Nothing is built here to be thrown
// away.
func (f *flagValues) check() (*Config, error) {
	c := &Config{
		MaxRequests: f.maxRequests, MaxConnections: f.maxConnections, Pprof: f.pprof,
		LogLevel: f.logLevel, LogFormat: f.logFormat, NodeName: f.nodeName,
		NVMLLibrary: f.nvmlLibrary, Sysfs: f.sysfs, KubeletSocketNamed: f.kubeletSocketSet,
	}
	for _, check := range []func(*Config) error{f.checkSampling, f.checkWeb, f.checkIdle, f.resolveGroups, f.checkDCGM, f.checkKubelet, f.checkProcs, f.checkCompat, f.checkAPIServer} {
		if err := check(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkSampling: the collect interval and the per-GPU timeout within it.
func (f *flagValues) checkSampling(c *Config) error {
	if f.interval < collector.MinInterval {
		return InputError{fmt.Errorf("--collect-interval=%s is too short: it must be at least %s", f.interval, collector.MinInterval)}
	}
	if f.interval > maxInterval {
		return InputError{fmt.Errorf("--collect-interval=%s is too long: it must be at most %s (a sample older than that is not worth serving)", f.interval, maxInterval)}
	}
	timeout := f.deviceTimeout
	if !f.deviceTimeoutSet && timeout > f.interval {
		timeout = f.interval
	}
	if timeout <= 0 || timeout > f.interval {
		return InputError{fmt.Errorf("--nvml.device-timeout=%s must be above 0 and at most --collect-interval (%s)", timeout, f.interval)}
	}
	if f.nvmlInitTimeout <= 0 {
		return InputError{fmt.Errorf("--nvml.init-timeout=%s must be above 0", f.nvmlInitTimeout)}
	}
	if f.nvmlRestartAfter < 0 {
		return InputError{fmt.Errorf("--nvml.restart-after=%s must be 0 (never) or above", f.nvmlRestartAfter)}
	}
	c.Interval = f.interval
	c.Sampler = nvmlsampler.SamplerConfig{DeviceTimeout: timeout, InitTimeout: f.nvmlInitTimeout}
	c.NVMLRestartAfter = f.nvmlRestartAfter
	return nil
}

func (f *flagValues) checkWeb(c *Config) error {
	if f.shutdownTimeout < 0 || f.shutdownTimeout > maxShutdownTimeout {
		return InputError{fmt.Errorf("--web.shutdown-timeout=%s must be 0 (do not wait) to %s", f.shutdownTimeout, maxShutdownTimeout)}
	}
	if f.maxRequests < 0 {
		return InputError{fmt.Errorf("--web.max-requests=%d must be 0 (no limit) or more", f.maxRequests)}
	}
	if f.maxConnections < 0 || (f.maxConnections > 0 && f.maxConnections < 8) {
		return InputError{fmt.Errorf("--web.max-connections=%d must be 0 (no limit) or at least 8", f.maxConnections)}
	}
	l := f.listen
	if l.SystemdSocket && f.listenSet {
		return InputError{errors.New("--web.systemd-socket serves the sockets systemd passes, and --web.listen-address would be ignored: give one of them")}
	}
	for _, a := range l.Addresses {
		if strings.HasPrefix(a, "vsock://") {
			if _, err := server.VsockPort(a); err != nil {
				return InputError{err}
			}
		}
	}
	if len(l.Addresses) == 0 && !l.SystemdSocket {
		return InputError{errors.New("no --web.listen-address: give one (e.g. --web.listen-address=:" + status.DefaultPort + "), or --web.systemd-socket")}
	}
	if p := l.Probe; p != "" {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return InputError{fmt.Errorf("--web.probe-address=%s: want [HOST]:PORT, e.g. :9948 (%v)", p, err)}
		}
		if slices.Contains(l.Addresses, p) && !l.SystemdSocket {
			return InputError{fmt.Errorf("--web.probe-address=%s is also a --web.listen-address: give the probes a port of their own", p)}
		}
	}
	c.Listen, c.ShutdownTimeout = l, f.shutdownTimeout
	if f.webConfigFile != "" {
		wc, err := server.LoadWebConfig(f.webConfigFile)
		if err != nil {
			err = fmt.Errorf("--web.config.file=%s: %w", f.webConfigFile, err)
			if errors.Is(err, server.ErrSetup) {
				return err
			}
			return InputError{err}
		}
		c.WebConfig = wc
	}
	return nil
}

// checkIdle: the idle threshold and window, and the price file (added to
// the prices given with --idle.price; the shapes and those prices were
// parsed with their flags).
func (f *flagValues) checkIdle(c *Config) error {
	idle := f.idle
	if !(idle.Threshold > 0 && idle.Threshold <= 1) { // NaN fails too
		return InputError{fmt.Errorf("--idle.threshold=%v must be above 0 and at most 1 (a fraction, not a percentage)", idle.Threshold)}
	}
	if idle.Window < fragmentation.MinIdleWindow {
		return InputError{fmt.Errorf("--idle.window=%s must be at least %s", idle.Window, fragmentation.MinIdleWindow)}
	}
	if idle.Window > fragmentation.MaxIdleWindow {
		return InputError{fmt.Errorf("--idle.window=%s must be at most %s (7 days)", idle.Window, fragmentation.MaxIdleWindow)}
	}
	p, err := fragmentation.LoadPrices(f.priceFile, f.prices)
	if err != nil {
		return InputError{err}
	}
	c.Derived = state.DerivedConfig{Idle: idle, Prices: p, Shapes: f.shapes}
	return nil
}

// resolveGroups turns --collector.profile and the --[no-]collector.<group>
// flags into the served groups.
func (f *flagValues) resolveGroups(c *Config) error {
	groups, err := render.ProfileGroups(f.profile)
	if err != nil {
		return InputError{fmt.Errorf("--collector.profile=%s: %v", f.profile, err)}
	}
	for g, gf := range f.groupFlags {
		if gf.set {
			groups[g] = gf.on
		}
	}
	c.Groups = groups
	return nil
}

// checkDCGM settles the DCGM mode: --no-collector.dcgm is off, a host
// engine implies standalone, and standalone needs one.
func (f *flagValues) checkDCGM(c *Config) error {
	mode := f.dcgmMode
	if f.dcgmOnSet && !f.dcgmOn {
		if f.dcgmHostEngine != "" {
			return InputError{fmt.Errorf("--no-collector.dcgm contradicts --dcgm.host-engine=%s: drop one of them", f.dcgmHostEngine)}
		}
		mode = dcgm.ModeOff
	}
	if f.dcgmHostEngine != "" {
		if _, _, err := net.SplitHostPort(f.dcgmHostEngine); err != nil {
			return InputError{fmt.Errorf("--dcgm.host-engine=%s: want HOST:PORT, e.g. nvidia-dcgm.gpu-operator.svc:5555 (%v)", f.dcgmHostEngine, err)}
		}
		switch mode {
		case dcgm.ModeAuto:
			mode = dcgm.ModeStandalone
		case dcgm.ModeOff, dcgm.ModeEmbedded:
			return InputError{fmt.Errorf("--dcgm.host-engine=%s contradicts --dcgm.mode=%s: a host engine is for standalone mode", f.dcgmHostEngine, mode)}
		}
	}
	if mode == dcgm.ModeStandalone && f.dcgmHostEngine == "" {
		return InputError{errors.New("--dcgm.mode=standalone needs --dcgm.host-engine=HOST:PORT")}
	}
	if mode != dcgm.ModeOff {
		c.DCGM = &dcgm.Config{Mode: mode, HostEngine: f.dcgmHostEngine, Interval: c.Interval}
	}
	return nil
}

// checkKubelet: the extra resource names, the refresh interval, the call
// deadline within it and the answer size; then the client's own checks
// (socket path length, characters in resource names).
func (f *flagValues) checkKubelet(c *Config) error {
	k := f.kubelet
	for _, r := range k.ExtraResourceNames {
		if strings.TrimSuffix(r, "*") == "" || strings.ContainsAny(r, " ,") {
			return InputError{fmt.Errorf("--kubelet.resource-names=%q: want a resource name such as example.com/gpu, or a prefix ending in *", r)}
		}
	}
	if k.RefreshInterval < time.Second {
		return InputError{fmt.Errorf("--kubelet.refresh-interval=%s is too short: it must be at least 1s", k.RefreshInterval)}
	}
	if k.RefreshInterval > maxKubeletRefresh {
		return InputError{fmt.Errorf("--kubelet.refresh-interval=%s is too long: it must be at most %s (holders the kubelet has not confirmed for 5m are dropped)", k.RefreshInterval, maxKubeletRefresh)}
	}
	if !f.kubeletTimeoutSet && k.CallTimeout > k.RefreshInterval {
		k.CallTimeout = k.RefreshInterval
	}
	if k.CallTimeout <= 0 || k.CallTimeout > k.RefreshInterval {
		return InputError{fmt.Errorf("--kubelet.timeout=%s must be above 0 and at most --kubelet.refresh-interval (%s)", k.CallTimeout, k.RefreshInterval)}
	}
	if f.kubeletMaxBytes < minKubeletMaxBytes || f.kubeletMaxBytes > maxKubeletMaxBytes {
		return InputError{fmt.Errorf("--kubelet.max-response-bytes=%s must be between %s and %s (a refresh needs about 10 bytes of memory per byte of answer)", f.kubeletMaxBytes, units.Base2Bytes(minKubeletMaxBytes), units.Base2Bytes(maxKubeletMaxBytes))}
	}
	k.MaxRecvMsgSize = int(f.kubeletMaxBytes)
	if !f.kubeletEnabled || (f.kubeletOnSet && !f.kubeletOn) {
		return nil
	}
	if err := k.Validate(); err != nil {
		return InputError{fmt.Errorf("%v: check --kubelet.pod-resources-socket and --kubelet.resource-names", err)}
	}
	c.Kubelet = &k
	return nil
}

// checkProcs: how the runtime socket is spelt.
func (f *flagValues) checkProcs(c *Config) error {
	if !f.procsEnabled {
		return nil
	}
	if f.procsCRISocket != "" {
		if err := procs.CheckCRISocket(f.procsCRISocket); err != nil {
			return InputError{fmt.Errorf("--procs.cri-socket=%s: %v", f.procsCRISocket, err)}
		}
	}
	c.Procs = &ProcsConfig{Root: f.procsRoot, RootNamed: f.procsRootSet, LogDir: f.procsLogDir, LogDirNamed: f.procsLogDirSet, CRISocket: f.procsCRISocket}
	return nil
}

// checkCompat reads the counters file, which implies the compatibility
// families: a field it does not know, a bad type or a malformed line is the
// user's to fix (exit 2), named with its line. The pod labels and UID are
// the compatibility families' and need this node's name (a simulated node
// has its own).
func (f *flagValues) checkCompat(c *Config) error {
	on := f.compatDCGM || f.compatCollectors != ""
	podMeta := f.compatPodLabels || f.compatPodUID
	if f.compatDRA && !on {
		return InputError{errors.New("--compat.dcgm-exporter.kubernetes-enable-dra labels the DCGM_FI_* families: it needs --compat.dcgm-exporter (the native families name DRA holders in gpu_allocation_info, resource=\"<driver>\")")}
	}
	if podMeta && !on {
		return InputError{errors.New("--compat.dcgm-exporter.kubernetes-enable-pod-labels and -pod-uid label the DCGM_FI_* families: they need --compat.dcgm-exporter (the native families take pod labels from kube-state-metrics' kube_pod_labels in PromQL: docs/pod-mapping.md)")}
	}
	c.Kubeconfig = f.kubeconfig
	if !on {
		return nil
	}
	host := f.nodeName
	if host == "" {
		host, _ = os.Hostname()
	}
	rel, err := render.CompatReleaseNamed(f.compatRelease)
	if err != nil {
		return InputError{fmt.Errorf("--compat.dcgm-exporter.release: %w", err)}
	}
	if l := f.compatHostnameLabel; l != "" && !slices.Contains(render.HostnameLabels, l) {
		return InputError{fmt.Errorf("--compat.dcgm-exporter.hostname-label=%q: want %s, or nothing for the release line's (%s for %s)", l, strings.Join(render.HostnameLabels, " or "), rel.HostnameLabel, rel.Name)}
	}
	if f.compatXIDWindowMS <= 0 {
		return InputError{fmt.Errorf("--compat.dcgm-exporter.xid-count-window-size=%d: want a window in milliseconds above 0 (dcgm-exporter's default: %d)", f.compatXIDWindowMS, render.DefaultXIDCountWindow.Milliseconds())}
	}
	var resources []string
	for _, r := range f.compatResourceNames {
		for _, n := range strings.Split(r, ",") {
			if n = strings.TrimSpace(n); n == "" {
				continue
			}
			if !strings.Contains(n, "/") {
				return InputError{fmt.Errorf("--compat.dcgm-exporter.nvidia-resource-names: %q: want a device plugin resource name such as nvidia.com/gpu.shared", n)}
			}
			resources = append(resources, n)
		}
	}
	c.Compat = &render.CompatConfig{Release: rel.Name, Hostname: host, HostnameLabel: f.compatHostnameLabel, VirtualGPUs: f.compatVirtualGPUs,
		PodUID: f.compatPodUID, PodLabels: f.compatPodLabels, DRA: f.compatDRA, NvidiaResourceNames: resources,
		XIDCountWindow: time.Duration(f.compatXIDWindowMS) * time.Millisecond}
	if podMeta {
		if f.nodeName == "" && !f.simulated {
			return InputError{errors.New("--compat.dcgm-exporter.kubernetes-enable-pod-labels and -pod-uid watch this node's pods only: give --node-name (the chart sets NODE_NAME from spec.nodeName)")}
		}
		res, err := podmap.ParseLabelAllowlist(f.compatLabelAllowlist)
		if err != nil {
			return InputError{fmt.Errorf("--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex: %w", err)}
		}
		c.PodMeta = &podmap.MetaConfig{NodeName: host, Labels: f.compatPodLabels, LabelAllowlist: res}
	}
	if f.compatCollectors != "" {
		cs, err := render.LoadCompatCounters(f.compatCollectors)
		if err != nil {
			return InputError{fmt.Errorf("--compat.dcgm-exporter.collectors (DCGM_EXPORTER_COLLECTORS): %w", err)}
		}
		c.Compat.Counters = cs
	}
	return nil
}

// conditionType is what a node condition's type may be: a name, or a
// prefixed one (example.com/Name), as the API server's own types are.
var conditionType = regexp.MustCompile(`^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z][A-Za-z0-9_.-]{0,62}$`)

// checkAPIServer: the ResourceSlice watch and the node condition are this
// node's, so they need its name (a simulated node has its own).
func (f *flagValues) checkAPIServer(c *Config) error {
	if !f.resourceSlices && !f.nodeCondition {
		return nil
	}
	if f.nodeName == "" && !f.simulated {
		var which []string
		if f.resourceSlices {
			which = append(which, "--kubernetes.resource-slices watches this node's ResourceSlices")
		}
		if f.nodeCondition {
			which = append(which, "--node-condition writes this node's condition")
		}
		return InputError{fmt.Errorf("%s: give --node-name (the chart sets NODE_NAME from spec.nodeName)", strings.Join(which, " and "))}
	}
	if f.resourceSlices {
		c.Slices = &podmap.SliceConfig{NodeName: f.nodeName, Drivers: f.kubelet.ExtraDRADrivers}
	}
	if f.nodeCondition {
		if !conditionType.MatchString(f.nodeConditionType) {
			return InputError{fmt.Errorf("--node-condition.type=%q: want a condition type such as %s (letters, digits, '_', '.', '-', up to 63, optionally prefixed by a DNS name and '/')", f.nodeConditionType, nodecondition.DefaultType)}
		}
		c.NodeCondition = &nodecondition.Config{NodeName: f.nodeName, Type: f.nodeConditionType}
	}
	return nil
}
