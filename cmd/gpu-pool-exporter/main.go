// Command gpu-pool-exporter exports GPU, pod-allocation and fragmentation
// metrics of one Kubernetes GPU node to Prometheus.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"github.com/rs/zerolog"
	"gopkg.in/yaml.v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	nvmlsampler "github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvml"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap/fakekubelet"
)

// DefaultPort is registered to no other GPU exporter (dcgm-exporter: 9400,
// nvidia_gpu_exporter: 9835, nvidia_gpu_prometheus_exporter: 9445).
const DefaultPort = "9947"

// options are the parsed flags.
type options struct {
	web             *web.FlagConfig
	interval        time.Duration
	deviceTimeout   time.Duration
	nvmlLibrary     string
	sysfs           string
	simulate        bool
	simulateSeed    int64
	simulateFile    string
	simulateSeedSet bool
	logLevel        string
	logFormat       string
	nodeName        string
	maxRequests     int
	maxConnections  int
	probeAddress    string
	shutdownTimeout time.Duration
	pprof           bool

	idleThreshold float64
	idleWindow    time.Duration
	priceFile     string
	priceFlag     string
	shapes        string

	dcgmMode       string
	dcgmHostEngine string

	kubeletEnabled   bool
	kubeletSocket    string
	kubeletSocketSet bool
	kubeletRefresh   time.Duration
	kubeletTimeout   time.Duration
	kubeletResources []string

	procsEnabled   bool
	procsRoot      string
	procsRootSet   bool
	procsLogDir    string
	procsLogDirSet bool
	procsCRISocket string
	profile        string
	groupFlags     map[collector.Group]*groupFlag
	groups         collector.GroupSet
	dcgmOn         bool
	dcgmOnSet      bool
	kubeletOnSet   bool
	kubeletOn      bool
	compatDCGM     bool
}

// groupFlag is one --[no-]collector.<group> flag and whether it was given.
type groupFlag struct {
	on, set bool
}

