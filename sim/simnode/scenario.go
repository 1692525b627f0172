package simnode

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
)

// Scenario describes a simulated GPU node: its GPUs, MIG layouts and workload
// curves. Later sections (pods, faults) extend the same file.
type Scenario struct {
	Seed int64 `yaml:"seed"`
	// Steady holds every curve at its mean (no amplitude, no noise, no
	// temperature jitter): two scrapers that read the node at different
	// moments see the same values. Faults and phases still happen.
	Steady bool        `yaml:"steady"`
	Node   NodeSpec    `yaml:"node"`
	GPUs   []GPUSpec   `yaml:"gpus"`
	Faults []FaultSpec `yaml:"faults"`
	// Pods hold the node's devices, as the kubelet reports them.
	Pods    []PodSpec   `yaml:"pods"`
	Sharing SharingSpec `yaml:"sharing"`
	// HostProcesses run on GPUs outside any pod.
	HostProcesses []HostProcessSpec `yaml:"hostProcesses"`

	// Source file, for error messages.
	file string
	root *yaml.Node
}

// NodeSpec is the node as a whole.
type NodeSpec struct {
	Name              string `yaml:"name"`
	Model             string `yaml:"model"`
	Count             int    `yaml:"count"`
	DriverVersion     string `yaml:"driverVersion"`
	CUDADriverVersion string `yaml:"cudaDriverVersion"`
	// Flavour is the device plugin whose device IDs the kubelet reports:
	// "nvidia" (GPU-/MIG- UUIDs, nvidia.com/gpu.shared, nvidia.com/mig-*),
	// "gke" (nvidiaN, nvidiaN/vgpuK, nvidiaN/giM, all nvidia.com/gpu) or
	// "dra" (NVIDIA's DRA driver, gpu.nvidia.com: ResourceClaims in
	// DynamicResources, devices gpu-<minor> and
	// gpu-<minor>-mig-<profile>-<profile id>-<placement start>, published
	// in a ResourceSlice of the node's pool; a time-sliced GPU is one claim
	// its pods share).
	Flavour string `yaml:"flavour"`
	// MinorNumbers, when set, gives each GPU's NVML minor number (default:
	// its index). Real nodes need not number /dev/nvidiaN in index order.
	MinorNumbers []int `yaml:"minorNumbers"`
	// DriverBranch (R470, R510, R535, R550, R570, R580; default the newest)
	// limits the NVML functions the node exports to that branch's nvml.h.
	DriverBranch string `yaml:"driverBranch"`
	// CgroupDriver and Runtime shape the generated host /proc/<pid>/cgroup:
	// systemd-v2 (default), cgroupfs-v2, systemd-v1, cgroupfs-v1; containerd
	// (default), cri-o, docker.
	CgroupDriver string `yaml:"cgroupDriver"`
	Runtime      string `yaml:"runtime"`
	// Unsupported lists features the boards answer NOT_SUPPORTED for, as
	// consumer boards and some vGPU guests do: ecc (ECC counters, remapped
	// rows), power (power, energy, power limit), events (NVML event sets).
	Unsupported []string `yaml:"unsupported"`
	// KubeletLatency is how long the built-in fake kubelet takes to answer
	// each PodResources call, as a busy kubelet on a big node does.
	KubeletLatency Duration `yaml:"kubeletLatency"`
}

// PodSpec is a pod on the node. It exists from Start (default: the node's
// start) until Stop (default: forever).
type PodSpec struct {
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
	// Labels are the pod's labels, as the API server serves them (the
	// kubelet's PodResources API has none).
	Labels     map[string]string `yaml:"labels"`
	Start      Duration          `yaml:"start"`
	Stop       Duration          `yaml:"stop"`
	Containers []ContainerSpec   `yaml:"containers"`
}

// ContainerSpec is a container and the devices it holds.
type ContainerSpec struct {
	Name    string       `yaml:"name"`
	Devices []DeviceSpec `yaml:"devices"`
	// Processes are what the container runs on its devices; a container
	// without any holds its devices and runs nothing there.
	Processes []ProcessSpec `yaml:"processes"`
}

// DeviceSpec names a simulated device: a GPU by index, a replica of a
// time-sliced GPU, or a MIG instance by its position in the GPU's mig list.
type DeviceSpec struct {
	GPU     int  `yaml:"gpu"`
	MIG     *int `yaml:"mig"`
	Replica *int `yaml:"replica"`
}

// SharingSpec is the device plugin's sharing configuration: time-slicing
// or MPS (the NVIDIA device plugin applies one of them, never both).
type SharingSpec struct {
	TimeSlicing *TimeSlicingSpec `yaml:"timeSlicing"`
	MPS         *MPSSpec         `yaml:"mps"`
}

// TimeSlicingSpec shares GPUs between Replicas holders each.
type TimeSlicingSpec struct {
	GPUs     []int `yaml:"gpus"`
	Replicas int   `yaml:"replicas"`
}

// MPSSpec shares whole GPUs through CUDA MPS, as the NVIDIA device plugin's
// sharing.mps does: Replicas holders per GPU, each client limited to
// 1/Replicas of the GPU's memory and of its SMs (the control daemon's
// default pinned memory limit and active thread percentage), an
// nvidia-cuda-mps-server process on the GPU while it has clients, run by
// the plugin's MPS control daemon pod. RenameByDefault advertises the
// replicas as nvidia.com/gpu.shared instead of nvidia.com/gpu.
type MPSSpec struct {
	GPUs            []int `yaml:"gpus"`
	Replicas        int   `yaml:"replicas"`
	RenameByDefault bool  `yaml:"renameByDefault"`
}

