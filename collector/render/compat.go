package render

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// CompatConfig configures the dcgm-exporter compatibility families
// (--compat.dcgm-exporter).
type CompatConfig struct {
	// Hostname is the value of the host name label (dcgm-exporter: the
	// node's host name); the node name on Kubernetes.
	Hostname string
	// HostnameLabel names that label: Hostname (every released
	// dcgm-exporter, the default when empty) or hostname (its main branch
	// since May 2026).
	HostnameLabel string
	// VirtualGPUs: a device held by several containers (time-slicing, MPS)
	// gets one series per holder, as dcgm-exporter's
	// --kubernetes-virtual-gpus. Otherwise, as dcgm-exporter by default,
	// one series per device, labelled with one of its holders.
	VirtualGPUs bool
}

// Host name label spellings: released dcgm-exporter's and its main branch's.
const (
	HostnameLabelReleased = "Hostname"
	HostnameLabelLower    = "hostname"
)

// HostnameLabels are the spellings CompatConfig.HostnameLabel accepts.
var HostnameLabels = []string{HostnameLabelReleased, HostnameLabelLower}

// compatLabelNames are dcgm-exporter 4.x's labels: the device's (gpu, UUID,
// pci_bus_id, device, modelName), the MIG instance's (GPU_I_PROFILE,
// GPU_I_ID; empty on a whole GPU, which Prometheus stores as absent), the
// host name's (Hostname in every release), the driver version it attaches
// as a label (DCGM_FI_DRIVER_VERSION in its default counters), and the
// holder's (namespace, pod, container; empty when no container holds the
// device).
func compatLabelNames(hostLabel string) []string {
	return []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID",
		hostLabel, "DCGM_FI_DRIVER_VERSION", "namespace", "pod", "container"}
}

// compatScope says where a compatibility family's value comes from.
type compatScope int

const (
	// scopeDevice: the device's own value (a MIG instance's own memory).
	scopeDevice compatScope = iota
	// scopeBoard: a value of the physical board, repeated on each MIG
	// instance as DCGM does for GPU instance entities.
	scopeBoard
)

// compatFamily is one family of dcgm-exporter's etc/default-counters.csv.
type compatFamily struct {
	name, help string
	valueType  prometheus.ValueType
	// notCount: typed counter as dcgm-exporter types it, but the value is
	// a rate that goes up and down; the counter-reset protection
	// (monotonic.go) leaves it alone, and it serves the current value.
	notCount bool
	scope    compatScope
	// value reads the family from a device (d) and its board (g); ok false
	// leaves the series out, as dcgm-exporter does with blank values.
	value func(c *compatDevice) (float64, bool)
}

// compatDevice is what one compatibility series is rendered from.
type compatDevice struct {
	d    *sample.DeviceState // the device: whole GPU or MIG instance
	g    *sample.GPUState    // its board
	last *xid.DeviceLast
}

const mib = 1 << 20

func field(f sample.Field, scale float64, scope compatScope) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) {
		src := c.d
		if scope == scopeBoard {
			src = &c.g.DeviceState
		}
		v, ok := src.Values.Get(f)
		return v * scale, ok
	}
}

// rate is a byte counter's current rate as DCGM reports it, in bytes per
// second. PCIe and NVLink belong to the board: DCGM reports them on the GPU,
// not per MIG instance. Served whenever DCGM has the value, as
// dcgm-exporter does: a rate made from two counter readings would be
// missing after every gap in the samples (a GPU hung for a while) and
// after every counter reset.
func rate(f sample.Field) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) { return c.g.Rates.Get(f) }
}

// whole is field for DCGM's integer fields (MiB, MHz, mJ): DCGM truncates
// bytes to MiB, and the float products of our base units are made exact.
func whole(f sample.Field, scale float64, scope compatScope) func(c *compatDevice) (float64, bool) {
	get := field(f, scale, scope)
	return func(c *compatDevice) (float64, bool) {
		v, ok := get(c)
		// Relative: a float product a hair under a whole number is that
		// number, but a byte short of a MiB is not the MiB.
		return math.Floor(v + 1e-12*max(1, math.Abs(v))), ok
	}
}

