package agent

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/alecthomas/units"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nodecondition"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

// terminated is what --help and --version panic with to end parsing.
type terminated struct{}

// ParseConfig parses and checks the command line into a Config, with the
// flags of sim (nil for the agent). It returns a nil Config and ExitOK
// after --help or --version, and the exit code with the error for a bad
// command line (ExitUsage) or a machine that cannot check it (ExitError).
func ParseConfig(args []string, stdout, stderr io.Writer, sim Simulation) (c *Config, code int, err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(terminated); !ok {
				panic(r)
			}
			c, code, err = nil, ExitOK, nil
		}
	}()
	app, f, tk := newFlags(stdout, stderr, sim)
	if _, err := app.Parse(args); err != nil {
		return nil, ExitUsage, err
	}
	f.listen.Addresses, f.listen.SystemdSocket, f.webConfigFile = *tk.WebListenAddresses, *tk.WebSystemdSocket, *tk.WebConfigFile
	if c, err = f.check(); err != nil {
		return nil, exitCode(err), err
	}
	if sim != nil {
		// The simulation's own flags, after the agent's: its errors are the
		// user's (a scenario that does not parse).
		s, err := sim.Check(c)
		if err != nil {
			if !errors.As(err, new(InputError)) {
				err = InputError{err}
			}
			return nil, ExitUsage, err
		}
		c.Simulation = s
	}
	return c, ExitOK, nil
}

// newFlags is the exporter's command line: the application, the values its
// flags fill, and exporter-toolkit's flags, which ParseConfig copies into
// them; sim's flags are added where sim is not nil.
func newFlags(stdout, stderr io.Writer, sim Simulation) (*kingpin.Application, *flagValues, *web.FlagConfig) {
	app := newApp(stdout, stderr, sim)
	f := &flagValues{simulated: sim != nil}
	tk := kingpinflag.AddFlags(app, ":"+status.DefaultPort)
	app.GetFlag("web.listen-address").IsSetByUser(&f.listenSet)
	addSamplingFlags(app, f)
	addLogFlags(app, f)
	addWebFlags(app, f)
	addIdleFlags(app, f)
	addDCGMFlags(app, f)
	addKubeletFlags(app, f)
	addCollectorFlags(app, f)
	addProcsFlags(app, f)
	if sim != nil {
		sim.AddFlags(app)
	}
	return app, f, tk
}

// usageText heads --help, exit codes included for whoever scripts around
// the exporter.
const usageText = "Prometheus exporter for Kubernetes GPU nodes: NVML/DCGM telemetry, GPU-to-pod mapping, idle allocations and fragmentation. " +
	"The image's gpupool command answers people: `gpupool status [--url=http://localhost:" + status.DefaultPort + "]` prints who is on each GPU of a running exporter; " +
	"`gpupool fleet --prometheus=URL` the fleet's free capacity, idle cost and GPUs to replace; " +
	"`gpupool recommend --prometheus=URL` a GPU shape per workload from a week of use, `gpupool report --prometheus=URL` GPU-hours and cost per namespace, owner or pod label. " +
	"gpu-pool-exporter-sim runs this exporter on a simulated GPU node. " +
	"Exit codes: 0 after a clean shutdown, --help or --version; " +
	"1 when the machine fails it (no NVML, a port in use, a setup step or a server that fails); " +
	"2 when what you wrote is wrong (a flag, the scenario, the price file, the web config)."

func newApp(stdout, stderr io.Writer, sim Simulation) *kingpin.Application {
	name, help := "gpu-pool-exporter", usageText
	if sim != nil {
		name, help = sim.Name(), sim.Help()+" "+usageText
	}
	app := kingpin.New(name, help)
	app.Version(version.Print(name))
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	// --help and --version end parsing through Terminate; kingpin would
	// call os.Exit, which tests cannot survive.
	app.Terminate(func(int) { panic(terminated{}) })
	return app
}