// MPS control daemon pod of the NVIDIA device plugin (its Helm chart's
// names): the MPS servers it starts run in its container's cgroup.
const (
	mpsDaemonNamespace = "nvidia-device-plugin"
	mpsDaemonPod       = "nvidia-device-plugin-mps-control-daemon-x7k2p"
	mpsDaemonContainer = "mps-control-daemon"
	// mpsServerComm is nvidia-cuda-mps-server as /proc/<pid>/stat shows
	// it: the kernel keeps the first 15 bytes of a command name.
	mpsServerComm = "nvidia-cuda-mps"
)

// FaultSpec injects a fault from At on (until Until, if set) on one GPU, or
// on the node's device plugin.
type FaultSpec struct {
	At    Duration `yaml:"at"`
	Until Duration `yaml:"until"`
	GPU   *int     `yaml:"gpu"`
	// XID raises an XID event with this code, Count times (default 1).
	XID   int `yaml:"xid"`
	Count int `yaml:"count"`
	// MIG attributes the XID to a MIG device of the GPU, by its position in
	// the GPU's mig list: the event carries its GPU and compute instance IDs.
	MIG *int `yaml:"mig"`
	// ECC adds to the GPU's ECC error counters.
	ECC *ECCFault `yaml:"ecc"`
	// Lost: every NVML call on the GPU answers GPU_IS_LOST.
	Lost bool `yaml:"lost"`
	// Hang: every NVML call on the GPU blocks until the fault ends.
	Hang bool `yaml:"hang"`
	// Throttle sets clock event reasons, e.g. hw_thermal_slowdown.
	Throttle []string `yaml:"throttle"`
	// Remap sets the row remapper's state.
	Remap *RemapFault `yaml:"remap"`
	// RecoveryAction sets NVML's recovery action, one of RecoveryActions
	// (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset,
	// recover_imex_domain, bus_reset, system_reboot).
	RecoveryAction string `yaml:"recoveryAction"`
	// Reset resets the GPU at At (nvidia-smi -r): its volatile ECC counts
	// start again from zero; aggregate counts stay.
	Reset bool `yaml:"reset"`
	// DevicePlugin changes what the kubelet says is allocatable.
	DevicePlugin *DevicePluginFault `yaml:"devicePlugin"`
	// DCGMHealth makes DCGM's health watch of one subsystem report warn or
	// fail for the GPU (a whole GPU: DCGM's health is per GPU).
	DCGMHealth *DCGMHealthFault `yaml:"dcgmHealth"`
	// DRATaint puts a device taint on the GPU's device (or, with MIG, the
	// MIG device's) in the node's ResourceSlice, as the NVIDIA DRA
	// driver's health check does (flavour dra).
	DRATaint *DRATaintFault `yaml:"draTaint"`
}

// DRATaintFault is a device taint (resource.k8s.io/v1 DeviceTaint).
type DRATaintFault struct {
	Key    string `yaml:"key"`
	Value  string `yaml:"value"`
	Effect string `yaml:"effect"`
}

// DCGMHealthFault is one DCGM health watch result.
type DCGMHealthFault struct {
	// System is one of dcgm.HealthSystems: pcie, mem, inforom, thermal,
	// power, nvlink, driver.
	System string `yaml:"system"`
	// Result is warn or fail.
	Result string `yaml:"result"`
}

// ECCFault adds ECC errors.
type ECCFault struct {
	Corrected   uint64 `yaml:"corrected"`
	Uncorrected uint64 `yaml:"uncorrected"`
}

// RemapFault sets remapped rows and the row remapper's histogram of spare
// rows per memory bank.
type RemapFault struct {
	Correctable   int  `yaml:"correctable"`
	Uncorrectable int  `yaml:"uncorrectable"`
	Pending       bool `yaml:"pending"`
	Failed        bool `yaml:"failed"`
	// Banks moves banks out of "max" availability: how many have high,
	// partial, low and no spare rows left.
	Banks *RemapBanks `yaml:"banks"`
	// WalkEvery walks the GPU's banks toward exhaustion: from At on, one
	// bank loses one level of spare rows (max, high, partial, low, none)
	// every WalkEvery, one bank to none before the next; each step is one
	// more row remapped for an uncorrectable error. Past Until the banks
	// stay as they were (spare rows do not come back).
	WalkEvery Duration `yaml:"walkEvery"`
}

// RemapBanks counts banks by the spare rows they have left.
type RemapBanks struct {
	High    int `yaml:"high"`
	Partial int `yaml:"partial"`
	Low     int `yaml:"low"`
	None    int `yaml:"none"`
}

// SimulatedRemapBanks is how many memory banks a simulated GPU's row
// remapper reports (an A100 reports 640).
const SimulatedRemapBanks = 640

// DevicePluginFault makes the kubelet's allocatable devices drop to
// Allocatable (0: the device plugin lost its capacity) while pods keep running.
type DevicePluginFault struct {
	Allocatable int `yaml:"allocatable"`
}

// ThrottleReasons maps scenario names to NVML's clock event reason bits,
// taken from go-nvml's constants (nvml.h) so that the simulator can never
// agree with a wrong table of the exporter's. R535 renamed the
// ClocksThrottleReason* macros ClocksEventReason*; go-nvml keeps the three
// hardware ones under the old name only.
var ThrottleReasons = map[string]uint64{
	"gpu_idle":                    nvml.ClocksEventReasonGpuIdle,
	"applications_clocks_setting": nvml.ClocksEventReasonApplicationsClocksSetting,
	"sw_power_cap":                nvml.ClocksEventReasonSwPowerCap,
	"hw_slowdown":                 nvml.ClocksThrottleReasonHwSlowdown,
	"sync_boost":                  nvml.ClocksEventReasonSyncBoost,
	"sw_thermal_slowdown":         nvml.ClocksEventReasonSwThermalSlowdown,
	"hw_thermal_slowdown":         nvml.ClocksThrottleReasonHwThermalSlowdown,
	"hw_power_brake_slowdown":     nvml.ClocksThrottleReasonHwPowerBrakeSlowdown,
	"display_clock_setting":       nvml.ClocksEventReasonDisplayClockSetting,
	"board_limit":                 nvml.ClocksEventReasonBoardLimit,
	"reliability":                 nvml.ClocksEventReasonReliability,
}