func init() {
	// Log durations with their unit ("took":"15.99ms"), never a bare number.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	stampVersion()
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// stampVersion fills version.Version from the module and VCS data Go embeds
// (go build, go install) when the Makefile's -ldflags did not set it, so that
// every build says what it is; the revision (vcs.revision, "-modified" when
// vcs.modified) prometheus/common reads itself.
func stampVersion() {
	if bi, ok := debug.ReadBuildInfo(); ok && version.Version == "" {
		version.Version = buildVersion(bi)
	}
}

// buildVersion is the main module's version ("v1.2.0", or Go's pseudo-version
// "v0.0.0-20261203091500-fbbfe06a1b2c+dirty" for an untagged build); a build
// without any (go run) is "devel" plus the revision where Go recorded one.
func buildVersion(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified {
		rev += "+dirty"
	}
	return "devel-" + rev
}

// Upper bounds of duration flags: past them a typo (1000000h) would leave
// the exporter serving a page that never changes.
const (
	maxInterval        = 5 * time.Minute
	maxShutdownTimeout = 5 * time.Minute
	maxKubeletRefresh  = 2 * time.Minute
)

// Exit codes: one rule for every input error, as README's "Failure
// behaviour" says. exitUsage: what the user wrote is wrong (a flag, the
// scenario, the price file, the web config); exitError: the machine is
// (no NVML, the port taken, the server failing).
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// inputError marks an error in what the user wrote (exit 2), where the
// same call can also fail for the machine's reasons (exit 1).
type inputError struct{ error }

func (e inputError) Unwrap() error { return e.error }

type terminated struct{}

func parseFlags(args []string, stdout, stderr io.Writer) (o *options, code int, err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(terminated); !ok {
				panic(r)
			}
			o, code, err = nil, exitOK, nil
		}
	}()
	app := kingpin.New("gpu-pool-exporter", "Prometheus exporter for Kubernetes GPU nodes: NVML/DCGM telemetry, GPU-to-pod mapping, idle allocations and fragmentation. "+
		"`gpu-pool-exporter status [--url=http://localhost:"+DefaultPort+"]` prints who is on each GPU of a running exporter.")
	app.Version(version.Print("gpu-pool-exporter"))
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	// --help and --version end parsing through Terminate; kingpin would
	// call os.Exit, which tests cannot survive.
	app.Terminate(func(int) { panic(terminated{}) })
	o = &options{}
	o.web = kingpinflag.AddFlags(app, ":"+DefaultPort)
	named(app.Flag("collect-interval", "How often GPUs are sampled and /metrics is re-rendered (1s to 5m).").Default("5s")).DurationVar(&o.interval)
	var timeoutSet bool
	named(app.Flag("nvml.device-timeout", "How long one sample waits for one GPU before reporting it down (at most the collect interval; default 2s or the interval if shorter).").Default("2s").IsSetByUser(&timeoutSet)).DurationVar(&o.deviceTimeout)
	app.Flag("nvml.library", "Path of libnvidia-ml.so.1; empty searches LD_LIBRARY_PATH (on GKE: /usr/local/nvidia/lib64/libnvidia-ml.so.1).").Default("").StringVar(&o.nvmlLibrary)
	app.Flag("path.sysfs", "Where the host's sysfs is mounted, for each GPU's NUMA node (bus/pci/devices/<bus id>/numa_node); the deploy files mount it read-only at /host/sys.").Default(nvmlsampler.DefaultSysfs).StringVar(&o.sysfs)
	app.Flag("simulate", "Run on a built-in simulated GPU node instead of real GPUs.").BoolVar(&o.simulate)
	named(app.Flag("simulate.seed", "Seed of the simulated node's telemetry and UUIDs (overrides the scenario's).").Default("1").IsSetByUser(&o.simulateSeedSet)).Int64Var(&o.simulateSeed)
	app.Flag("simulate.scenario", "YAML scenario for the simulated node (implies --simulate).").Default("").StringVar(&o.simulateFile)
	named(app.Flag("log.level", "Log level: debug, info, warn, error.").Default("info")).EnumVar(&o.logLevel, "debug", "info", "warn", "error")
	named(app.Flag("log.format", "Log format: json or console.").Default("json")).EnumVar(&o.logFormat, "json", "console")
	app.Flag("node-name", "Kubernetes node name, for logs and the landing page.").Envar("NODE_NAME").Default("").StringVar(&o.nodeName)
	named(app.Flag("web.max-requests", "Maximum number of concurrent scrapes; more are answered 503 at once (0 = no limit).").Default("40")).IntVar(&o.maxRequests)
	named(app.Flag("web.max-connections", "Maximum number of open connections per listener; more wait in the kernel's accept queue. Bounds memory under slow or idle clients (0 = no limit).").Default("256")).IntVar(&o.maxConnections)
	app.Flag("web.probe-address", "Also serve /healthz and /readyz, and nothing else, on this address without TLS or auth, for the kubelet's probes (e.g. :9948; empty: off). /metrics, / and pprof stay behind --web.config.file.").Default("").StringVar(&o.probeAddress)
	app.Flag("web.enable-pprof", "Serve Go's profiler at /debug/pprof/ (off by default: it exposes internals).").BoolVar(&o.pprof)
	named(app.Flag("web.shutdown-timeout", "How long to wait for scrapes in flight at SIGTERM (0 to 5m).").Default("5s")).DurationVar(&o.shutdownTimeout)
	app.Flag("idle.threshold", "Activity (DCGM SM active, else NVML busy ratio) below which an allocated device counts as idle, 0-1.").Default("0.05").Float64Var(&o.idleThreshold)
	named(app.Flag("idle.window", "How long activity must stay below --idle.threshold before an allocation is idle (10s to 7d). 30m ignores data loading and evaluation gaps; cost alerts want sustained idleness.").Default("30m")).DurationVar(&o.idleWindow)
	app.Flag("idle.price-file", "YAML price list (per GPU-hour by NVML model name; see deploy/prices-example.yaml). Nothing is priced without one.").Default("").StringVar(&o.priceFile)
	app.Flag("idle.price", "Prices per GPU-hour by model, e.g. \"NVIDIA H100 80GB HBM3=11.06\"; added to --idle.price-file.").Default("").StringVar(&o.priceFlag)
	app.Flag("fragmentation.shapes", "Task shapes and popularity weights for the fragmentation gauges: whole-GPU counts and mig-<profile>.").Default(fragmentation.DefaultShapesFlag).StringVar(&o.shapes)
	app.Flag("dcgm.mode", "DCGM: auto (embedded when libdcgm.so.4 loads, else NVML alone), embedded, standalone (needs --dcgm.host-engine) or off.").Default("auto").StringVar(&o.dcgmMode)
	app.Flag("dcgm.host-engine", "HOST:PORT of a DCGM host engine for standalone mode (the GPU Operator's nvidia-dcgm service listens on 5555). Setting it implies --dcgm.mode=standalone.").Default("").StringVar(&o.dcgmHostEngine)
	app.Flag("kubelet.enabled", "Map GPUs to pods through the kubelet's PodResources API (--no-kubelet.enabled outside Kubernetes).").Default("true").BoolVar(&o.kubeletEnabled)
	app.Flag("kubelet.pod-resources-socket", "The kubelet's PodResources socket. With --simulate, setting it maps the simulated GPUs through that kubelet instead of the built-in fake one.").
		Default(podmap.DefaultSocket).IsSetByUser(&o.kubeletSocketSet).StringVar(&o.kubeletSocket)
	named(app.Flag("kubelet.refresh-interval", "How often the pod-to-GPU map is refreshed (in the background; 1s to 2m).").Default("10s")).DurationVar(&o.kubeletRefresh)
	var kubeletTimeoutSet bool
	named(app.Flag("kubelet.timeout", "Deadline of every kubelet call (default 5s, or the refresh interval if shorter).").Default("5s").IsSetByUser(&kubeletTimeoutSet)).DurationVar(&o.kubeletTimeout)
	named(app.Flag("collector.profile", "Starting set of metric groups: default (at most 60 series per GPU), lean (at most 30: what the shipped alerts and dashboards need, PCIe, NVLink, power, clock, tensor and DRAM folded per node by node_summary) or full (every group, per GPU: all but node_summary). --[no-]collector.<group> flags change it; README lists the groups.").
		Default(collector.ProfileDefault)).EnumVar(&o.profile, collector.ProfileNames...)
	o.groupFlags = map[collector.Group]*groupFlag{}
	for _, g := range collector.Groups {
		if g.Name == collector.GroupCore {
			continue
		}
		gf := &groupFlag{}
		o.groupFlags[g.Name] = gf
		app.Flag("collector."+string(g.Name), "Serve "+g.Help+" (--no-collector."+string(g.Name)+" to leave out; default: per --collector.profile).").
			IsSetByUser(&gf.set).BoolVar(&gf.on)
	}
	app.Flag("collector.dcgm", "Read DCGM at all (--no-collector.dcgm is --dcgm.mode=off).").Default("true").IsSetByUser(&o.dcgmOnSet).BoolVar(&o.dcgmOn)
	app.Flag("collector.kubelet", "Map GPUs to pods through the kubelet (--no-collector.kubelet is --no-kubelet.enabled).").Default("true").IsSetByUser(&o.kubeletOnSet).BoolVar(&o.kubeletOn)
	app.Flag("compat.dcgm-exporter", "Also serve dcgm-exporter 4.x's default families (DCGM_FI_*) under its names, units and labels, from the same sample (README: migrating from dcgm-exporter).").
		BoolVar(&o.compatDCGM)
	app.Flag("kubelet.resource-names", "Extra device plugin resource names that hold NVIDIA GPUs (repeatable; a trailing * matches by prefix).").StringsVar(&o.kubeletResources)
	app.Flag("procs.enabled", "Per-process accounting: each container's own VRAM and SM use on shared (time-sliced, MPS) GPUs, from NVML's process lists and the host's /proc (--no-procs.enabled turns it off).").Default("true").BoolVar(&o.procsEnabled)
	app.Flag("procs.proc-root", "The host's /proc as mounted in the exporter (read-only hostPath, e.g. /host/proc; no host PID namespace needed): NVML reports host PIDs, whose cgroup names their container.").
		Default("/proc").IsSetByUser(&o.procsRootSet).StringVar(&o.procsRoot)
	app.Flag("procs.container-log-dir", "The kubelet's /var/log/containers (read-only hostPath): its <pod>_<namespace>_<container>-<id>.log names turn container IDs into pods. Only names are read.").
		Default("/var/log/containers").IsSetByUser(&o.procsLogDirSet).StringVar(&o.procsLogDir)
	app.Flag("procs.cri-socket", "Name containers through the CRI API on this runtime socket (e.g. /run/containerd/containerd.sock) instead of --procs.container-log-dir.").Default("").StringVar(&o.procsCRISocket)
	if _, err := app.Parse(args); err != nil {
		return nil, exitUsage, err
	}
	if o.interval < collector.MinInterval {
		return nil, exitUsage, fmt.Errorf("--collect-interval=%s is too short: it must be at least %s", o.interval, collector.MinInterval)
	}
	if o.interval > maxInterval {
		return nil, exitUsage, fmt.Errorf("--collect-interval=%s is too long: it must be at most %s (a sample older than that is not worth serving)", o.interval, maxInterval)
	}
	if o.shutdownTimeout < 0 || o.shutdownTimeout > maxShutdownTimeout {
		return nil, exitUsage, fmt.Errorf("--web.shutdown-timeout=%s must be 0 (do not wait) to %s", o.shutdownTimeout, maxShutdownTimeout)
	}
	if !timeoutSet && o.deviceTimeout > o.interval {
		o.deviceTimeout = o.interval
	}
	if o.deviceTimeout <= 0 || o.deviceTimeout > o.interval {
		return nil, exitUsage, fmt.Errorf("--nvml.device-timeout=%s must be above 0 and at most --collect-interval (%s)", o.deviceTimeout, o.interval)
	}
	if o.maxRequests < 0 {
		return nil, exitUsage, fmt.Errorf("--web.max-requests=%d must be 0 (no limit) or more", o.maxRequests)
	}
	if o.maxConnections < 0 || (o.maxConnections > 0 && o.maxConnections < 8) {
		return nil, exitUsage, fmt.Errorf("--web.max-connections=%d must be 0 (no limit) or at least 8", o.maxConnections)
	}
	if o.probeAddress != "" {
		if _, _, err := net.SplitHostPort(o.probeAddress); err != nil {
			return nil, exitUsage, fmt.Errorf("--web.probe-address=%s: want [HOST]:PORT, e.g. :9948 (%v)", o.probeAddress, err)
		}
		for _, a := range *o.web.WebListenAddresses {
			if a == o.probeAddress {
				return nil, exitUsage, fmt.Errorf("--web.probe-address=%s is also a --web.listen-address: give the probes a port of their own", o.probeAddress)
			}
		}
	}
	if o.simulateFile != "" {
		o.simulate = true
	}
	if !(o.idleThreshold > 0 && o.idleThreshold <= 1) { // NaN fails too
		return nil, exitUsage, fmt.Errorf("--idle.threshold=%v must be above 0 and at most 1 (a fraction, not a percentage)", o.idleThreshold)
	}
	if o.idleWindow < fragmentation.MinIdleWindow {
		return nil, exitUsage, fmt.Errorf("--idle.window=%s must be at least %s", o.idleWindow, fragmentation.MinIdleWindow)
	}
	if o.idleWindow > fragmentation.MaxIdleWindow {
		return nil, exitUsage, fmt.Errorf("--idle.window=%s must be at most %s (7 days)", o.idleWindow, fragmentation.MaxIdleWindow)
	}
	if _, err := fragmentation.ParseShapes(o.shapes); err != nil {
		return nil, exitUsage, fmt.Errorf("--fragmentation.shapes=%s: %v", o.shapes, err)
	}
	if _, err := fragmentation.ParsePriceFlag(o.priceFlag); err != nil {
		return nil, exitUsage, fmt.Errorf("--idle.price=%s: %v", o.priceFlag, err)
	}
	if f := *o.web.WebConfigFile; f != "" {
		if err := checkFileSize(f, maxWebConfigBytes, "TLS settings and a few users need a few KiB"); err != nil {
			return nil, exitUsage, fmt.Errorf("--web.config.file=%s: %v", f, err)
		}
		if err := web.Validate(f); err != nil {
			return nil, exitUsage, fmt.Errorf("--web.config.file=%s: %v", f, err)
		}
	}
	for _, r := range o.kubeletResources {
		if strings.TrimSuffix(r, "*") == "" || strings.ContainsAny(r, " ,") {
			return nil, exitUsage, fmt.Errorf("--kubelet.resource-names=%q: want a resource name such as example.com/gpu, or a prefix ending in *", r)
		}
	}
	groups, err := collector.ProfileGroups(o.profile)
	if err != nil {
		return nil, exitUsage, fmt.Errorf("--collector.profile=%s: %v", o.profile, err)
	}
	for g, f := range o.groupFlags {
		if f.set {
			groups[g] = f.on
		}
	}
	o.groups = groups
	if o.dcgmOnSet && !o.dcgmOn {
		if o.dcgmHostEngine != "" {
			return nil, exitUsage, fmt.Errorf("--no-collector.dcgm contradicts --dcgm.host-engine=%s: drop one of them", o.dcgmHostEngine)
		}
		o.dcgmMode = string(dcgm.ModeOff)
	}
	if o.kubeletOnSet && !o.kubeletOn {
		o.kubeletEnabled = false
	}
	mode, err := dcgm.ParseMode(o.dcgmMode)
	if err != nil {
		return nil, exitUsage, fmt.Errorf("--dcgm.mode=%s: %v", o.dcgmMode, err)
	}
	if o.dcgmHostEngine != "" {
		if _, _, err := net.SplitHostPort(o.dcgmHostEngine); err != nil {
			return nil, exitUsage, fmt.Errorf("--dcgm.host-engine=%s: want HOST:PORT, e.g. nvidia-dcgm.gpu-operator.svc:5555 (%v)", o.dcgmHostEngine, err)
		}
		switch mode {
		case dcgm.ModeAuto:
			mode = dcgm.ModeStandalone
		case dcgm.ModeOff, dcgm.ModeEmbedded:
			return nil, exitUsage, fmt.Errorf("--dcgm.host-engine=%s contradicts --dcgm.mode=%s: a host engine is for standalone mode", o.dcgmHostEngine, mode)
		}
	}
	if mode == dcgm.ModeStandalone && o.dcgmHostEngine == "" {
		return nil, exitUsage, fmt.Errorf("--dcgm.mode=standalone needs --dcgm.host-engine=HOST:PORT")
	}
	o.dcgmMode = string(mode)
	if o.kubeletRefresh < time.Second {
		return nil, exitUsage, fmt.Errorf("--kubelet.refresh-interval=%s is too short: it must be at least 1s", o.kubeletRefresh)
	}
	if o.kubeletRefresh > maxKubeletRefresh {
		return nil, exitUsage, fmt.Errorf("--kubelet.refresh-interval=%s is too long: it must be at most %s (holders the kubelet has not confirmed for 5m are dropped)", o.kubeletRefresh, maxKubeletRefresh)
	}
	if !kubeletTimeoutSet && o.kubeletTimeout > o.kubeletRefresh {
		o.kubeletTimeout = o.kubeletRefresh
	}
	if o.kubeletTimeout <= 0 || o.kubeletTimeout > o.kubeletRefresh {
		return nil, exitUsage, fmt.Errorf("--kubelet.timeout=%s must be above 0 and at most --kubelet.refresh-interval (%s)", o.kubeletTimeout, o.kubeletRefresh)
	}
	return o, exitOK, nil
}