// addSamplingFlags: how often and from where GPUs are read.
func addSamplingFlags(app *kingpin.Application, f *flagValues) {
	named(app.Flag("collect-interval", "How often GPUs are sampled and /metrics is re-rendered (1s to 5m).").Default("5s")).DurationVar(&f.interval)
	named(app.Flag("nvml.device-timeout", "How long one sample waits for one GPU before reporting it down (at most the collect interval; default 2s or the interval if shorter).").Default("2s").IsSetByUser(&f.deviceTimeoutSet)).DurationVar(&f.deviceTimeout)
	named(app.Flag("nvml.init-timeout", "How long nvmlInit may take before the exporter says, in its log and on its page, that it is waiting for the driver (the exporter serves meanwhile; /readyz stays not ready).").Default("10s")).DurationVar(&f.nvmlInitTimeout)
	named(app.Flag("nvml.restart-after", "How long NVML may stay unusable (nvmlInit not returning or failing, the driver reloaded or unloaded and not back) before /healthz fails, so that the kubelet restarts the pod; 0 never fails it.").Default("10m")).DurationVar(&f.nvmlRestartAfter)
	app.Flag("nvml.library", "Path of libnvidia-ml.so.1; empty searches LD_LIBRARY_PATH (on GKE: /usr/local/nvidia/lib64/libnvidia-ml.so.1).").Default("").StringVar(&f.nvmlLibrary)
	app.Flag("path.sysfs", "Where the host's sysfs is mounted, for each GPU's NUMA node (bus/pci/devices/<bus id>/numa_node); the deploy files mount it read-only at /host/sys.").Default(nvmlsampler.DefaultSysfs).StringVar(&f.sysfs)
}

func addLogFlags(app *kingpin.Application, f *flagValues) {
	named(app.Flag("log.level", "Log level: debug, info, warn, error.").Default("info")).SetValue(&levelValue{&f.logLevel})
	named(app.Flag("log.format", "Log format: json or console.").Default("json")).EnumVar(&f.logFormat, "json", "console")
	app.Flag("node-name", "Kubernetes node name, for logs and the landing page.").Envar("NODE_NAME").Default("").StringVar(&f.nodeName)
}

// addWebFlags: the server's limits and extras; the listen addresses, the
// systemd socket and the web config come from exporter-toolkit.
func addWebFlags(app *kingpin.Application, f *flagValues) {
	named(app.Flag("web.max-requests", "Maximum number of scrapes being prepared at once; more are answered 503 at once. A scrape gives its slot back when it starts writing (0 = no limit).").Default("40")).IntVar(&f.maxRequests)
	named(app.Flag("web.max-connections", "Maximum number of open connections per listener; at the cap a new connection closes one making no progress (its writes stalled, credentials or not, or its last login refused), else one without a request in flight (the oldest from the address holding the most, its own address too); one whose credentials were accepted goes only for another with credentials, and one user keeps at most 16 not serving; the new connection is closed itself when all are serving. The web listeners also hold at most 24 MiB for all their clients, shed the same way (0 = no limit).").Default(strconv.Itoa(server.DefaultMaxConnections))).IntVar(&f.maxConnections)
	app.Flag("web.probe-address", "Also serve /healthz and /readyz, and nothing else, on this address without TLS or auth, for the kubelet's probes (e.g. :9948; empty: off). /metrics, / and pprof stay behind --web.config.file.").Default("").StringVar(&f.listen.Probe)
	app.Flag("web.enable-pprof", "Serve Go's profiler at /debug/pprof/ (off by default: it exposes internals).").BoolVar(&f.pprof)
	named(app.Flag("web.shutdown-timeout", "How long to wait for scrapes in flight at SIGTERM (0 to 5m).").Default("5s")).DurationVar(&f.shutdownTimeout)
}