// compatFamilies follow dcgm-exporter's default-counters.csv (4.x), in its
// order, with its names, types, help texts and units. Left out:
// DCGM_FI_DEV_VGPU_LICENSE_STATUS (vGPU guests only) and
// DCGM_FI_DRIVER_VERSION, which dcgm-exporter serves as a label.
var compatFamilies = []*compatFamily{
	{name: "DCGM_FI_DEV_SM_CLOCK", help: "SM clock frequency (in MHz).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: whole(sample.FieldSMClock, 1e-6, scopeBoard)},
	{name: "DCGM_FI_DEV_MEM_CLOCK", help: "Memory clock frequency (in MHz).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: whole(sample.FieldMemoryClock, 1e-6, scopeBoard)},
	{name: "DCGM_FI_DEV_MEMORY_TEMP", help: "Memory temperature (in C).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: field(sample.FieldMemoryTemperature, 1, scopeBoard)},
	{name: "DCGM_FI_DEV_GPU_TEMP", help: "GPU temperature (in C).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: field(sample.FieldTemperature, 1, scopeBoard)},
	{name: "DCGM_FI_DEV_POWER_USAGE", help: "Power draw (in W).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: field(sample.FieldPower, 1, scopeBoard)},
	{name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", help: "Total energy consumption since boot (in mJ).", valueType: prometheus.CounterValue, scope: scopeBoard, value: whole(sample.FieldEnergy, 1000, scopeBoard)},
	{name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", help: "Total number of PCIe retries.", valueType: prometheus.CounterValue, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		h := c.g.Health.PCIeReplay
		return float64(h.V), h.OK
	}},
	{name: "DCGM_FI_DEV_GPU_UTIL", help: "GPU utilization (in %).", valueType: prometheus.GaugeValue, value: field(sample.FieldUtilization, 100, scopeDevice)},
	{name: "DCGM_FI_DEV_MEM_COPY_UTIL", help: "Memory utilization (in %).", valueType: prometheus.GaugeValue, value: field(sample.FieldMemoryUtilization, 100, scopeDevice)},
	{name: "DCGM_FI_DEV_ENC_UTIL", help: "Encoder utilization (in %).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: field(sample.FieldEncoderUtilization, 100, scopeBoard)},
	{name: "DCGM_FI_DEV_DEC_UTIL", help: "Decoder utilization (in %).", valueType: prometheus.GaugeValue, scope: scopeBoard, value: field(sample.FieldDecoderUtilization, 100, scopeBoard)},
	// DCGM_FI_DEV_XID_ERRORS is rendered by collectXID: it has two more labels.
	{name: "DCGM_FI_DEV_FB_FREE", help: "Framebuffer memory free (in MiB).", valueType: prometheus.GaugeValue, value: func(c *compatDevice) (float64, bool) {
		total, ok1 := c.d.Values.Get(sample.FieldMemoryTotal)
		used, ok2 := c.d.Values.Get(sample.FieldMemoryUsed)
		reserved, _ := c.d.Values.Get(sample.FieldMemoryReserved)
		if !ok1 || !ok2 {
			return 0, false
		}
		return math.Floor(max(0, total-used-reserved) / mib), true
	}},
	{name: "DCGM_FI_DEV_FB_USED", help: "Framebuffer memory used (in MiB).", valueType: prometheus.GaugeValue, value: whole(sample.FieldMemoryUsed, 1.0/mib, scopeDevice)},
	{name: "DCGM_FI_DEV_FB_RESERVED", help: "Framebuffer memory reserved (in MiB).", valueType: prometheus.GaugeValue, value: whole(sample.FieldMemoryReserved, 1.0/mib, scopeDevice)},
	{name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", help: "Total number of NVLink bandwidth counters for all lanes.", valueType: prometheus.CounterValue, notCount: true, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		// DCGM reports a rate here despite the counter type (in MB/s by
		// users' measurements): NVLink bytes sent and received per second.
		tx, ok1 := c.g.Rates.Get(sample.FieldNVLinkTxBytes)
		rx, ok2 := c.g.Rates.Get(sample.FieldNVLinkRxBytes)
		return (tx + rx) / 1e6, ok1 && ok2
	}},
	{name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", help: "Number of remapped rows for uncorrectable errors", valueType: prometheus.CounterValue, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		h := c.g.Health.RemapUncorr
		return float64(h.V), h.OK
	}},
	{name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", help: "Number of remapped rows for correctable errors", valueType: prometheus.CounterValue, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		h := c.g.Health.RemapCorr
		return float64(h.V), h.OK
	}},
	{name: "DCGM_FI_DEV_ROW_REMAP_FAILURE", help: "Whether remapping of rows has failed", valueType: prometheus.GaugeValue, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		h := c.g.Health.RemapFailed
		return b2f(h.V), h.OK
	}},
	{name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE", help: "Ratio of time the graphics engine is active.", valueType: prometheus.GaugeValue, value: field(sample.FieldGraphicsActive, 1, scopeDevice)},
	{name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", help: "Ratio of cycles the tensor (HMMA) pipe is active.", valueType: prometheus.GaugeValue, value: field(sample.FieldTensorActive, 1, scopeDevice)},
	{name: "DCGM_FI_PROF_DRAM_ACTIVE", help: "Ratio of cycles the device memory interface is active sending or receiving data.", valueType: prometheus.GaugeValue, value: field(sample.FieldDRAMActive, 1, scopeDevice)},
	{name: "DCGM_FI_PROF_PCIE_TX_BYTES", help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", valueType: prometheus.GaugeValue, value: rate(sample.FieldPCIeTxBytes)},
	{name: "DCGM_FI_PROF_PCIE_RX_BYTES", help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", valueType: prometheus.GaugeValue, value: rate(sample.FieldPCIeRxBytes)},
}

const compatXIDName, compatXIDHelp = "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."

// CompatFamilyNames lists the dcgm-exporter families the compatibility
// switch serves, for tests and docs/migration-dcgm-exporter.md.
func CompatFamilyNames() []string {
	var out []string
	for _, f := range compatFamilies {
		out = append(out, f.name)
	}
	return append(out, compatXIDName)
}

// compatRenderer keeps what the compatibility series are labelled with
// from one sample to the next. update runs once per sample, before the
// registry is gathered.
type compatRenderer struct {
	cfg CompatConfig
	// descs are compatFamilies' descriptors, in their order, and xidDesc
	// DCGM_FI_DEV_XID_ERRORS's: their labels follow the configuration.
	descs   []*prometheus.Desc
	xidDesc *prometheus.Desc
	// labelled is the holder each shared device's series were labelled
	// with last: kept while it holds the device, so the series do not
	// change when other holders come and go.
	labelled map[sample.UnitKey]state.Holder
	// lastLabels are the label values of each GPU's series (by UUID) when
	// it last answered.
	lastLabels map[string][][]string
	// holders are the holders each device's series of the current state
	// are labelled with.
	holders map[sample.UnitKey][]state.Holder
	// lost are the label values of the last series of each GPU (by index)
	// of the current state that does not answer.
	lost map[int][][]string
}

func newCompatRenderer(cfg CompatConfig) *compatRenderer {
	if cfg.HostnameLabel == "" {
		cfg.HostnameLabel = HostnameLabelReleased
	}
	labels := compatLabelNames(cfg.HostnameLabel)
	r := &compatRenderer{cfg: cfg, labelled: map[sample.UnitKey]state.Holder{}, lastLabels: map[string][][]string{}}
	for _, f := range compatFamilies {
		r.descs = append(r.descs, prometheus.NewDesc(f.name, f.help, labels, nil))
	}
	r.xidDesc = prometheus.NewDesc(compatXIDName, compatXIDHelp, append(labels, "err_code", "err_msg"), nil)
	return r
}

// update works out the holders the state's series name and the label sets
// of the GPUs that do not answer.
func (r *compatRenderer) update(st *state.State) {
	r.updateHolders(st)
	r.updateLost(st)
}

// updateHolders picks the holders each device's series are labelled with:
// all of them with VirtualGPUs, otherwise one (dcgm-exporter's default
// shape: one series per device), the one picked before while it still
// holds the device, else the first by namespace, pod and container.
func (r *compatRenderer) updateHolders(st *state.State) {
	if st.Allocations == nil || st.Allocations.ByDevice == nil {
		r.holders = nil
		return
	}
	if r.cfg.VirtualGPUs {
		r.holders = st.Allocations.ByDevice
		return
	}
	r.holders = make(map[sample.UnitKey][]state.Holder, len(st.Allocations.ByDevice))
	next := make(map[sample.UnitKey]state.Holder, len(st.Allocations.ByDevice))
	for k, hs := range st.Allocations.ByDevice {
		if len(hs) == 0 {
			continue
		}
		h, ok := r.labelled[k]
		if !ok || !slices.Contains(hs, h) {
			h = slices.MinFunc(hs, func(a, b state.Holder) int {
				return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container))
			})
		}
		next[k] = h
		r.holders[k] = []state.Holder{h}
	}
	r.labelled = next
}

// collect renders the compatibility families of the state update saw last.
func (r *compatRenderer) collect(st *state.State, ch chan<- prometheus.Metric) {
	s := st.Sample
	lastXID := map[int]*xid.DeviceLast{}
	for i := range st.XIDLast {
		lastXID[st.XIDLast[i].GPU] = &st.XIDLast[i]
	}
	xidSeries := func(last *xid.DeviceLast, lv []string) {
		code := 0
		if last != nil {
			code = last.Code
		}
		ch <- prometheus.MustNewConstMetric(r.xidDesc, prometheus.GaugeValue, float64(code),
			append(lv, strconv.Itoa(code), xidMessage(code))...)
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if !g.Up {
			// A GPU that does not answer (fallen off the bus: XID 79) keeps
			// its last XID series, under the labels it had, while it is
			// lost: the alerts on DCGM_FI_DEV_XID_ERRORS see the XID that
			// took it. Its other values are unknown, so absent.
			for _, lv := range r.lost[g.GPU] {
				xidSeries(lastXID[g.GPU], append([]string(nil), lv...))
			}
			continue
		}
		for _, ds := range r.deviceSeries(st, g) {
			d := ds.d
			c := &compatDevice{d: d, g: g, last: lastXID[g.GPU]}
			for _, lv := range ds.labels {
				for i, f := range compatFamilies {
					if v, ok := f.value(c); ok {
						ch <- prometheus.MustNewConstMetric(r.descs[i], f.valueType, v, lv...)
					}
				}
				xidSeries(c.last, append([]string(nil), lv...))
			}
		}
	}
}

// compatSeries is a device with series and the label values of each of
// its series (one per holder it is labelled with).
type compatSeries struct {
	d      *sample.DeviceState
	labels [][]string
}

// deviceSeries lists the devices of an answering GPU that have series: the
// GPU, or its MIG GPU instances that answer.
func (r *compatRenderer) deviceSeries(st *state.State, g *sample.GPUState) []compatSeries {
	devs := []*sample.DeviceState{&g.DeviceState}
	if g.MIGEnabled && len(g.MIG) > 0 {
		devs = devs[:0]
		// DCGM's entity and dcgm-exporter's labels are the GPU instance
		// (GPU_I_ID): compute instances of one GPU instance are served
		// once, on the first, with all their holders and the GPU
		// instance's DCGM values.
		seen := map[int]bool{}
		for j := range g.MIG {
			if g.MIG[j].Up && !seen[g.MIG[j].GPUInstance] {
				seen[g.MIG[j].GPUInstance] = true
				devs = append(devs, state.GPUInstanceDCGM(g, &g.MIG[j]))
			}
		}
	}
	out := make([]compatSeries, 0, len(devs))
	for _, d := range devs {
		base := r.labels(g, d, st.Sample.Driver.DriverVersion)
		hs := r.holders[sample.UnitKey{GPU: g.GPU, GPUInstance: d.GPUInstance, ComputeInstance: d.ComputeInstance}]
		if d.IsMIG() {
			hs = giHolders(r.holders, g, d.GPUInstance)
			if !r.cfg.VirtualGPUs && len(hs) > 1 {
				// One series per GPU instance, as for a shared GPU: the
				// holder of its first compute instance that has one.
				hs = hs[:1]
			}
		}
		if len(hs) == 0 {
			hs = []state.Holder{{}}
		}
		cs := compatSeries{d: d}
		for _, h := range hs {
			cs.labels = append(cs.labels, append(append([]string(nil), base...), h.Namespace, h.Pod, h.Container))
		}
		out = append(out, cs)
	}
	return out
}

// updateLost remembers the label sets of each answering GPU's series and
// hands those of the GPUs that do not answer to collect (lost). A GPU that
// leaves the sample is forgotten.
func (r *compatRenderer) updateLost(st *state.State) {
	r.lost = map[int][][]string{}
	seen := make(map[string]bool, len(st.Sample.GPUs))
	for i := range st.Sample.GPUs {
		g := &st.Sample.GPUs[i]
		if g.UUID == "" {
			continue
		}
		seen[g.UUID] = true
		if g.Up {
			var lvs [][]string
			for _, ds := range r.deviceSeries(st, g) {
				lvs = append(lvs, ds.labels...)
			}
			r.lastLabels[g.UUID] = lvs
		} else if lvs, ok := r.lastLabels[g.UUID]; ok {
			r.lost[g.GPU] = lvs
		}
	}
	for u := range r.lastLabels {
		if !seen[u] {
			delete(r.lastLabels, u)
		}
	}
}

func (r *compatRenderer) labels(g *sample.GPUState, d *sample.DeviceState, driver string) []string {
	gi, prof := "", ""
	if d.IsMIG() {
		gi, prof = strconv.Itoa(d.GPUInstance), d.MIGProfile
		if g.MIGLayout != nil { // the GPU instance's profile, not 1c.3g.40gb
			if pl, ok := g.MIGLayout.Instances[d.GPUInstance]; ok && pl.Profile != "" {
				prof = pl.Profile
			}
		}
	}
	// dcgm-exporter names the device after the GPU index (nvidia<index>)
	// and takes DCGM's upper-case PCI bus ID.
	return []string{strconv.Itoa(g.GPU), g.UUID, strings.ToUpper(g.PCIBusID), "nvidia" + strconv.Itoa(g.GPU),
		g.Model, prof, gi, r.cfg.Hostname, driver}
}

// xidMessage is the err_msg label of DCGM_FI_DEV_XID_ERRORS: dcgm-exporter's
// own text for the code, so alerts and dashboards matching on it match.
func xidMessage(code int) string { return xid.DCGMExporterMessage(code) }

// giHolders are the holders of every compute instance of GPU instance gi,
// each once.
func giHolders(holders map[sample.UnitKey][]state.Holder, g *sample.GPUState, gi int) []state.Holder {
	var out []state.Holder
	seen := map[state.Holder]bool{}
	for j := range g.MIG {
		if g.MIG[j].GPUInstance != gi {
			continue
		}
		for _, h := range holders[sample.MIGKey(g.GPU, &g.MIG[j])] {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	return out
}