// maxWebConfigBytes bounds --web.config.file, which is read again while
// serving: inline certificates and keys fit easily.
const maxWebConfigBytes = 256 << 10

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

// named makes a flag's value errors name the flag: kingpin alone says only
// "time: invalid duration".
func named(fc *kingpin.FlagClause) *namedFlag { return &namedFlag{fc} }

type namedFlag struct{ fc *kingpin.FlagClause }

func (n *namedFlag) wrap() {
	m := n.fc.Model()
	n.fc.SetValue(namedValue{name: m.Name, Value: m.Value})
}

func (n *namedFlag) DurationVar(t *time.Duration)         { n.fc.DurationVar(t); n.wrap() }
func (n *namedFlag) IntVar(t *int)                        { n.fc.SetValue(&strictInt{t}); n.wrap() }
func (n *namedFlag) Int64Var(t *int64)                    { n.fc.Int64Var(t); n.wrap() }
func (n *namedFlag) EnumVar(t *string, options ...string) { n.fc.EnumVar(t, options...); n.wrap() }

// strictInt is an int flag that takes whole decimal numbers only: kingpin's
// own parses a float and converts it, so 1.5 became 1 and
// 99999999999999999999 became -9223372036854775808.
type strictInt struct{ v *int }

func (i *strictInt) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, strconv.IntSize)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return fmt.Errorf("out of range (at most %d)", math.MaxInt)
		}
		return errors.New("not a whole number")
	}
	*i.v = int(v)
	return nil
}