// addIdleFlags: idle allocations, their price, and fragmentation.
func addIdleFlags(app *kingpin.Application, f *flagValues) {
	app.Flag("idle.threshold", "Activity (DCGM SM active, else NVML busy ratio) below which an allocated device counts as idle, 0-1.").Default("0.05").Float64Var(&f.idle.Threshold)
	named(app.Flag("idle.window", "How long activity must stay below --idle.threshold before an allocation is idle (10s to 7d). 30m ignores data loading and evaluation gaps; cost alerts want sustained idleness.").Default("30m")).DurationVar(&f.idle.Window)
	app.Flag("idle.price-file", "YAML price list (per GPU-hour by NVML model name; see deploy/prices-example.yaml). Nothing is priced without one.").Default("").StringVar(&f.priceFile)
	named(app.Flag("idle.price", "Prices per GPU-hour by model, e.g. \"NVIDIA H100 80GB HBM3=11.06\"; added to --idle.price-file.").Default("")).SetValue(&pricesValue{&f.prices})
	named(app.Flag("fragmentation.shapes", "Task shapes and popularity weights for the fragmentation gauges: whole-GPU counts and mig-<profile>.").Default(fragmentation.DefaultShapesFlag)).SetValue(&shapesValue{&f.shapes})
}

func addDCGMFlags(app *kingpin.Application, f *flagValues) {
	named(app.Flag("dcgm.mode", "DCGM: auto (embedded when libdcgm.so.4 loads, else NVML alone), embedded, standalone (needs --dcgm.host-engine) or off.").Default("auto")).SetValue(&dcgmModeValue{&f.dcgmMode})
	app.Flag("dcgm.host-engine", "HOST:PORT of a DCGM host engine for standalone mode (the GPU Operator's nvidia-dcgm service listens on 5555). Setting it implies --dcgm.mode=standalone.").Default("").StringVar(&f.dcgmHostEngine)
}

// addKubeletFlags: mapping GPUs to pods through the PodResources API.
func addKubeletFlags(app *kingpin.Application, f *flagValues) {
	app.Flag("kubelet.enabled", "Map GPUs to pods through the kubelet's PodResources API (--no-kubelet.enabled outside Kubernetes).").Default("true").BoolVar(&f.kubeletEnabled)
	app.Flag("kubelet.pod-resources-socket", "The kubelet's PodResources socket. On the simulated node (gpu-pool-exporter-sim), setting it maps the simulated GPUs through that kubelet instead of the built-in fake one.").
		Default(podmap.DefaultSocket).IsSetByUser(&f.kubeletSocketSet).StringVar(&f.kubelet.Socket)
	named(app.Flag("kubelet.refresh-interval", "How often the pod-to-GPU map is refreshed (in the background; 1s to 2m).").Default("10s")).DurationVar(&f.kubelet.RefreshInterval)
	named(app.Flag("kubelet.timeout", "Deadline of every kubelet call (default 5s, or the refresh interval if shorter).").Default("5s").IsSetByUser(&f.kubeletTimeoutSet)).DurationVar(&f.kubelet.CallTimeout)
	named(app.Flag("kubelet.max-response-bytes", "Largest kubelet answer accepted (List, GetAllocatableResources; e.g. 6MiB); a larger one turns pod mapping down before it is read. Memory use grows by about 10 bytes per byte of answer: raise the memory limit with it.").Default("6MiB")).SetValue(&bytesValue{&f.kubeletMaxBytes})
	app.Flag("kubelet.resource-names", "Extra device plugin resource names that hold NVIDIA GPUs (repeatable; a trailing * matches by prefix).").StringsVar(&f.kubelet.ExtraResourceNames)
}