// RecoveryActions maps scenario names to NVML's recovery action values
// (nvmlDeviceGpuRecoveryAction_t), taken from go-nvml's constants.
var RecoveryActions = map[string]int{
	"none":                int(nvml.GPU_RECOVERY_ACTION_NONE),
	"gpu_reset":           int(nvml.GPU_RECOVERY_ACTION_GPU_RESET),
	"node_reboot":         int(nvml.GPU_RECOVERY_ACTION_NODE_REBOOT),
	"drain_p2p":           int(nvml.GPU_RECOVERY_ACTION_DRAIN_P2P),
	"drain_and_reset":     int(nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET),
	"recover_imex_domain": int(nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN),
	"bus_reset":           int(nvml.GPU_RECOVERY_ACTION_BUS_RESET),
	"system_reboot":       int(nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT),
}

// GPUSpec overrides one GPU, by index.
type GPUSpec struct {
	Index    int       `yaml:"index"`
	Workload *Workload `yaml:"workload"`
	// MIG, when set, enables MIG mode with these instances, created in order
	// at the first free placement.
	MIG []MIGSpec `yaml:"mig"`
}

// MIGSpec is one MIG instance.
type MIGSpec struct {
	Profile  string    `yaml:"profile"`
	Workload *Workload `yaml:"workload"`
	// ComputeInstances splits the GPU instance into this many compute
	// instances (default 1), each its own MIG device with its own UUID,
	// as nvidia-smi mig -cci does.
	ComputeInstances int `yaml:"computeInstances"`
	// ComputeInstanceWorkloads, when set, gives the compute instances
	// workloads of their own, in order (compute instance 0 first); one not
	// listed runs Workload.
	ComputeInstanceWorkloads []*Workload `yaml:"computeInstanceWorkloads"`
	// Placement, when set, is the start (in memory slices) of the
	// placement the GPU instance takes; it must be one the profile allows.
	Placement *int `yaml:"placement"`
}

// Workload is what runs on a device over time.
type Workload struct {
	// Preset fills utilization and memory: busy, training, inference, idle,
	// idle-held (VRAM held, nothing running), free (almost all VRAM free).
	Preset      string `yaml:"preset"`
	Utilization *Curve `yaml:"utilization"`
	// Memory is the fraction of the device's memory in use.
	Memory *Curve `yaml:"memory"`
	// SMActive is DCGM's SM activity (default 0.85 x utilization), in
	// every phase: a job of tiny kernels keeps NVML's utilization up (a
	// kernel ran in most sample periods) while its SMs sit idle.
	SMActive *Curve `yaml:"smActive"`
	// Phases replace the curves from a point in time on.
	Phases []Phase `yaml:"phases"`
}

// Phase is a workload that starts after a delay from the node's start.
type Phase struct {
	After       Duration `yaml:"after"`
	Preset      string   `yaml:"preset"`
	Utilization *Curve   `yaml:"utilization"`
	Memory      *Curve   `yaml:"memory"`
}

// Curve is mean + amplitude*sin(2πt/period) + noise, clamped to [0,1].
type Curve struct {
	Mean      float64  `yaml:"mean"`
	Amplitude float64  `yaml:"amplitude"`
	Period    Duration `yaml:"period"`
	Noise     float64  `yaml:"noise"`
}

// Duration is a time.Duration written as "30s" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (write it like 30s or 5m)", n.Line, n.Value)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %q is negative", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

var presets = map[string]Workload{
	"busy":      {Utilization: &Curve{Mean: 0.93, Amplitude: 0.04, Period: Duration(97 * time.Second), Noise: 0.02}, Memory: &Curve{Mean: 0.88, Noise: 0.005}},
	"training":  {Utilization: &Curve{Mean: 0.78, Amplitude: 0.15, Period: Duration(3 * time.Minute), Noise: 0.05}, Memory: &Curve{Mean: 0.72, Amplitude: 0.03, Period: Duration(10 * time.Minute), Noise: 0.005}},
	"inference": {Utilization: &Curve{Mean: 0.35, Amplitude: 0.25, Period: Duration(5 * time.Minute), Noise: 0.08}, Memory: &Curve{Mean: 0.45, Noise: 0.002}},
	"idle":      {Utilization: &Curve{}, Memory: &Curve{}},
	"idle-held": {Utilization: &Curve{Mean: 0, Noise: 0.003}, Memory: &Curve{Mean: 0.62}},
	"free":      {Utilization: &Curve{Mean: 0.04, Noise: 0.01}, Memory: &Curve{Mean: 0.015}},
}

// Presets lists the workload preset names.
func Presets() []string {
	return []string{"busy", "training", "inference", "idle", "idle-held", "free"}
}

// MaxScenarioBytes is the largest scenario LoadScenario reads (about
// 40,000 pods); a larger file would take seconds and gigabytes to parse.
const MaxScenarioBytes = 4 << 20