func (i *strictInt) String() string { return strconv.Itoa(*i.v) }

type namedValue struct {
	name string
	kingpin.Value
}

func (v namedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return fmt.Errorf("--%s=%s: %v", v.name, s, err)
	}
	return nil
}

func newLogger(o *options, w io.Writer) zerolog.Logger {
	out := w
	if o.logFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	lvl, _ := zerolog.ParseLevel(o.logLevel)
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runStatus(ctx, args[1:], stdout, stderr)
	}
	o, code, err := parseFlags(args, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v (see --help)\n", err)
		return code
	}
	if o == nil {
		return exitOK // --help or --version
	}
	log := newLogger(o, stderr)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()

	derived, err := derivedConfig(o) // a bad price file fails before anything starts
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitUsage
	}
	// Listen before NVML starts: a port in use fails at once, and with :0 the
	// port actually served is known for the start-up log.
	listeners, err := listen(*o.web.WebListenAddresses)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitError
	}
	defer func() {
		for _, l := range listeners {
			l.Close() // no-op once served; frees the port on an early return
		}
	}()
	var probeListener net.Listener
	if o.probeAddress != "" {
		if probeListener, err = net.Listen("tcp", o.probeAddress); err != nil {
			fmt.Fprintf(stderr, "gpu-pool-exporter: cannot listen on --web.probe-address=%s: %v\n", o.probeAddress, err)
			return exitError
		}
		defer probeListener.Close() // likewise
	}
	lib, node, err := openNVML(o, log)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		if errors.As(err, new(inputError)) {
			return exitUsage
		}
		return exitError
	}
	sysfs := o.sysfs
	if node != nil {
		defer node.Close()
		// The simulated GPUs' bus IDs are not this machine's: serve their
		// sysfs from a private directory.
		if dir, err := os.MkdirTemp("", "gpu-pool-exporter-sysfs"); err == nil {
			defer os.RemoveAll(dir)
			if node.WriteSysfs(dir) == nil {
				sysfs = dir
			}
		}
	}
	resolver, closeResolver, err := processResolver(o, node, log)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitUsage
	}
	defer closeResolver()
	sampler, err := nvmlsampler.NewSampler(lib, nvmlsampler.SamplerConfig{DeviceTimeout: o.deviceTimeout, Log: log, Processes: resolver != nil, Sysfs: sysfs})
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitError
	}
	defer sampler.Close()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	cfg := collector.Config{Interval: o.interval, Log: log, RuntimeMetrics: true, Derived: derived, Groups: o.groups,
		Status: collector.StatusInfo{Version: version.Version, Node: o.nodeName, Simulated: o.simulate}, Processes: resolver}
	if o.compatDCGM {
		host := o.nodeName
		if host == "" {
			host, _ = os.Hostname()
		}
		cfg.Compat = &collector.CompatConfig{Hostname: host}
	}
	if src, ok := nvmlsampler.XIDSource(lib); ok && (o.groups.On(collector.GroupXID) || o.compatDCGM) {
		cfg.XID = xid.NewReader(src, nil)
		cfg.XID.Logf = func(f string, a ...any) { log.Warn().Msgf(f, a...) }
		wg.Add(1)
		go func() { defer wg.Done(); _ = cfg.XID.Run(runCtx) }()
	}
	if dm := dcgm.Mode(o.dcgmMode); dm != dcgm.ModeOff {
		dcfg := dcgm.Config{Mode: dm, HostEngine: o.dcgmHostEngine, Interval: o.interval, Log: log.With().Str("component", "dcgm").Logger()}
		open := dcgm.DefaultOpen
		if node != nil {
			open = node.DCGM().Open
		}
		ds := dcgm.NewSampler(dcfg, open)
		cfg.DCGM = ds
		wg.Add(1)
		go func() { defer wg.Done(); ds.Run(runCtx) }()
	}
	if o.kubeletEnabled {
		socket := o.kubeletSocket
		if node != nil && !o.kubeletSocketSet {
			fake, err := startFakeKubelet(runCtx, &wg, node, o.interval, log)
			if err != nil {
				fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
				return exitError
			}
			socket = fake
		}
		client, err := podmap.NewClient(podmap.Config{Socket: socket, RefreshInterval: o.kubeletRefresh, CallTimeout: o.kubeletTimeout,
			ExtraResourceNames: o.kubeletResources, Logger: log.With().Str("component", "podmap").Logger()})
		if err != nil {
			fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
			return exitUsage
		}
		cfg.Pods = client
		wg.Add(1)
		go func() {
			defer wg.Done()
			client.Run(runCtx)
			client.Close() // after Run has returned, never under it
		}()
	}
	exp, err := collector.New(cfg, sampler)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitUsage
	}
	d := sampler.Driver()
	log.Info().Str("version", version.Version).Str("revision", version.GetRevision()).Str("driver", d.DriverVersion).Str("cuda", d.CUDADriverVersion).
		Bool("simulated", o.simulate).Dur("interval", o.interval).Msg("starting gpu-pool-exporter")

	for i, l := range listeners {
		listeners[i] = newLimitListener(l, o.maxConnections)
	}
	srv := newHTTPServer(newMux(exp, o), log)
	done := make(chan struct{})
	go func() { defer close(done); exp.Run(runCtx) }()

	serveErr := make(chan error, 2)
	go func() { serveErr <- serveWeb(listeners, srv, *o.web.WebConfigFile, log) }()
	scheme := webScheme(*o.web.WebConfigFile)
	for _, l := range listeners {
		u := servedURL(scheme, l.Addr())
		// The message stays "serving /metrics" (scripts wait for it); url is
		// what a user opens, shown in console format too.
		log.Info().Str("address", l.Addr().String()).Str("url", u).Int("max_connections", o.maxConnections).Msg("serving /metrics")
	}
	probeSrv := newHTTPServer(newProbeMux(exp), log)
	if probeListener != nil {
		go func() { serveErr <- probeSrv.Serve(newLimitListener(probeListener, probeMaxConnections)) }()
		log.Info().Str("address", probeListener.Addr().String()).Msg("serving /healthz and /readyz for probes (no TLS, no auth)")
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-serveErr:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("HTTP server failed")
			cancel()
			<-done
			return exitError
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer scancel()
	_ = srv.Shutdown(sctx)
	_ = probeSrv.Shutdown(sctx)
	cancel()
	<-done
	return exitOK
}