// addCollectorFlags: which metric groups are served, and the dcgm-exporter
// compatible families.
func addCollectorFlags(app *kingpin.Application, f *flagValues) {
	named(app.Flag("collector.profile", "Starting set of metric groups: default (at most 60 series per GPU), lean (at most 30: what the shipped alerts and dashboards need, PCIe, NVLink, power, clock, tensor and DRAM folded per node by node_summary) or full (every group, per GPU: all but node_summary). --[no-]collector.<group> flags change it; docs/profiles.md lists the groups.").
		Default(render.ProfileDefault)).EnumVar(&f.profile, render.ProfileNames...)
	f.groupFlags = map[render.Group]*groupFlag{}
	for _, g := range render.Groups {
		if g.Name == render.GroupCore {
			continue
		}
		gf := &groupFlag{}
		f.groupFlags[g.Name] = gf
		app.Flag("collector."+string(g.Name), "Serve "+g.Help+" (--no-collector."+string(g.Name)+" to leave out; default: per --collector.profile).").
			IsSetByUser(&gf.set).BoolVar(&gf.on)
	}
	app.Flag("collector.dcgm", "Read DCGM at all (--no-collector.dcgm is --dcgm.mode=off).").Default("true").IsSetByUser(&f.dcgmOnSet).BoolVar(&f.dcgmOn)
	app.Flag("collector.kubelet", "Map GPUs to pods through the kubelet (--no-collector.kubelet is --no-kubelet.enabled).").Default("true").IsSetByUser(&f.kubeletOnSet).BoolVar(&f.kubeletOn)
	app.Flag("compat.dcgm-exporter", "Also serve dcgm-exporter's families (DCGM_FI_*) under its names, units and labels, from the same sample, as the release line of --compat.dcgm-exporter.release serves them (docs/migration-dcgm-exporter.md).").
		BoolVar(&f.compatDCGM)
	app.Flag("compat.dcgm-exporter.release", "The dcgm-exporter release line whose contract the DCGM_FI_* families follow: its default counters file (families, types, help texts) and host name label. "+compatReleaseHelp()).
		Default(render.DefaultCompatRelease).StringVar(&f.compatRelease)
	app.Flag("compat.dcgm-exporter.hostname-label", "Name of the host name label of the dcgm-exporter families: Hostname (dcgm-exporter up to 4.8.2) or hostname (4.8.3 and later). Default: the release line's.").
		Default("").StringVar(&f.compatHostnameLabel)
	app.Flag("compat.dcgm-exporter.nvidia-resource-names", "As dcgm-exporter's --nvidia-resource-names (env NVIDIA_RESOURCE_NAMES): device plugin resources, besides nvidia.com/gpu and nvidia.com/mig-* which always count, whose holders label the DCGM_FI_* series (comma-separated, repeatable); e.g. nvidia.com/gpu.shared for GPUs time-sliced with renameByDefault. A device held through another resource has its series without pod labels, as dcgm-exporter serves it. Default: none.").
		Envar("NVIDIA_RESOURCE_NAMES").StringsVar(&f.compatResourceNames)
	app.Flag("compat.dcgm-exporter.xid-count-window-size", "As dcgm-exporter's --xid-count-window-size (env DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE): the window of DCGM_EXP_XID_ERRORS_COUNT, in milliseconds.").
		Envar("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE").Default(strconv.FormatInt(render.DefaultXIDCountWindow.Milliseconds(), 10)).Int64Var(&f.compatXIDWindowMS)
	app.Flag("compat.dcgm-exporter.kubernetes-virtual-gpus", "As dcgm-exporter 4.5+'s --kubernetes-virtual-gpus (env KUBERNETES_VIRTUAL_GPUS as there): a held device gets one series per holder and replica (vgpu label), and DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_GPU_UTIL one for the device without holder labels plus one per holder with its pod's own figures from per-process accounting (pod_uid label; without accounting, the device's alone). Default: one series per device, labelled with one of its holders, as dcgm-exporter does by default.").
		Envar("KUBERNETES_VIRTUAL_GPUS").BoolVar(&f.compatVirtualGPUs)
	app.Flag("compat.dcgm-exporter.collectors", "dcgm-exporter's counters file (its -f/--collectors; env DCGM_EXPORTER_COLLECTORS as there): the DCGM fields served as DCGM_FI_* families, with the file's types and help texts (`DCGM field name, prometheus type, help text` per line), each in the unit its name states. A field this exporter does not know is left out with a warning and counted (gpu_exporter_compat_fields{state=\"unknown\"}); a malformed line or a bad type stops the start. Implies --compat.dcgm-exporter. Default: the release line's default-counters.csv.").
		Envar("DCGM_EXPORTER_COLLECTORS").Default("").StringVar(&f.compatCollectors)
	app.Flag("compat.dcgm-exporter.kubernetes-enable-pod-labels", "As dcgm-exporter's --kubernetes-enable-pod-labels (env DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS): the holder's pod labels on its DCGM_FI_* series, each key with characters outside [a-zA-Z0-9_] made '_', from a watch of this node's pods on the API server (needs --node-name and RBAC to get, list and watch pods).").
		Envar("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS").BoolVar(&f.compatPodLabels)
	app.Flag("compat.dcgm-exporter.kubernetes-enable-pod-uid", "As dcgm-exporter's --kubernetes-enable-pod-uid (env DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID): the holder's pod UID (pod_uid) on its DCGM_FI_* series, from the same watch.").
		Envar("DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID").BoolVar(&f.compatPodUID)
	app.Flag("compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex", "As dcgm-exporter's --kubernetes-pod-label-allowlist-regex (env DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX): only pod labels whose key one of these regular expressions matches (comma-separated, repeatable; unanchored); none: every label.").
		Envar("DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX").StringsVar(&f.compatLabelAllowlist)
	app.Flag("compat.dcgm-exporter.kubernetes-enable-dra", "As dcgm-exporter's --kubernetes-enable-dra (env KUBERNETES_ENABLE_DRA as there): a device held through a DRA ResourceClaim gets one DCGM_FI_* series per holder, with the claim's dra_claim_name, dra_claim_namespace, dra_driver_name, dra_pool_name and dra_device_name labels (a MIG device also dra_mig_profile and dra_mig_device_uuid), from the kubelet's PodResources answer; no API server needed.").
		Envar("KUBERNETES_ENABLE_DRA").BoolVar(&f.compatDRA)
	app.Flag("kubernetes.kubeconfig", "Kubeconfig of the API server for the pod labels and UIDs, the ResourceSlice watch and the node condition (env KUBECONFIG); empty: the pod's in-cluster service account.").
		Envar("KUBECONFIG").Default("").StringVar(&f.kubeconfig)
	app.Flag("kubernetes.resource-slices", "Watch this node's DRA ResourceSlices (resource.k8s.io/v1) on the API server: the taints a DRA driver's health check puts on a device (NVIDIA's gpu.nvidia.com/xid, gpu-lost) are served as gpu_dra_device_taint, and a NoSchedule or NoExecute one counts the device unhealthy. Needs --node-name and RBAC to get, list and watch resourceslices.").
		BoolVar(&f.resourceSlices)
	app.Flag("node-condition", "Keep a condition (--node-condition.type) on this node's Node object: True while a GPU has a fatal fault the exporter sees (an XID that needs a reset or a reboot, a GPU lost or hung, row remapping failed, a recovery action), with the GPU, its UUID and the fault in reason and message; False otherwise (docs/deployment.md). Needs --node-name and RBAC to patch nodes/status; off by default: without it the exporter never writes to the API server.").
		BoolVar(&f.nodeCondition)
	app.Flag("node-condition.type", "Type of the node condition --node-condition keeps.").
		Default(nodecondition.DefaultType).StringVar(&f.nodeConditionType)
}

