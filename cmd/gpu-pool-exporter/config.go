package main

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/alecthomas/units"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/cmd/gpu-pool-exporter/internal/server"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// config is the command line, parsed and checked once (parseConfig): the
// wiring and the server take their values from it and parse nothing again.
// The *Set fields say whether the user gave a flag, where its default
// depends on another flag or on --simulate.
type config struct {
	// Serving: where (listen), the web config, limits and extras.
	listen          server.ListenConfig
	listenSet       bool
	webConfigFile   string
	webConfig       *server.WebConfig // parsed --web.config.file; nil without one
	maxRequests     int
	maxConnections  int
	pprof           bool
	shutdownTimeout time.Duration

	// Sampling.
	interval         time.Duration
	deviceTimeout    time.Duration
	deviceTimeoutSet bool
	nvmlInitTimeout  time.Duration
	nvmlRestartAfter time.Duration
	nvmlLibrary      string
	sysfs            string

	// The simulated node: scenario is --simulate.scenario parsed (the
	// built-in scenario without it), with --simulate.seed applied.
	simulate        bool
	scenarioFile    string
	scenario        *simnode.Scenario
	simulateSeed    int64
	simulateSeedSet bool

	logLevel  zerolog.Level
	logFormat string
	nodeName  string

	// Derived gauges: idle threshold and window, task shapes, and prices
	// (the file's merged with --idle.price's).
	derived   state.DerivedConfig
	priceFile string
	prices    map[string]float64 // --idle.price

	dcgmMode       dcgm.Mode
	dcgmHostEngine string

	kubeletEnabled    bool
	kubelet           podmap.Config // Socket, RefreshInterval, CallTimeout, ExtraResourceNames
	kubeletSocketSet  bool
	kubeletTimeoutSet bool
	kubeletMaxBytes   units.Base2Bytes

	procsEnabled   bool
	procsRoot      string
	procsRootSet   bool
	procsLogDir    string
	procsLogDirSet bool
	procsCRISocket string

	// Metric groups: the profile with the --[no-]collector.<group> flags
	// on top (groups), and whole sources switched off.
	profile      string
	groupFlags   map[render.Group]*groupFlag
	groups       render.GroupSet
	dcgmOn       bool
	dcgmOnSet    bool
	kubeletOn    bool
	kubeletOnSet bool
	compatDCGM   bool
	// compatHostnameLabel and compatVirtualGPUs shape the dcgm-exporter
	// families (CompatConfig).
	compatHostnameLabel string
	compatVirtualGPUs   bool
	// compatCollectors is dcgm-exporter's counters file (-f), parsed into
	// compatCounters by check.
	compatCollectors string
	compatCounters   *render.CompatCounters
	// compatPodLabels and compatPodUID add the holders' pod labels and UID
	// from the API server (--kubernetes.kubeconfig, else in-cluster), as
	// dcgm-exporter's --kubernetes-enable-pod-*; compatLabelAllowlist is
	// parsed into compatLabelRegexps by check.
	compatPodLabels      bool
	compatPodUID         bool
	compatLabelAllowlist []string
	compatLabelRegexps   []*regexp.Regexp
	kubeconfig           string
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

// check checks the parsed flags across each other, fills in what depends
// on other flags (defaults bounded by an interval, modes implied by another
// flag, the metric groups) and reads the files the flags name (web config,
// price list, scenario). Each error names the flag, what was wrong and what
// it accepts, and is the user's (exit 2) unless the machine failed (exit 1):
// once the exporter starts building, a failure is the machine's. Nothing is
// built here to be thrown away.
func (c *config) check() error {
	for _, check := range []func() error{c.checkSampling, c.checkSimulation, c.checkWeb, c.checkIdle, c.resolveGroups, c.checkDCGM, c.checkKubelet, c.checkProcs, c.checkCompat} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkSampling: the collect interval and the per-GPU timeout within it.
func (c *config) checkSampling() error {
	if c.interval < collector.MinInterval {
		return inputError{fmt.Errorf("--collect-interval=%s is too short: it must be at least %s", c.interval, collector.MinInterval)}
	}
	if c.interval > maxInterval {
		return inputError{fmt.Errorf("--collect-interval=%s is too long: it must be at most %s (a sample older than that is not worth serving)", c.interval, maxInterval)}
	}
	if !c.deviceTimeoutSet && c.deviceTimeout > c.interval {
		c.deviceTimeout = c.interval
	}
	if c.deviceTimeout <= 0 || c.deviceTimeout > c.interval {
		return inputError{fmt.Errorf("--nvml.device-timeout=%s must be above 0 and at most --collect-interval (%s)", c.deviceTimeout, c.interval)}
	}
	if c.nvmlInitTimeout <= 0 {
		return inputError{fmt.Errorf("--nvml.init-timeout=%s must be above 0", c.nvmlInitTimeout)}
	}
	if c.nvmlRestartAfter < 0 {
		return inputError{fmt.Errorf("--nvml.restart-after=%s must be 0 (never) or above", c.nvmlRestartAfter)}
	}
	return nil
}

// checkSimulation reads the scenario (implying --simulate) and applies the
// seed.
func (c *config) checkSimulation() error {
	if c.scenarioFile != "" {
		c.simulate = true
	}
	if !c.simulate {
		return nil
	}
	c.scenario = simnode.DefaultScenario()
	if c.scenarioFile != "" {
		var err error
		if c.scenario, err = simnode.LoadScenario(c.scenarioFile); err != nil {
			return inputError{fmt.Errorf("--simulate.scenario=%s: %w", c.scenarioFile, err)}
		}
	}
	if c.simulateSeedSet || c.scenario.Seed == 0 {
		c.scenario.Seed = c.simulateSeed
	}
	return nil
}

func (c *config) checkWeb() error {
	if c.shutdownTimeout < 0 || c.shutdownTimeout > maxShutdownTimeout {
		return inputError{fmt.Errorf("--web.shutdown-timeout=%s must be 0 (do not wait) to %s", c.shutdownTimeout, maxShutdownTimeout)}
	}
	if c.maxRequests < 0 {
		return inputError{fmt.Errorf("--web.max-requests=%d must be 0 (no limit) or more", c.maxRequests)}
	}
	if c.maxConnections < 0 || (c.maxConnections > 0 && c.maxConnections < 8) {
		return inputError{fmt.Errorf("--web.max-connections=%d must be 0 (no limit) or at least 8", c.maxConnections)}
	}
	if c.listen.SystemdSocket && c.listenSet {
		return inputError{errors.New("--web.systemd-socket serves the sockets systemd passes, and --web.listen-address would be ignored: give one of them")}
	}
	for _, a := range c.listen.Addresses {
		if strings.HasPrefix(a, "vsock://") {
			if _, err := server.VsockPort(a); err != nil {
				return inputError{err}
			}
		}
	}
	if len(c.listen.Addresses) == 0 && !c.listen.SystemdSocket {
		return inputError{errors.New("no --web.listen-address: give one (e.g. --web.listen-address=:" + DefaultPort + "), or --web.systemd-socket")}
	}
	if p := c.listen.Probe; p != "" {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return inputError{fmt.Errorf("--web.probe-address=%s: want [HOST]:PORT, e.g. :9948 (%v)", p, err)}
		}
		if slices.Contains(c.listen.Addresses, p) && !c.listen.SystemdSocket {
			return inputError{fmt.Errorf("--web.probe-address=%s is also a --web.listen-address: give the probes a port of their own", p)}
		}
	}
	if c.webConfigFile != "" {
		wc, err := server.LoadWebConfig(c.webConfigFile)
		if err != nil {
			err = fmt.Errorf("--web.config.file=%s: %w", c.webConfigFile, err)
			if errors.Is(err, server.ErrSetup) {
				return err
			}
			return inputError{err}
		}
		c.webConfig = wc
	}
	return nil
}

// checkIdle: the idle threshold and window, and the price file (added to
// the prices given with --idle.price; the shapes and those prices were
// parsed with their flags).
func (c *config) checkIdle() error {
	idle := c.derived.Idle
	if !(idle.Threshold > 0 && idle.Threshold <= 1) { // NaN fails too
		return inputError{fmt.Errorf("--idle.threshold=%v must be above 0 and at most 1 (a fraction, not a percentage)", idle.Threshold)}
	}
	if idle.Window < fragmentation.MinIdleWindow {
		return inputError{fmt.Errorf("--idle.window=%s must be at least %s", idle.Window, fragmentation.MinIdleWindow)}
	}
	if idle.Window > fragmentation.MaxIdleWindow {
		return inputError{fmt.Errorf("--idle.window=%s must be at most %s (7 days)", idle.Window, fragmentation.MaxIdleWindow)}
	}
	p, err := loadPrices(c.priceFile, c.prices)
	if err != nil {
		return inputError{err}
	}
	c.derived.Prices = p
	return nil
}

// loadPrices reads --idle.price-file (where given) and adds --idle.price's
// prices to it: nil where neither gives a price.
func loadPrices(file string, extra map[string]float64) (*fragmentation.PriceList, error) {
	var list *fragmentation.PriceList
	if file != "" {
		var err error
		if list, err = fragmentation.LoadPriceList(file); err != nil {
			return nil, fmt.Errorf("--idle.price-file: %w", err)
		}
	}
	if len(extra) > 0 {
		if list == nil {
			list = &fragmentation.PriceList{PerGPUHour: map[string]float64{}}
		}
		maps.Copy(list.PerGPUHour, extra)
	}
	return list, nil
}

// resolveGroups turns --collector.profile and the --[no-]collector.<group>
// flags into the served groups; --no-collector.dcgm and
// --no-collector.kubelet switch their sources off.
func (c *config) resolveGroups() error {
	groups, err := render.ProfileGroups(c.profile)
	if err != nil {
		return inputError{fmt.Errorf("--collector.profile=%s: %v", c.profile, err)}
	}
	for g, f := range c.groupFlags {
		if f.set {
			groups[g] = f.on
		}
	}
	c.groups = groups
	if c.dcgmOnSet && !c.dcgmOn {
		if c.dcgmHostEngine != "" {
			return inputError{fmt.Errorf("--no-collector.dcgm contradicts --dcgm.host-engine=%s: drop one of them", c.dcgmHostEngine)}
		}
		c.dcgmMode = dcgm.ModeOff
	}
	if c.kubeletOnSet && !c.kubeletOn {
		c.kubeletEnabled = false
	}
	return nil
}

// checkDCGM settles the DCGM mode: a host engine implies standalone, and
// standalone needs one.
func (c *config) checkDCGM() error {
	if c.dcgmHostEngine != "" {
		if _, _, err := net.SplitHostPort(c.dcgmHostEngine); err != nil {
			return inputError{fmt.Errorf("--dcgm.host-engine=%s: want HOST:PORT, e.g. nvidia-dcgm.gpu-operator.svc:5555 (%v)", c.dcgmHostEngine, err)}
		}
		switch c.dcgmMode {
		case dcgm.ModeAuto:
			c.dcgmMode = dcgm.ModeStandalone
		case dcgm.ModeOff, dcgm.ModeEmbedded:
			return inputError{fmt.Errorf("--dcgm.host-engine=%s contradicts --dcgm.mode=%s: a host engine is for standalone mode", c.dcgmHostEngine, c.dcgmMode)}
		}
	}
	if c.dcgmMode == dcgm.ModeStandalone && c.dcgmHostEngine == "" {
		return inputError{errors.New("--dcgm.mode=standalone needs --dcgm.host-engine=HOST:PORT")}
	}
	return nil
}

// checkKubelet: the extra resource names, the refresh interval, the call
// deadline within it and the answer size; then the client's own checks
// (socket path length, characters in resource names).
func (c *config) checkKubelet() error {
	k := &c.kubelet
	for _, r := range k.ExtraResourceNames {
		if strings.TrimSuffix(r, "*") == "" || strings.ContainsAny(r, " ,") {
			return inputError{fmt.Errorf("--kubelet.resource-names=%q: want a resource name such as example.com/gpu, or a prefix ending in *", r)}
		}
	}
	if k.RefreshInterval < time.Second {
		return inputError{fmt.Errorf("--kubelet.refresh-interval=%s is too short: it must be at least 1s", k.RefreshInterval)}
	}
	if k.RefreshInterval > maxKubeletRefresh {
		return inputError{fmt.Errorf("--kubelet.refresh-interval=%s is too long: it must be at most %s (holders the kubelet has not confirmed for 5m are dropped)", k.RefreshInterval, maxKubeletRefresh)}
	}
	if !c.kubeletTimeoutSet && k.CallTimeout > k.RefreshInterval {
		k.CallTimeout = k.RefreshInterval
	}
	if k.CallTimeout <= 0 || k.CallTimeout > k.RefreshInterval {
		return inputError{fmt.Errorf("--kubelet.timeout=%s must be above 0 and at most --kubelet.refresh-interval (%s)", k.CallTimeout, k.RefreshInterval)}
	}
	if c.kubeletMaxBytes < minKubeletMaxBytes || c.kubeletMaxBytes > maxKubeletMaxBytes {
		return inputError{fmt.Errorf("--kubelet.max-response-bytes=%s must be between %s and %s (a refresh needs about 10 bytes of memory per byte of answer)", c.kubeletMaxBytes, units.Base2Bytes(minKubeletMaxBytes), units.Base2Bytes(maxKubeletMaxBytes))}
	}
	k.MaxRecvMsgSize = int(c.kubeletMaxBytes)
	if !c.kubeletEnabled {
		return nil
	}
	if err := k.Validate(); err != nil {
		return inputError{fmt.Errorf("%v: check --kubelet.pod-resources-socket and --kubelet.resource-names", err)}
	}
	return nil
}

// checkProcs: how the runtime socket is spelt.
func (c *config) checkProcs() error {
	if !c.procsEnabled || c.procsCRISocket == "" {
		return nil
	}
	if err := procs.CheckCRISocket(c.procsCRISocket); err != nil {
		return inputError{fmt.Errorf("--procs.cri-socket=%s: %v", c.procsCRISocket, err)}
	}
	return nil
}

// checkCompat reads the counters file, which implies the compatibility
// families: a field it does not know, a bad type or a malformed line is the
// user's to fix (exit 2), named with its line. The pod labels and UID are
// the compatibility families' and need this node's name.
func (c *config) checkCompat() error {
	if c.compatPodLabels || c.compatPodUID {
		if !c.compatDCGM && c.compatCollectors == "" {
			return inputError{errors.New("--compat.dcgm-exporter.kubernetes-enable-pod-labels and -pod-uid label the DCGM_FI_* families: they need --compat.dcgm-exporter (the native families take pod labels from kube-state-metrics' kube_pod_labels in PromQL: docs/pod-mapping.md)")}
		}
		if c.nodeName == "" && !c.simulate {
			return inputError{errors.New("--compat.dcgm-exporter.kubernetes-enable-pod-labels and -pod-uid watch this node's pods only: give --node-name (the chart sets NODE_NAME from spec.nodeName)")}
		}
		res, err := podmap.ParseLabelAllowlist(c.compatLabelAllowlist)
		if err != nil {
			return inputError{fmt.Errorf("--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex: %w", err)}
		}
		c.compatLabelRegexps = res
	}
	if c.compatCollectors == "" {
		return nil
	}
	c.compatDCGM = true
	cs, err := render.LoadCompatCounters(c.compatCollectors)
	if err != nil {
		return inputError{fmt.Errorf("--compat.dcgm-exporter.collectors (DCGM_EXPORTER_COLLECTORS): %w", err)}
	}
	c.compatCounters = cs
	return nil
}