// derivedConfig reads the idle, price and fragmentation settings.
func derivedConfig(o *options) (collector.DerivedConfig, error) {
	shapes, _ := fragmentation.ParseShapes(o.shapes) // checked in parseFlags
	dc := collector.DerivedConfig{
		Idle:   fragmentation.IdleConfig{Threshold: o.idleThreshold, Window: o.idleWindow},
		Shapes: shapes,
	}
	var prices *fragmentation.PriceList
	if o.priceFile != "" {
		var err error
		if prices, err = fragmentation.LoadPriceList(o.priceFile); err != nil {
			return dc, fmt.Errorf("--idle.price-file: %w", err)
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

func listen(addrs []string) ([]net.Listener, error) {
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			if errors.Is(err, syscall.EADDRINUSE) {
				_, port, _ := net.SplitHostPort(a)
				return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: port %s is already in use by another process "+
					"(which would answer your requests instead); choose a free port with --web.listen-address, e.g. --web.listen-address=:%s", a, port, otherPort(port))
			}
			return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// otherPort suggests the next port up, for the port-in-use message.
func otherPort(port string) string {
	if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65535 {
		return strconv.Itoa(n + 1)
	}
	return "9948"
}

// servedURL is the URL a user on this machine opens to reach listener addr:
// an unspecified host (":9947") becomes localhost.
func servedURL(scheme string, addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return scheme + "://" + addr.String() + "/"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "localhost"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/"
}

// webScheme is https when the web config turns TLS on. The file has been
// validated by then; a read failure here just means http.
func webScheme(webConfigFile string) string {
	if webConfigFile == "" {
		return "http"
	}
	b, err := os.ReadFile(webConfigFile)
	if err != nil {
		return "http"
	}
	var c struct {
		TLS struct {
			Cert     string `yaml:"cert"`
			CertFile string `yaml:"cert_file"`
		} `yaml:"tls_server_config"`
	}
	if yaml.Unmarshal(b, &c) == nil && (c.TLS.Cert != "" || c.TLS.CertFile != "") {
		return "https"
	}
	return "http"
}

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