// addProcsFlags: per-process accounting on shared GPUs.
func addProcsFlags(app *kingpin.Application, f *flagValues) {
	app.Flag("procs.enabled", "Per-process accounting: each container's own VRAM and SM use on shared (time-sliced, MPS) GPUs, from NVML's process lists and the host's /proc (--no-procs.enabled turns it off).").Default("true").BoolVar(&f.procsEnabled)
	app.Flag("procs.proc-root", "The host's /proc as mounted in the exporter (read-only hostPath, e.g. /host/proc; no host PID namespace needed): NVML reports host PIDs, whose cgroup names their container.").
		Default("/proc").IsSetByUser(&f.procsRootSet).StringVar(&f.procsRoot)
	app.Flag("procs.container-log-dir", "The kubelet's /var/log/containers (read-only hostPath): its <pod>_<namespace>_<container>-<id>.log names turn container IDs into pods. Only names are read.").
		Default("/var/log/containers").IsSetByUser(&f.procsLogDirSet).StringVar(&f.procsLogDir)
	app.Flag("procs.cri-socket", "Name containers through the CRI API on this runtime socket (e.g. /run/containerd/containerd.sock) instead of --procs.container-log-dir.").Default("").StringVar(&f.procsCRISocket)
}

// named makes a flag's value errors name the flag: kingpin alone says only
// "time: invalid duration".
func named(fc *kingpin.FlagClause) *NamedFlag { return &NamedFlag{fc} }

