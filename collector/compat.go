package collector

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// CompatConfig configures the dcgm-exporter compatibility families
// (--compat.dcgm-exporter).
type CompatConfig struct {
	// Hostname is the value of the hostname label (dcgm-exporter: the
	// node's host name); the node name on Kubernetes.
	Hostname string
}

// compatLabels are dcgm-exporter 4.x's labels: the device's (gpu, UUID,
// pci_bus_id, device, modelName), the MIG instance's (GPU_I_PROFILE,
// GPU_I_ID; empty on a whole GPU, which Prometheus stores as absent),
// hostname, the driver version it attaches as a label
// (DCGM_FI_DRIVER_VERSION in its default counters), and the holder's
// (namespace, pod, container; empty when no container holds the device).
var compatLabels = []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID",
	"hostname", "DCGM_FI_DRIVER_VERSION", "namespace", "pod", "container"}

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
	scope      compatScope
	// value reads the family from a device (d) and its board (g); ok false
	// leaves the series out, as dcgm-exporter does with blank values.
	value func(c *compatDevice) (float64, bool)
	desc  *prometheus.Desc
}

// compatDevice is what one compatibility series is rendered from.
type compatDevice struct {
	d     *sample.DeviceState // the device: whole GPU or MIG instance
	g     *sample.GPUState    // its board
	rates compatRates         // byte rates of the device, from the last two samples
	last  *xid.DeviceLast
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

// whole is field for DCGM's integer fields (MiB, MHz, mJ): DCGM truncates
// bytes to MiB, and the float products of our base units are made exact.
func whole(f sample.Field, scale float64, scope compatScope) func(c *compatDevice) (float64, bool) {
	get := field(f, scale, scope)
	return func(c *compatDevice) (float64, bool) {
		v, ok := get(c)
		return math.Floor(v + 1e-6), ok
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
	{name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", help: "Total number of NVLink bandwidth counters for all lanes.", valueType: prometheus.CounterValue, scope: scopeBoard, value: func(c *compatDevice) (float64, bool) {
		// DCGM reports a rate here despite the counter type (in MB/s by
		// users' measurements): NVLink bytes sent and received per second.
		r := c.rates
		if !r.nvlinkOK {
			return 0, false
		}
		return (r.nvlinkTx + r.nvlinkRx) / 1e6, true
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
	{name: "DCGM_FI_PROF_PCIE_TX_BYTES", help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", valueType: prometheus.GaugeValue, value: func(c *compatDevice) (float64, bool) {
		return c.rates.pcieTx, c.rates.pcieOK
	}},
	{name: "DCGM_FI_PROF_PCIE_RX_BYTES", help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.", valueType: prometheus.GaugeValue, value: func(c *compatDevice) (float64, bool) {
		return c.rates.pcieRx, c.rates.pcieOK
	}},
}

var compatXIDDesc = prometheus.NewDesc("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
	append(append([]string(nil), compatLabels...), "err_code", "err_msg"), nil)

func init() {
	for _, f := range compatFamilies {
		f.desc = prometheus.NewDesc(f.name, f.help, compatLabels, nil)
	}
}

// CompatFamilyNames lists the dcgm-exporter families the compatibility
// switch serves, for tests and docs/migration-dcgm-exporter.md.
func CompatFamilyNames() []string {
	var out []string
	for _, f := range compatFamilies {
		out = append(out, f.name)
	}
	return append(out, "DCGM_FI_DEV_XID_ERRORS")
}

// compatRates are byte rates of a device: DCGM reports PCIe and NVLink
// traffic as rates, which our own families integrate into counters; the
// compatibility families turn them back into rates over the last sample
// interval.
type compatRates struct {
	pcieTx, pcieRx     float64
	pcieOK             bool
	nvlinkTx, nvlinkRx float64
	nvlinkOK           bool
}

type compatKey struct {
	uuid string
	gi   int
}

type compatCounters struct {
	at                                 time.Time
	pcieTx, pcieRx, nvlinkTx, nvlinkRx float64
	pcieOK, nvlinkOK                   bool
}

// compatRenderer keeps the previous sample's byte counters, to turn them
// into rates. update runs once per sample, under the exporter's render lock.
type compatRenderer struct {
	cfg  CompatConfig
	prev map[compatKey]compatCounters
}

func newCompatRenderer(cfg CompatConfig) *compatRenderer {
	return &compatRenderer{cfg: cfg, prev: map[compatKey]compatCounters{}}
}

// update works out the byte rates of the sample's devices into st.
func (r *compatRenderer) update(st *State) {
	st.compatRates = map[compatKey]compatRates{}
	next := map[compatKey]compatCounters{}
	visit := func(d *sample.DeviceState) {
		k := compatKey{d.UUID, d.GPUInstance}
		var c compatCounters
		c.at = st.Sample.Time
		var ok1, ok2 bool
		c.pcieTx, ok1 = d.Values.Get(sample.FieldPCIeTxBytes)
		c.pcieRx, ok2 = d.Values.Get(sample.FieldPCIeRxBytes)
		c.pcieOK = ok1 && ok2
		c.nvlinkTx, ok1 = d.Values.Get(sample.FieldNVLinkTxBytes)
		c.nvlinkRx, ok2 = d.Values.Get(sample.FieldNVLinkRxBytes)
		c.nvlinkOK = ok1 && ok2
		if !c.pcieOK && !c.nvlinkOK {
			return
		}
		next[k] = c
		p, ok := r.prev[k]
		dt := c.at.Sub(p.at).Seconds()
		if !ok || dt <= 0 {
			return
		}
		var rt compatRates
		if c.pcieOK && p.pcieOK && c.pcieTx >= p.pcieTx && c.pcieRx >= p.pcieRx {
			rt.pcieTx, rt.pcieRx, rt.pcieOK = (c.pcieTx-p.pcieTx)/dt, (c.pcieRx-p.pcieRx)/dt, true
		}
		if c.nvlinkOK && p.nvlinkOK && c.nvlinkTx >= p.nvlinkTx && c.nvlinkRx >= p.nvlinkRx {
			rt.nvlinkTx, rt.nvlinkRx, rt.nvlinkOK = (c.nvlinkTx-p.nvlinkTx)/dt, (c.nvlinkRx-p.nvlinkRx)/dt, true
		}
		st.compatRates[k] = rt
	}
	for i := range st.Sample.GPUs {
		g := &st.Sample.GPUs[i]
		visit(&g.DeviceState)
		for j := range g.MIG {
			visit(&g.MIG[j])
		}
	}
	r.prev = next
}

// collect renders the compatibility families from the state alone.
func (r *compatRenderer) collect(st *State, ch chan<- prometheus.Metric) {
	s := st.Sample
	driver := s.Driver.DriverVersion
	lastXID := map[int]*xid.DeviceLast{}
	for i := range st.XIDLast {
		lastXID[st.XIDLast[i].GPU] = &st.XIDLast[i]
	}
	var holders map[DeviceKey][]Holder
	if st.Allocations != nil {
		holders = st.Allocations.ByDevice
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if !g.Up {
			continue // dcgm-exporter serves nothing for a GPU DCGM cannot read
		}
		devs := []*sample.DeviceState{&g.DeviceState}
		if g.MIGEnabled && len(g.MIG) > 0 {
			devs = devs[:0]
			// DCGM's entity and dcgm-exporter's labels are the GPU
			// instance (GPU_I_ID): compute instances of one GPU instance
			// are served once, on the first, with all their holders.
			seen := map[int]bool{}
			for j := range g.MIG {
				if g.MIG[j].Up && !seen[g.MIG[j].GPUInstance] {
					seen[g.MIG[j].GPUInstance] = true
					devs = append(devs, &g.MIG[j])
				}
			}
		}
		for _, d := range devs {
			c := &compatDevice{d: d, g: g, rates: st.compatRates[compatKey{d.UUID, d.GPUInstance}], last: lastXID[g.GPU]}
			if d.IsMIG() {
				// PCIe and NVLink belong to the board: DCGM reports them on
				// the GPU, not per instance.
				c.rates = st.compatRates[compatKey{g.UUID, -1}]
			}
			base := r.labels(g, d, driver)
			hs := holders[DeviceKey{g.GPU, d.GPUInstance, d.ComputeInstance}]
			if d.IsMIG() {
				hs = giHolders(holders, g, d.GPUInstance)
			}
			if len(hs) == 0 {
				hs = []Holder{{}}
			}
			for _, h := range hs {
				lv := append(append([]string(nil), base...), h.Namespace, h.Pod, h.Container)
				for _, f := range compatFamilies {
					if v, ok := f.value(c); ok {
						ch <- prometheus.MustNewConstMetric(f.desc, f.valueType, v, lv...)
					}
				}
				code := 0
				if c.last != nil {
					code = c.last.Code
				}
				ch <- prometheus.MustNewConstMetric(compatXIDDesc, prometheus.GaugeValue, float64(code),
					append(lv, strconv.Itoa(code), xidMessage(code))...)
			}
		}
	}
}

// giHolders are the holders of every compute instance of GPU instance gi,
// each once.
func giHolders(holders map[DeviceKey][]Holder, g *sample.GPUState, gi int) []Holder {
	var out []Holder
	seen := map[Holder]bool{}
	for j := range g.MIG {
		if g.MIG[j].GPUInstance != gi {
			continue
		}
		for _, h := range holders[DeviceKey{g.GPU, gi, g.MIG[j].ComputeInstance}] {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	return out
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

// xidMessage is the err_msg label of DCGM_FI_DEV_XID_ERRORS.
func xidMessage(code int) string {
	if code == 0 {
		return "No Error"
	}
	if e := xid.Lookup(code); e.Name != "" {
		return e.Name
	}
	return "Unknown Error"
}