// LoadScenario reads and validates a scenario file. Files over
// MaxScenarioBytes are refused before parsing.
func LoadScenario(path string) (*Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	defer f.Close()
	tooBig := func(size string) error {
		return fmt.Errorf("scenario %s is %s: the limit is %d bytes (%d MiB); split it or describe fewer pods", path, size, MaxScenarioBytes, MaxScenarioBytes>>20)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() > MaxScenarioBytes {
		return nil, tooBig(fmt.Sprintf("%d bytes", fi.Size()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxScenarioBytes+1))
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	if len(data) > MaxScenarioBytes {
		return nil, tooBig("larger than that")
	}
	return ParseScenario(path, data)
}

// ParseScenario parses and validates a scenario. name is used in errors.
func ParseScenario(name string, data []byte) (*Scenario, error) {
	s := &Scenario{file: name}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("scenario %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	s.root = &root
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(s); err != nil && !errors.Is(err, io.EOF) { // an empty file is the default node
		return nil, decodeError(name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("scenario %s:%d: a second YAML document (after ---): a scenario is one document; merge them or remove the ---", name, extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("scenario %s: after the first document: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if s.has([]any{"node", "count"}) && s.Node.Count == 0 {
		return nil, s.errorAt([]any{"node", "count"}, "0 GPUs: a node has 1 to 64 (leave count out for the default of 8)")
	}
	s.applyDefaults()
	if err := s.validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// DefaultScenario is the built-in node: 8 x H100 80GB with busy, idle and
// nearly free GPUs, and one GPU in MIG mode.
func DefaultScenario() *Scenario {
	s, err := ParseScenario("built-in", []byte(defaultScenarioYAML))
	if err != nil {
		panic(err)
	}
	return s
}

const defaultScenarioYAML = `
seed: 1
node:
  name: sim-gpu-node-0
  model: H100-SXM5-80GB
  count: 8
gpus:
  - index: 0
    workload: {preset: busy}
  - index: 1
    workload: {preset: busy}
  - index: 2
    workload: {preset: training}
  - index: 3
    workload: {preset: training}
  - index: 4
    workload: {preset: idle-held}
  - index: 5
    workload: {preset: free}
  - index: 6
    workload: {preset: inference}
  - index: 7
    mig:
      - {profile: 3g.40gb, workload: {preset: training}}
      - {profile: 2g.20gb, workload: {preset: inference}}
      - {profile: 1g.10gb, workload: {preset: idle-held}}
      - {profile: 1g.10gb}
sharing:
  timeSlicing: {gpus: [6], replicas: 4}
hostProcesses:
  - {gpu: 6, comm: ollama, docker: true, memory: {mean: 0.04}, utilization: {mean: 0.02, noise: 0.01}}
pods:
  - namespace: ml-training
    name: llm-pretrain-0
    labels: {app.kubernetes.io/name: llm-pretrain, team: foundation-models}
    containers:
      - name: trainer
        devices: [{gpu: 0}, {gpu: 1}]
  - namespace: ml-training
    name: llm-pretrain-1
    containers:
      - name: trainer
        devices: [{gpu: 2}, {gpu: 3}]
  - namespace: research
    name: notebook-alice
    containers:
      - name: jupyter
        devices: [{gpu: 4}]
  - namespace: inference
    name: chat-api-0
    labels: {app.kubernetes.io/name: chat-api, team: serving}
    containers:
      - name: server
        devices: [{gpu: 6, replica: 0}]
        processes:
          - {comm: vllm, memory: {mean: 0.30, noise: 0.002}, utilization: {mean: 0.35, amplitude: 0.15, period: 5m, noise: 0.05}}
  - namespace: inference
    name: chat-api-1
    containers:
      - name: server
        devices: [{gpu: 6, replica: 1}]
        processes:
          - {comm: tritonserver, memory: {mean: 0.12, noise: 0.002}, utilization: {mean: 0.2, amplitude: 0.1, period: 3m, noise: 0.03}}
          - {comm: python3, memory: {mean: 0.05}, utilization: {mean: 0.05, noise: 0.02}}
  - namespace: inference
    name: chat-api-2
    containers:
      - name: server
        devices: [{gpu: 6, replica: 2}]  # holds a replica, runs nothing: idle on its own
  - namespace: ml-training
    name: finetune-small
    containers:
      - name: trainer
        devices: [{gpu: 7, mig: 0}]
  - namespace: inference
    name: embeddings-0
    containers:
      - name: server
        devices: [{gpu: 7, mig: 1}]
  - namespace: research
    name: dev-shell-bob
    containers:
      - name: shell
        devices: [{gpu: 7, mig: 2}]
`

var yamlLineRE = regexp.MustCompile(`line (\d+): `)
var yamlTypeRE = regexp.MustCompile(` in type simnode\.(\w+)`)

// decodeError rewrites yaml.v3's errors as "file:line: what".
func decodeError(name string, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("scenario %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var msgs []string
	for _, e := range te.Errors {
		e = yamlTypeRE.ReplaceAllString(e, " (not a field of $1; check its spelling and indentation)")
		e = yamlLineRE.ReplaceAllString(e, name+":$1: ")
		msgs = append(msgs, "scenario "+e)
	}
	return errors.New(strings.Join(msgs, "; "))
}

func (s *Scenario) applyDefaults() {
	if s.Node.Name == "" {
		s.Node.Name = "sim-gpu-node-0"
	}
	if s.Node.Model == "" {
		s.Node.Model = "H100-SXM5-80GB"
	}
	if s.Node.Count == 0 {
		s.Node.Count = 8
	}
	if s.Node.DriverVersion == "" {
		s.Node.DriverVersion = "550.54.15"
	}
	if s.Node.Flavour == "" {
		s.Node.Flavour = "nvidia"
	}
	if s.Node.CgroupDriver == "" {
		s.Node.CgroupDriver = "systemd-v2"
	}
	if s.Node.Runtime == "" {
		s.Node.Runtime = "containerd"
	}
	if s.Node.CUDADriverVersion == "" {
		s.Node.CUDADriverVersion = "12.4"
	}
}

// errorAt formats a validation error with the file, line and field.
func (s *Scenario) errorAt(path []any, format string, args ...any) error {
	line := s.lineOf(path)
	field := formatPath(path)
	loc := s.file
	if line > 0 {
		loc += ":" + strconv.Itoa(line)
	}
	return fmt.Errorf("scenario %s: field %s: %s", loc, field, fmt.Sprintf(format, args...))
}

func formatPath(path []any) string {
	var b strings.Builder
	for _, p := range path {
		switch v := p.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		case int:
			fmt.Fprintf(&b, "[%d]", v)
		}
	}
	return b.String()
}

// has reports whether the file spells out the field at path (a zero value
// written down is a mistake where zero means "use the default").
func (s *Scenario) has(path []any) bool {
	n := s.root
	if n == nil {
		return false
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, p := range path {
		var next *yaml.Node
		switch v := p.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == v {
						next = n.Content[i+1]
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && v < len(n.Content) {
				next = n.Content[v]
			}
		}
		if next == nil {
			return false
		}
		n = next
	}
	return true
}

// lineOf finds the line of a path like {"gpus", 2, "mig", 0, "profile"}; it
// returns the line of the deepest node that exists.
func (s *Scenario) lineOf(path []any) int {
	n := s.root
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, p := range path {
		var next *yaml.Node
		switch v := p.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == v {
						next = n.Content[i+1]
						line = n.Content[i].Line
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && v < len(n.Content) {
				next = n.Content[v]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
		if n.Kind == yaml.ScalarNode {
			line = n.Line
		}
	}
	return line
}

func (s *Scenario) validate() error {
	if _, ok := models[s.Node.Model]; !ok {
		return s.errorAt([]any{"node", "model"}, "unknown GPU model %q; known models: %s", s.Node.Model, strings.Join(ModelNames(), ", "))
	}
	if s.Node.Count < 1 || s.Node.Count > 64 {
		return s.errorAt([]any{"node", "count"}, "%d GPUs: a node has 1 to 64", s.Node.Count)
	}
	switch s.Node.Flavour {
	case "nvidia", "gke", "dra":
	default:
		return s.errorAt([]any{"node", "flavour"}, "unknown flavour %q: nvidia, gke or dra", s.Node.Flavour)
	}
	for i, f := range s.Node.Unsupported {
		switch f {
		case "ecc", "power", "events":
		default:
			return s.errorAt([]any{"node", "unsupported", i}, "unknown feature %q; features: ecc, power, events", f)
		}
	}
	if _, ok := driverBranches[s.Node.DriverBranch]; s.Node.DriverBranch != "" && !ok {
		return s.errorAt([]any{"node", "driverBranch"}, "unknown driver branch %q; known: %s", s.Node.DriverBranch, branchNames())
	}
	if len(s.Node.MinorNumbers) > 0 {
		if len(s.Node.MinorNumbers) != s.Node.Count {
			return s.errorAt([]any{"node", "minorNumbers"}, "%d minor numbers for %d GPUs", len(s.Node.MinorNumbers), s.Node.Count)
		}
		seenMinor := map[int]bool{}
		for i, m := range s.Node.MinorNumbers {
			if m < 0 || m > 255 || seenMinor[m] {
				return s.errorAt([]any{"node", "minorNumbers", i}, "minor number %d is out of 0..255 or used twice", m)
			}
			seenMinor[m] = true
		}
	}
	if _, err := parseCUDAVersion(s.Node.CUDADriverVersion); err != nil {
		return s.errorAt([]any{"node", "cudaDriverVersion"}, "%v", err)
	}
	seen := map[int]bool{}
	for i, g := range s.GPUs {
		p := []any{"gpus", i}
		if g.Index < 0 || g.Index >= s.Node.Count {
			return s.errorAt(append(p, "index"), "GPU index %d is outside 0..%d (node.count is %d)", g.Index, s.Node.Count-1, s.Node.Count)
		}
		if seen[g.Index] {
			return s.errorAt(append(p, "index"), "GPU %d is described twice", g.Index)
		}
		seen[g.Index] = true
		if err := s.validateWorkload(g.Workload, append(p, "workload")); err != nil {
			return err
		}
		if g.MIG != nil {
			if g.Workload != nil {
				return s.errorAt(append(p, "workload"), "a GPU in MIG mode has per-instance workloads only; move it under mig[]")
			}
			if _, err := planMIG(models[s.Node.Model], g.MIG); err != nil {
				var me *migError
				if errors.As(err, &me) {
					return s.errorAt(append(p, "mig", me.index, "profile"), "%s", me.msg)
				}
				return s.errorAt(append(p, "mig"), "%v", err)
			}
			for j, m := range g.MIG {
				if err := s.validateWorkload(m.Workload, append(p, "mig", j, "workload")); err != nil {
					return err
				}
				if m.ComputeInstances < 0 || m.ComputeInstances > 8 {
					return s.errorAt(append(p, "mig", j, "computeInstances"), "%d compute instances: a GPU instance holds 1 to 8", m.ComputeInstances)
				}
				if n := len(m.ComputeInstanceWorkloads); n > max(1, m.ComputeInstances) {
					return s.errorAt(append(p, "mig", j, "computeInstanceWorkloads"), "%d workloads for %d compute instances: give one per compute instance at most (set computeInstances)", n, max(1, m.ComputeInstances))
				}
				for k, w := range m.ComputeInstanceWorkloads {
					if err := s.validateWorkload(w, append(p, "mig", j, "computeInstanceWorkloads", k)); err != nil {
						return err
					}
				}
			}
		}
	}
	for i, f := range s.Faults {
		if err := s.validateFault(f, []any{"faults", i}); err != nil {
			return err
		}
	}
	if _, ok := cgroupDrivers[s.Node.CgroupDriver]; !ok {
		return s.errorAt([]any{"node", "cgroupDriver"}, "unknown cgroup driver %q; known: %s", s.Node.CgroupDriver, strings.Join(sortedKeys(cgroupDrivers), ", "))
	}
	if _, ok := runtimes[s.Node.Runtime]; !ok {
		return s.errorAt([]any{"node", "runtime"}, "unknown container runtime %q; known: %s", s.Node.Runtime, strings.Join(sortedKeys(runtimes), ", "))
	}
	if err := s.validateSharing(); err != nil {
		return err
	}
	if err := s.validatePods(); err != nil {
		return err
	}
	return s.validateProcesses()
}

func (s *Scenario) migCount(gpu int) int {
	for _, g := range s.GPUs {
		if g.Index == gpu {
			n := 0 // MIG devices: one per compute instance
			for _, m := range g.MIG {
				n += max(1, m.ComputeInstances)
			}
			return n
		}
	}
	return 0
}

// sharedGPU: the GPU is handed out as replicas (time-slicing or MPS).
func (s *Scenario) sharedGPU(gpu int) bool { return s.replicas(gpu) > 0 }

// mpsGPU: the GPU is shared through MPS.
func (s *Scenario) mpsGPU(gpu int) bool {
	return s.Sharing.MPS != nil && slices.Contains(s.Sharing.MPS.GPUs, gpu)
}

// replicas is how many holders share the GPU, 0 where it is not shared.
func (s *Scenario) replicas(gpu int) int {
	if ts := s.Sharing.TimeSlicing; ts != nil && slices.Contains(ts.GPUs, gpu) {
		return ts.Replicas
	}
	if s.mpsGPU(gpu) {
		return s.Sharing.MPS.Replicas
	}
	return 0
}

// validateReplicas checks one sharing method's replica count and GPU
// indexes; why says what bounds the replicas.
func (s *Scenario) validateReplicas(method string, replicas int, gpus []int, why string) error {
	p := []any{"sharing", method}
	if replicas < 2 || replicas > 48 {
		return s.errorAt(append(p, "replicas"), "%d replicas: %s", replicas, why)
	}
	for i, g := range gpus {
		if g < 0 || g >= s.Node.Count {
			return s.errorAt(append(p, "gpus", i), "GPU index %d is outside 0..%d", g, s.Node.Count-1)
		}
	}
	return nil
}

func (s *Scenario) validateSharing() error {
	ts, mps := s.Sharing.TimeSlicing, s.Sharing.MPS
	if ts != nil && mps != nil {
		return s.errorAt([]any{"sharing", "mps"}, "sharing names both timeSlicing and mps: the device plugin applies one sharing method to a node; keep one")
	}
	if ts != nil {
		if err := s.validateReplicas("timeSlicing", ts.Replicas, ts.GPUs, "time-slicing shares a GPU between 2 and 48 holders"); err != nil {
			return err
		}
	}
	if mps != nil {
		if err := s.validateReplicas("mps", mps.Replicas, mps.GPUs, "MPS shares a GPU between 2 and 48 clients (an MPS server takes at most 48 client contexts per GPU)"); err != nil {
			return err
		}
		p := []any{"sharing", "mps"}
		for i, g := range mps.GPUs {
			if s.migCount(g) > 0 {
				return s.errorAt(append(p, "gpus", i), "GPU %d is in MIG mode: the device plugin shares only whole GPUs through MPS; drop its mig list or share another GPU", g)
			}
		}
	}
	return nil
}

// heldUnit is one allocation unit: a GPU, a MIG instance or a replica.
type heldUnit struct{ gpu, mig, replica int }

// heldBy is a container holding a unit from start until stop (0: forever).
type heldBy struct {
	pod         string
	start, stop Duration
	path        []any
}

func overlaps(a, b heldBy) bool {
	aEndsFirst := a.stop != 0 && a.stop <= b.start
	bEndsFirst := b.stop != 0 && b.stop <= a.start
	return !aEndsFirst && !bEndsFirst
}

func (s *Scenario) validatePods() error {
	names := map[string]bool{}
	holders := map[heldUnit][]heldBy{}
	for i, pod := range s.Pods {
		p := []any{"pods", i}
		if pod.Name == "" || pod.Namespace == "" {
			return s.errorAt(p, "a pod needs a namespace and a name")
		}
		key := pod.Namespace + "/" + pod.Name
		if names[key] {
			return s.errorAt(append(p, "name"), "pod %s is listed twice", key)
		}
		names[key] = true
		if pod.Stop != 0 && pod.Stop <= pod.Start {
			return s.errorAt(append(p, "stop"), "stop (%s) must come after start (%s)", time.Duration(pod.Stop), time.Duration(pod.Start))
		}
		if len(pod.Containers) == 0 {
			return s.errorAt(append(p, "containers"), "a pod needs at least one container")
		}
		for j, c := range pod.Containers {
			cp := append(p, "containers", j)
			if c.Name == "" {
				return s.errorAt(append(cp, "name"), "a container needs a name")
			}
			for k, d := range c.Devices {
				dp := append(cp, "devices", k)
				if d.GPU < 0 || d.GPU >= s.Node.Count {
					return s.errorAt(append(dp, "gpu"), "GPU index %d is outside 0..%d", d.GPU, s.Node.Count-1)
				}
				if n := s.migCount(d.GPU); n > 0 && d.MIG == nil {
					return s.errorAt(append(dp, "mig"), "GPU %d is in MIG mode: name the instance (mig: 0..%d)", d.GPU, n-1)
				}
				if d.MIG != nil && (*d.MIG < 0 || *d.MIG >= s.migCount(d.GPU)) {
					return s.errorAt(append(dp, "mig"), "GPU %d has no MIG instance %d (it has %d)", d.GPU, *d.MIG, s.migCount(d.GPU))
				}
				if d.Replica != nil {
					if !s.sharedGPU(d.GPU) {
						return s.errorAt(append(dp, "replica"), "GPU %d is not shared: list it in sharing.timeSlicing.gpus or sharing.mps.gpus", d.GPU)
					}
					if n := s.replicas(d.GPU); *d.Replica < 0 || *d.Replica >= n {
						return s.errorAt(append(dp, "replica"), "replica %d is outside 0..%d", *d.Replica, n-1)
					}
				} else if s.sharedGPU(d.GPU) {
					return s.errorAt(dp, "GPU %d is shared (time-slicing or MPS): name the replica a container holds", d.GPU)
				}
				u := heldUnit{gpu: d.GPU, mig: -1, replica: -1}
				if d.MIG != nil {
					u.mig = *d.MIG
				}
				if d.Replica != nil {
					u.replica = *d.Replica
				}
				me := heldBy{pod: key + "/" + c.Name, start: pod.Start, stop: pod.Stop, path: dp}
				for _, other := range holders[u] {
					if overlaps(me, other) {
						return s.errorAt(dp, "%s is already held by %s (%s) at the same time: the kubelet gives a device to one container; share a GPU through sharing.timeSlicing or sharing.mps and replicas, or give the pods disjoint start/stop times",
							describeUnit(u), other.pod, formatPath(other.path))
					}
				}
				holders[u] = append(holders[u], me)
			}
		}
	}
	return nil
}

// maxECCFault bounds one ECC fault: far more errors than a GPU ever
// counts, and small enough that no sum of faults wraps around uint64.
const maxECCFault = 1e12

func describeUnit(u heldUnit) string {
	switch {
	case u.mig >= 0:
		return fmt.Sprintf("MIG instance %d of GPU %d", u.mig, u.gpu)
	case u.replica >= 0:
		return fmt.Sprintf("replica %d of GPU %d", u.replica, u.gpu)
	}
	return fmt.Sprintf("GPU %d", u.gpu)
}

func (s *Scenario) validateFault(f FaultSpec, p []any) error {
	kinds := 0
	for _, set := range []bool{f.XID != 0, f.ECC != nil, f.Lost, f.Hang, len(f.Throttle) > 0, f.Remap != nil, f.RecoveryAction != "", f.DevicePlugin != nil, f.Reset, f.DCGMHealth != nil, f.DRATaint != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return s.errorAt(p, "a fault names exactly one of xid, ecc, lost, hang, throttle, remap, recoveryAction, devicePlugin, reset, dcgmHealth, draTaint (found %d)", kinds)
	}
	if f.Until != 0 && f.Until <= f.At {
		return s.errorAt(append(p, "until"), "until (%s) must come after at (%s)", time.Duration(f.Until), time.Duration(f.At))
	}
	if f.DevicePlugin != nil {
		if f.GPU != nil {
			return s.errorAt(append(p, "gpu"), "a devicePlugin fault is node-wide; remove gpu")
		}
		if f.DevicePlugin.Allocatable < 0 {
			return s.errorAt(append(p, "devicePlugin", "allocatable"), "must be 0 or more")
		}
		return nil
	}
	if f.GPU == nil {
		return s.errorAt(p, "this fault needs gpu: the index of the GPU it hits")
	}
	if *f.GPU < 0 || *f.GPU >= s.Node.Count {
		return s.errorAt(append(p, "gpu"), "GPU index %d is outside 0..%d", *f.GPU, s.Node.Count-1)
	}
	if h := f.DCGMHealth; h != nil {
		if !slices.Contains(dcgm.HealthSystems, h.System) {
			return s.errorAt(append(p, "dcgmHealth", "system"), "unknown DCGM health system %q; systems: %s", h.System, strings.Join(dcgm.HealthSystems, ", "))
		}
		if h.Result != dcgm.HealthWarn && h.Result != dcgm.HealthFail {
			return s.errorAt(append(p, "dcgmHealth", "result"), "result %q: give warn or fail (a pass is the fault's end: until)", h.Result)
		}
	}
	if t := f.DRATaint; t != nil {
		if s.Node.Flavour != "dra" {
			return s.errorAt(append(p, "draTaint"), "a DRA device taint needs node.flavour: dra (the ResourceSlice it is on)")
		}
		if t.Key == "" {
			return s.errorAt(append(p, "draTaint", "key"), "a taint needs a key, e.g. gpu.nvidia.com/xid")
		}
		if t.Effect != "None" && t.Effect != "NoSchedule" && t.Effect != "NoExecute" {
			return s.errorAt(append(p, "draTaint", "effect"), "effect %q: None, NoSchedule or NoExecute", t.Effect)
		}
	}
	if f.XID < 0 || f.XID > 10000 {
		return s.errorAt(append(p, "xid"), "%d is not an XID code", f.XID)
	}
	if f.MIG != nil && f.DRATaint != nil {
		if *f.MIG < 0 || *f.MIG >= s.migCount(*f.GPU) {
			return s.errorAt(append(p, "mig"), "mig %d: GPU %d has %d MIG devices", *f.MIG, *f.GPU, s.migCount(*f.GPU))
		}
	} else if f.MIG != nil && (f.XID == 0 || *f.MIG < 0 || *f.MIG >= s.migCount(*f.GPU)) {
		return s.errorAt(append(p, "mig"), "mig %d: an XID fault may name one of GPU %d's %d MIG devices", *f.MIG, *f.GPU, s.migCount(*f.GPU))
	}
	if f.Count < 0 || f.Count > 1000 || (f.Count == 0 && s.has(append(p, "count"))) {
		return s.errorAt(append(p, "count"), "%d: count is 1 to 1000 (leave it out for 1)", f.Count)
	}
	if e := f.ECC; e != nil {
		if e.Corrected > maxECCFault {
			return s.errorAt(append(p, "ecc", "corrected"), "%d errors: at most %d per fault", e.Corrected, uint64(maxECCFault))
		}
		if e.Uncorrected > maxECCFault {
			return s.errorAt(append(p, "ecc", "uncorrected"), "%d errors: at most %d per fault", e.Uncorrected, uint64(maxECCFault))
		}
	}
	if f.Reset && f.Until != 0 {
		return s.errorAt(append(p, "until"), "a reset happens at one moment; remove until")
	}
	if r := f.Remap; r != nil {
		if r.Correctable < 0 {
			return s.errorAt(append(p, "remap", "correctable"), "%d remapped rows: a count is 0 or more", r.Correctable)
		}
		if r.Uncorrectable < 0 {
			return s.errorAt(append(p, "remap", "uncorrectable"), "%d remapped rows: a count is 0 or more", r.Uncorrectable)
		}
		if b := r.Banks; b != nil {
			for _, c := range []struct {
				name string
				n    int
			}{{"high", b.High}, {"partial", b.Partial}, {"low", b.Low}, {"none", b.None}} {
				if c.n < 0 {
					return s.errorAt(append(p, "remap", "banks", c.name), "%d banks: a count is 0 or more", c.n)
				}
			}
			if n := b.High + b.Partial + b.Low + b.None; n > SimulatedRemapBanks {
				return s.errorAt(append(p, "remap", "banks"), "%d banks out of max availability: a simulated GPU has %d banks", n, SimulatedRemapBanks)
			}
		}
		if r.WalkEvery < 0 || (r.WalkEvery > 0 && time.Duration(r.WalkEvery) < time.Second) {
			return s.errorAt(append(p, "remap", "walkEvery"), "%s: a walk steps at most once a second; give 1s or more", time.Duration(r.WalkEvery))
		}
	}
	for j, r := range f.Throttle {
		if _, ok := ThrottleReasons[r]; !ok {
			return s.errorAt(append(p, "throttle", j), "unknown clock event reason %q; known: %s", r, strings.Join(sortedKeys(ThrottleReasons), ", "))
		}
	}
	if f.RecoveryAction != "" {
		if _, ok := RecoveryActions[f.RecoveryAction]; !ok {
			return s.errorAt(append(p, "recoveryAction"), "unknown recovery action %q; known: %s", f.RecoveryAction, strings.Join(sortedKeys(RecoveryActions), ", "))
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}

func (s *Scenario) validateWorkload(w *Workload, path []any) error {
	if w == nil {
		return nil
	}
	if err := s.validatePreset(w.Preset, append(path, "preset")); err != nil {
		return err
	}
	if err := s.validateCurve(w.Utilization, append(path, "utilization")); err != nil {
		return err
	}
	if err := s.validateCurve(w.Memory, append(path, "memory")); err != nil {
		return err
	}
	if err := s.validateCurve(w.SMActive, append(path, "smActive")); err != nil {
		return err
	}
	var last time.Duration = -1
	for i, ph := range w.Phases {
		pp := append(path, "phases", i)
		if time.Duration(ph.After) <= last {
			return s.errorAt(append(pp, "after"), "phases must be in increasing order of 'after'")
		}
		last = time.Duration(ph.After)
		if err := s.validatePreset(ph.Preset, append(pp, "preset")); err != nil {
			return err
		}
		if err := s.validateCurve(ph.Utilization, append(pp, "utilization")); err != nil {
			return err
		}
		if err := s.validateCurve(ph.Memory, append(pp, "memory")); err != nil {
			return err
		}
	}
	return nil
}

func (s *Scenario) validatePreset(name string, path []any) error {
	if name == "" {
		return nil
	}
	if _, ok := presets[name]; !ok {
		return s.errorAt(path, "unknown preset %q; presets: %s", name, strings.Join(Presets(), ", "))
	}
	return nil
}

func (s *Scenario) validateCurve(c *Curve, path []any) error {
	if c == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"mean", c.Mean}, {"amplitude", c.Amplitude}, {"noise", c.Noise}} {
		if f.v < 0 || f.v > 1 {
			return s.errorAt(append(path, f.name), "%v is outside 0..1 (values are fractions)", f.v)
		}
	}
	if c.Amplitude > 0 && c.Period == 0 {
		return s.errorAt(append(path, "period"), "an amplitude needs a period, such as 5m")
	}
	return nil
}

func parseCUDAVersion(v string) (int, error) {
	maj, minor, ok := strings.Cut(v, ".")
	a, err1 := strconv.Atoi(maj)
	b, err2 := strconv.Atoi(minor)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < 0 || b > 99 {
		return 0, fmt.Errorf("%q is not a CUDA version like 12.4", v)
	}
	return a*1000 + b*10, nil
}