// Named is named for a Simulation's flags.
func Named(fc *kingpin.FlagClause) *NamedFlag { return named(fc) }

// NamedFlag is a flag whose value errors name it.
type NamedFlag struct{ fc *kingpin.FlagClause }

func (n *NamedFlag) wrap() {
	m := n.fc.Model()
	n.fc.SetValue(namedValue{name: m.Name, Value: m.Value})
}

// DurationVar parses the flag into t.
func (n *NamedFlag) DurationVar(t *time.Duration) { n.fc.DurationVar(t); n.wrap() }

// IntVar parses the flag into t, whole decimal numbers only.
func (n *NamedFlag) IntVar(t *int) { n.fc.SetValue(&strictInt{t}); n.wrap() }

// Int64Var parses the flag into t.
func (n *NamedFlag) Int64Var(t *int64) { n.fc.Int64Var(t); n.wrap() }

// EnumVar parses the flag into t, one of options.
func (n *NamedFlag) EnumVar(t *string, options ...string) { n.fc.EnumVar(t, options...); n.wrap() }

// SetValue parses the flag with v.
func (n *NamedFlag) SetValue(v kingpin.Value) { n.fc.SetValue(v); n.wrap() }

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

// The flag values below parse what they are given once, into what the
// exporter uses.

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

// levelValue is --log.level.
type levelValue struct{ v *zerolog.Level }

func (l *levelValue) Set(s string) error {
	switch s {
	case "debug", "info", "warn", "error":
		lvl, err := zerolog.ParseLevel(s)
		*l.v = lvl
		return err
	}
	return errors.New("want debug, info, warn or error")
}

func (l *levelValue) String() string { return l.v.String() }

// bytesValue is a size such as 6MiB.
type bytesValue struct{ v *units.Base2Bytes }

func (b *bytesValue) Set(s string) error {
	n, err := units.ParseBase2Bytes(s)
	if err != nil {
		return errors.New("want a size such as 6MiB or 16MiB")
	}
	*b.v = n
	return nil
}

func (b *bytesValue) String() string { return b.v.String() }

// shapesValue is --fragmentation.shapes.
type shapesValue struct{ v *[]fragmentation.Shape }

func (s *shapesValue) Set(v string) (err error) {
	*s.v, err = fragmentation.ParseShapes(v)
	return err
}

func (s *shapesValue) String() string { return fmt.Sprint(*s.v) }

// pricesValue is --idle.price.
type pricesValue struct{ v *map[string]float64 }

func (p *pricesValue) Set(v string) (err error) {
	*p.v, err = fragmentation.ParsePriceFlag(v)
	return err
}

func (p *pricesValue) String() string { return fmt.Sprint(*p.v) }

// dcgmModeValue is --dcgm.mode.
type dcgmModeValue struct{ v *dcgm.Mode }

func (d *dcgmModeValue) Set(s string) (err error) {
	*d.v, err = dcgm.ParseMode(s)
	return err
}

func (d *dcgmModeValue) String() string { return string(*d.v) }

// compatReleaseHelp lists the release lines for --help, and says which is
// the default and why.
func compatReleaseHelp() string {
	var lines []string
	for _, r := range render.CompatReleases {
		l := r.Name + ": " + r.Versions
		if !r.Confirmed {
			l += ", rebuilt from its release notes (names, help texts partly unconfirmed)"
		}
		lines = append(lines, l)
	}
	return "One of " + strings.Join(lines, "; ") + ". Default " + render.DefaultCompatRelease +
		": the newest line whose contract public sources confirm (deploy/dcgm-exporter/releases.csv cites each row)."
}
