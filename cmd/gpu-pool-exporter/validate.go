package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/units"

	"github.com/prometheus/exporter-toolkit/web"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// Upper bounds of duration flags: past them a typo (1000000h) would leave
// the exporter serving a page that never changes.
const (
	maxInterval        = 5 * time.Minute
	maxShutdownTimeout = 5 * time.Minute
	maxKubeletRefresh  = 2 * time.Minute
)

// criTimeout is the deadline of every call to the container runtime.
const criTimeout = 2 * time.Second

// maxWebConfigBytes bounds --web.config.file, which is read again while
// serving: inline certificates and keys fit easily.
const maxWebConfigBytes = 256 << 10

// validate checks the parsed flags and fills in what depends on other flags
// (defaults bounded by an interval, modes implied by another flag, the
// metric groups). Each error names the flag, what was wrong and what it
// accepts. Every check of a flag's value is made here, so that a failure
// once the exporter starts building is the machine's (exit 1), never the
// user's (exit 2); only files read at start (scenario, price list) are
// checked later.
func (o *options) validate() error {
	for _, check := range []func() error{o.checkSampling, o.checkWeb, o.checkIdle, o.resolveGroups, o.checkDCGM, o.checkKubelet, o.checkProcs} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkSampling: the collect interval, the per-GPU timeout within it, and
// --simulate implied by a scenario.
func (o *options) checkSampling() error {
	if o.interval < collector.MinInterval {
		return fmt.Errorf("--collect-interval=%s is too short: it must be at least %s", o.interval, collector.MinInterval)
	}
	if o.interval > maxInterval {
		return fmt.Errorf("--collect-interval=%s is too long: it must be at most %s (a sample older than that is not worth serving)", o.interval, maxInterval)
	}
	if !o.deviceTimeoutSet && o.deviceTimeout > o.interval {
		o.deviceTimeout = o.interval
	}
	if o.deviceTimeout <= 0 || o.deviceTimeout > o.interval {
		return fmt.Errorf("--nvml.device-timeout=%s must be above 0 and at most --collect-interval (%s)", o.deviceTimeout, o.interval)
	}
	if o.nvmlInitTimeout <= 0 {
		return fmt.Errorf("--nvml.init-timeout=%s must be above 0", o.nvmlInitTimeout)
	}
	if o.nvmlRestartAfter < 0 {
		return fmt.Errorf("--nvml.restart-after=%s must be 0 (never) or above", o.nvmlRestartAfter)
	}
	if o.simulateFile != "" {
		o.simulate = true
	}
	return nil
}

func (o *options) checkWeb() error {
	if o.shutdownTimeout < 0 || o.shutdownTimeout > maxShutdownTimeout {
		return fmt.Errorf("--web.shutdown-timeout=%s must be 0 (do not wait) to %s", o.shutdownTimeout, maxShutdownTimeout)
	}
	if o.maxRequests < 0 {
		return fmt.Errorf("--web.max-requests=%d must be 0 (no limit) or more", o.maxRequests)
	}
	if o.maxConnections < 0 || (o.maxConnections > 0 && o.maxConnections < 8) {
		return fmt.Errorf("--web.max-connections=%d must be 0 (no limit) or at least 8", o.maxConnections)
	}
	if o.probeAddress != "" {
		if _, _, err := net.SplitHostPort(o.probeAddress); err != nil {
			return fmt.Errorf("--web.probe-address=%s: want [HOST]:PORT, e.g. :9948 (%v)", o.probeAddress, err)
		}
		for _, a := range *o.web.WebListenAddresses {
			if a == o.probeAddress {
				return fmt.Errorf("--web.probe-address=%s is also a --web.listen-address: give the probes a port of their own", o.probeAddress)
			}
		}
	}
	if f := *o.web.WebConfigFile; f != "" {
		if err := checkFileSize(f, maxWebConfigBytes, "TLS settings and a few users need a few KiB"); err != nil {
			return fmt.Errorf("--web.config.file=%s: %v", f, err)
		}
		if err := web.Validate(f); err != nil {
			return fmt.Errorf("--web.config.file=%s: %v", f, err)
		}
	}
	return nil
}

// checkIdle: the idle threshold and window, the task shapes and the prices
// given on the command line (the price file is read when the exporter
// starts).
func (o *options) checkIdle() error {
	if !(o.idleThreshold > 0 && o.idleThreshold <= 1) { // NaN fails too
		return fmt.Errorf("--idle.threshold=%v must be above 0 and at most 1 (a fraction, not a percentage)", o.idleThreshold)
	}
	if o.idleWindow < fragmentation.MinIdleWindow {
		return fmt.Errorf("--idle.window=%s must be at least %s", o.idleWindow, fragmentation.MinIdleWindow)
	}
	if o.idleWindow > fragmentation.MaxIdleWindow {
		return fmt.Errorf("--idle.window=%s must be at most %s (7 days)", o.idleWindow, fragmentation.MaxIdleWindow)
	}
	if _, err := fragmentation.ParseShapes(o.shapes); err != nil {
		return fmt.Errorf("--fragmentation.shapes=%s: %v", o.shapes, err)
	}
	if _, err := fragmentation.ParsePriceFlag(o.priceFlag); err != nil {
		return fmt.Errorf("--idle.price=%s: %v", o.priceFlag, err)
	}
	return nil
}

// resolveGroups turns --collector.profile and the --[no-]collector.<group>
// flags into the served groups; --no-collector.dcgm and
// --no-collector.kubelet switch their sources off.
func (o *options) resolveGroups() error {
	groups, err := render.ProfileGroups(o.profile)
	if err != nil {
		return fmt.Errorf("--collector.profile=%s: %v", o.profile, err)
	}
	for g, f := range o.groupFlags {
		if f.set {
			groups[g] = f.on
		}
	}
	o.groups = groups
	if o.dcgmOnSet && !o.dcgmOn {
		if o.dcgmHostEngine != "" {
			return fmt.Errorf("--no-collector.dcgm contradicts --dcgm.host-engine=%s: drop one of them", o.dcgmHostEngine)
		}
		o.dcgmMode = string(dcgm.ModeOff)
	}
	if o.kubeletOnSet && !o.kubeletOn {
		o.kubeletEnabled = false
	}
	return nil
}

// checkDCGM settles the DCGM mode: a host engine implies standalone, and
// standalone needs one.
func (o *options) checkDCGM() error {
	mode, err := dcgm.ParseMode(o.dcgmMode)
	if err != nil {
		return fmt.Errorf("--dcgm.mode=%s: %v", o.dcgmMode, err)
	}
	if o.dcgmHostEngine != "" {
		if _, _, err := net.SplitHostPort(o.dcgmHostEngine); err != nil {
			return fmt.Errorf("--dcgm.host-engine=%s: want HOST:PORT, e.g. nvidia-dcgm.gpu-operator.svc:5555 (%v)", o.dcgmHostEngine, err)
		}
		switch mode {
		case dcgm.ModeAuto:
			mode = dcgm.ModeStandalone
		case dcgm.ModeOff, dcgm.ModeEmbedded:
			return fmt.Errorf("--dcgm.host-engine=%s contradicts --dcgm.mode=%s: a host engine is for standalone mode", o.dcgmHostEngine, mode)
		}
	}
	if mode == dcgm.ModeStandalone && o.dcgmHostEngine == "" {
		return fmt.Errorf("--dcgm.mode=standalone needs --dcgm.host-engine=HOST:PORT")
	}
	o.dcgmMode = string(mode)
	return nil
}

// checkKubelet: the extra resource names, the refresh interval and the
// call deadline within it.
func (o *options) checkKubelet() error {
	for _, r := range o.kubeletResources {
		if strings.TrimSuffix(r, "*") == "" || strings.ContainsAny(r, " ,") {
			return fmt.Errorf("--kubelet.resource-names=%q: want a resource name such as example.com/gpu, or a prefix ending in *", r)
		}
	}
	if o.kubeletRefresh < time.Second {
		return fmt.Errorf("--kubelet.refresh-interval=%s is too short: it must be at least 1s", o.kubeletRefresh)
	}
	if o.kubeletRefresh > maxKubeletRefresh {
		return fmt.Errorf("--kubelet.refresh-interval=%s is too long: it must be at most %s (holders the kubelet has not confirmed for 5m are dropped)", o.kubeletRefresh, maxKubeletRefresh)
	}
	if !o.kubeletTimeoutSet && o.kubeletTimeout > o.kubeletRefresh {
		o.kubeletTimeout = o.kubeletRefresh
	}
	if o.kubeletTimeout <= 0 || o.kubeletTimeout > o.kubeletRefresh {
		return fmt.Errorf("--kubelet.timeout=%s must be above 0 and at most --kubelet.refresh-interval (%s)", o.kubeletTimeout, o.kubeletRefresh)
	}
	n, err := units.ParseBase2Bytes(o.kubeletMaxBytesFlag)
	if err != nil {
		return fmt.Errorf("--kubelet.max-response-bytes=%s: want a size such as 6MiB or 16MiB", o.kubeletMaxBytesFlag)
	}
	if o.kubeletMaxBytes = n; o.kubeletMaxBytes < minKubeletMaxBytes || o.kubeletMaxBytes > maxKubeletMaxBytes {
		return fmt.Errorf("--kubelet.max-response-bytes=%s must be between %s and %s (a refresh needs about 10 bytes of memory per byte of answer)", o.kubeletMaxBytes, units.Base2Bytes(minKubeletMaxBytes), units.Base2Bytes(maxKubeletMaxBytes))
	}
	if !o.kubeletEnabled {
		return nil
	}
	// The client checks more than the above (socket path length, characters
	// in resource names); building one does no I/O.
	c, err := podmap.NewClient(podmap.Config{Socket: o.kubeletSocket, RefreshInterval: o.kubeletRefresh, CallTimeout: o.kubeletTimeout,
		ExtraResourceNames: o.kubeletResources})
	if err != nil {
		return fmt.Errorf("%v: check --kubelet.pod-resources-socket and --kubelet.resource-names", err)
	}
	_ = c.Close()
	return nil
}

// checkProcs checks how the runtime socket is spelt by building its client,
// which does not connect before its first call.
func (o *options) checkProcs() error {
	if !o.procsEnabled || o.procsCRISocket == "" {
		return nil
	}
	c, err := procs.NewCRI(o.procsCRISocket, criTimeout)
	if err != nil {
		return fmt.Errorf("--procs.cri-socket=%s: %v", o.procsCRISocket, err)
	}
	_ = c.Close()
	return nil
}

// checkFileSize refuses a file over limit bytes before anything parses it.
func checkFileSize(path string, limit int64, why string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(f, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return fmt.Errorf("the file is larger than the limit of %d bytes (%d KiB); %s", limit, limit>>10, why)
	}
	return nil
}

// Bounds of --kubelet.max-response-bytes: gRPC's own 4 MiB default is
// the least a big node needs; 1 GiB of answer would need about 10 GiB.
const (
	minKubeletMaxBytes = 4 << 20
	maxKubeletMaxBytes = 1 << 30
)
