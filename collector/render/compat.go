package render

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

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
	// VirtualGPUs: as dcgm-exporter's --kubernetes-virtual-gpus, a held
	// device gets one series per holder and replica (vgpu), and
	// DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_GPU_UTIL an unlabelled device
	// series plus one per holder with its pod's own figures from NVML's
	// per-process accounting (pod_uid). Otherwise, as dcgm-exporter by
	// default, one series per device, labelled with one of its holders.
	VirtualGPUs bool
	// Counters are the fields served, as dcgm-exporter's counters file
	// (-f) lists them; nil serves DefaultCompatCounters.
	Counters *CompatCounters
	// PodUID adds the holder's pod UID (pod_uid), and PodLabels its pod's
	// labels, each under its key made a label name, as dcgm-exporter's
	// --kubernetes-enable-pod-uid and --kubernetes-enable-pod-labels: from
	// the state's PodMeta (the API server's).
	PodUID, PodLabels bool
}

// Host name label spellings: released dcgm-exporter's and its main branch's.
const (
	HostnameLabelReleased = "Hostname"
	HostnameLabelLower    = "hostname"
)

// HostnameLabels are the spellings CompatConfig.HostnameLabel accepts.
var HostnameLabels = []string{HostnameLabelReleased, HostnameLabelLower}

// compatScope says where a compatibility family's value comes from.
type compatScope int

const (
	// scopeDevice: the device's own value (a MIG instance's own memory).
	scopeDevice compatScope = iota
	// scopeBoard: a value of the physical board, repeated on each MIG
	// instance as DCGM does for GPU instance entities.
	scopeBoard
)

// compatField is a DCGM field this exporter serves, and where its value
// comes from.
type compatField struct {
	scope compatScope
	// count: the value counts something and only grows at its source but
	// across a reset; typed counter it is kept from falling (monotonic.go).
	// Any other value a file types counter (a rate DCGM types counter) goes
	// up and down and is served as it is.
	count bool
	// needs says what a node must have to give the value, for the log line
	// of a listed field that no GPU gives.
	needs string
	// value reads the field; ok false leaves the series out, as
	// dcgm-exporter does with blank values.
	value func(c *compatDevice) (float64, bool)
	// perPod, for the fields dcgm-exporter serves per pod under
	// --kubernetes-virtual-gpus, reads a pod's own figure from its
	// processes on the device.
	perPod func(u *podUse) (float64, bool)
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

func healthCount(get func(h *sample.Health) sample.Opt[int]) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) {
		o := get(&c.g.Health)
		return float64(o.V), o.OK
	}
}

func healthFlag(get func(h *sample.Health) sample.Opt[bool]) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) {
		o := get(&c.g.Health)
		return b2f(o.V), o.OK
	}
}

// ecc is DCGM's ECC total of one kind (single-bit: corrected, double-bit:
// uncorrected) and counter (volatile or aggregate).
func ecc(uncorrected, aggregate int) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) {
		o := c.g.Health.ECC[uncorrected][aggregate]
		return float64(o.V), o.OK
	}
}

// nvlinkErrors is one NVLink error type summed over the board's links.
func nvlinkErrors(name string) func(c *compatDevice) (float64, bool) {
	i := slices.Index(sample.NVLinkErrorNames[:], name)
	return func(c *compatDevice) (float64, bool) {
		h := &c.g.Health
		return float64(h.NVLinkErrors[i]), h.HasNVLink && h.NVLinkErrorSeen[i]
	}
}

// What a node must have for the fields that not every node gives.
const (
	needsDCGM      = "DCGM with profiling (no DCGM host engine or library, or a board DCGM does not profile)"
	needsNVML      = "a board whose NVML gives it"
	needsECC       = "ECC (off, or a board without it)"
	needsRemapping = "row remapping (Ampere and later data-centre boards)"
	needsNVLink    = "NVLink (a board without it)"
)

// compatFields are the DCGM fields served, by field ID (dcgmfields.go names
// them), with the units DCGM gives them.
var compatFields = map[int]*compatField{
	100: {scope: scopeBoard, needs: needsNVML, value: whole(sample.FieldSMClock, 1e-6, scopeBoard)},     // DCGM_FI_DEV_SM_CLOCK, MHz
	101: {scope: scopeBoard, needs: needsNVML, value: whole(sample.FieldMemoryClock, 1e-6, scopeBoard)}, // DCGM_FI_DEV_MEM_CLOCK, MHz
	112: {scope: scopeBoard, needs: needsNVML, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_CLOCKS_EVENT_REASONS, NVML's bit mask
		o := c.g.Health.ClockReasons
		return float64(o.V), o.OK
	}},
	140: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldMemoryTemperature, 1, scopeBoard)},                                      // DCGM_FI_DEV_MEMORY_TEMP, C
	150: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldTemperature, 1, scopeBoard)},                                            // DCGM_FI_DEV_GPU_TEMP, C
	155: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPower, 1, scopeBoard)},                                                  // DCGM_FI_DEV_POWER_USAGE, W
	156: {scope: scopeBoard, count: true, needs: needsNVML, value: whole(sample.FieldEnergy, 1000, scopeBoard)},                                 // DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
	158: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldSlowdownTemperature, 1, scopeBoard)},                                    // DCGM_FI_DEV_SLOWDOWN_TEMP, C
	159: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldShutdownTemperature, 1, scopeBoard)},                                    // DCGM_FI_DEV_SHUTDOWN_TEMP, C
	160: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPowerLimit, 1, scopeBoard)},                                             // DCGM_FI_DEV_POWER_MGMT_LIMIT, W
	202: {scope: scopeBoard, count: true, needs: needsNVML, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.PCIeReplay })}, // DCGM_FI_DEV_PCIE_REPLAY_COUNTER
	203: {needs: needsNVML, value: field(sample.FieldUtilization, 100, scopeDevice), perPod: podSMPercent},                                      // DCGM_FI_DEV_GPU_UTIL, %
	204: {needs: needsNVML, value: field(sample.FieldMemoryUtilization, 100, scopeDevice)},                                                      // DCGM_FI_DEV_MEM_COPY_UTIL, %
	206: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldEncoderUtilization, 100, scopeBoard)},                                   // DCGM_FI_DEV_ENC_UTIL, %
	207: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldDecoderUtilization, 100, scopeBoard)},                                   // DCGM_FI_DEV_DEC_UTIL, %
	237: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPCIeLinkGeneration, 1, scopeBoard)},                                     // DCGM_FI_DEV_PCIE_LINK_GEN
	238: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPCIeLinkWidth, 1, scopeBoard)},                                          // DCGM_FI_DEV_PCIE_LINK_WIDTH
	250: {needs: needsNVML, value: whole(sample.FieldMemoryTotal, 1.0/mib, scopeDevice)},                                                        // DCGM_FI_DEV_FB_TOTAL, MiB
	251: {needs: needsNVML, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_FB_FREE, MiB
		total, ok1 := c.d.Values.Get(sample.FieldMemoryTotal)
		used, ok2 := c.d.Values.Get(sample.FieldMemoryUsed)
		reserved, _ := c.d.Values.Get(sample.FieldMemoryReserved)
		if !ok1 || !ok2 {
			return 0, false
		}
		return math.Floor(max(0, total-used-reserved) / mib), true
	}},
	252: {needs: needsNVML, value: whole(sample.FieldMemoryUsed, 1.0/mib, scopeDevice), perPod: podMemoryMiB}, // DCGM_FI_DEV_FB_USED, MiB
	253: {needs: needsNVML, value: whole(sample.FieldMemoryReserved, 1.0/mib, scopeDevice)},                   // DCGM_FI_DEV_FB_RESERVED, MiB
	310: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(0, 0)},                                  // DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
	311: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(1, 0)},                                  // DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
	312: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(0, 1)},                                  // DCGM_FI_DEV_ECC_SBE_AGG_TOTAL
	313: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(1, 1)},                                  // DCGM_FI_DEV_ECC_DBE_AGG_TOTAL
	390: {scope: scopeBoard, count: true, needs: needsECC, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_RETIRED_SBE
		o := c.g.Health.RetiredPages[0]
		return float64(o.V), o.OK
	}},
	391: {scope: scopeBoard, count: true, needs: needsECC, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_RETIRED_DBE
		o := c.g.Health.RetiredPages[1]
		return float64(o.V), o.OK
	}},
	392: {scope: scopeBoard, needs: needsECC, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RetiredPending })},                 // DCGM_FI_DEV_RETIRED_PENDING
	393: {scope: scopeBoard, count: true, needs: needsRemapping, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.RemapUncorr })}, // DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
	394: {scope: scopeBoard, count: true, needs: needsRemapping, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.RemapCorr })},   // DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
	395: {scope: scopeBoard, needs: needsRemapping, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RemapFailed })},              // DCGM_FI_DEV_ROW_REMAP_FAILURE
	396: {scope: scopeBoard, needs: needsRemapping, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RemapPending })},             // DCGM_FI_DEV_ROW_REMAP_PENDING
	409: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("crc_flit")},                                                        // DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
	419: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("crc_data")},                                                        // DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
	429: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("replay")},                                                          // DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
	439: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("recovery")},                                                        // DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
	449: {scope: scopeBoard, needs: needsDCGM, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL
		// DCGM reports a rate here despite the counter type: NVML's
		// NVLink throughput counters (KiB, both directions) per second,
		// divided by 1000 (DcgmCacheManager's ReadAndCacheNvLinkBandwidth,
		// as dcgm-exporter's PR 658 reads it: "MiB/s").
		tx, ok1 := c.g.Rates.Get(sample.FieldNVLinkTxBytes)
		rx, ok2 := c.g.Rates.Get(sample.FieldNVLinkRxBytes)
		return (tx + rx) / 1024 / 1000, ok1 && ok2
	}},
	526:  {scope: scopeBoard, value: func(*compatDevice) (float64, bool) { return 0, true }}, // DCGM_FI_DEV_VGPU_LICENSE_STATUS: 0 on bare metal, as DCGM answers there
	1001: {needs: needsDCGM, value: field(sample.FieldGraphicsActive, 1, scopeDevice)},       // DCGM_FI_PROF_GR_ENGINE_ACTIVE
	1002: {needs: needsDCGM, value: field(sample.FieldSMActive, 1, scopeDevice)},             // DCGM_FI_PROF_SM_ACTIVE
	1003: {needs: needsDCGM, value: field(sample.FieldSMOccupancy, 1, scopeDevice)},          // DCGM_FI_PROF_SM_OCCUPANCY
	1004: {needs: needsDCGM, value: field(sample.FieldTensorActive, 1, scopeDevice)},         // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
	1005: {needs: needsDCGM, value: field(sample.FieldDRAMActive, 1, scopeDevice)},           // DCGM_FI_PROF_DRAM_ACTIVE
	1006: {needs: needsDCGM, value: field(sample.FieldFP64Active, 1, scopeDevice)},           // DCGM_FI_PROF_PIPE_FP64_ACTIVE
	1007: {needs: needsDCGM, value: field(sample.FieldFP32Active, 1, scopeDevice)},           // DCGM_FI_PROF_PIPE_FP32_ACTIVE
	1008: {needs: needsDCGM, value: field(sample.FieldFP16Active, 1, scopeDevice)},           // DCGM_FI_PROF_PIPE_FP16_ACTIVE
	1009: {needs: needsDCGM, value: rate(sample.FieldPCIeTxBytes)},                           // DCGM_FI_PROF_PCIE_TX_BYTES, B/s
	1010: {needs: needsDCGM, value: rate(sample.FieldPCIeRxBytes)},                           // DCGM_FI_PROF_PCIE_RX_BYTES, B/s
	1011: {needs: needsDCGM, value: rate(sample.FieldNVLinkTxBytes)},                         // DCGM_FI_PROF_NVLINK_TX_BYTES, B/s
	1012: {needs: needsDCGM, value: rate(sample.FieldNVLinkRxBytes)},                         // DCGM_FI_PROF_NVLINK_RX_BYTES, B/s
}

// DCGM field IDs with a rendering of their own.
const (
	fieldIDXIDErrors     = 230 // DCGM_FI_DEV_XID_ERRORS: the last XID, with err_code and err_msg
	fieldIDDriverVersion = 1   // DCGM_FI_DRIVER_VERSION: a label
	fieldIDNVMLVersion   = 2   // DCGM_FI_NVML_VERSION: a label
)

// compatLabelFields are the text fields served as labels, by field ID.
var compatLabelFields = map[int]func(d *sample.DriverInfo) string{
	fieldIDDriverVersion: func(d *sample.DriverInfo) string { return d.DriverVersion },
	fieldIDNVMLVersion:   func(d *sample.DriverInfo) string { return d.NVMLVersion },
}

// compatFamily is one family a counters file lists and this exporter
// serves.
type compatFamily struct {
	name, help string
	valueType  prometheus.ValueType
	field      *compatField // nil for DCGM_FI_DEV_XID_ERRORS
}

// compatLabelField is one text field a counters file lists as label.
type compatLabelField struct {
	name  string
	value func(d *sample.DriverInfo) string
}

// compatPlan is what a counters file asks of this exporter: the families
// served, in the file's order, the label fields, and the fields it lists
// that the exporter never reads.
type compatPlan struct {
	families []compatFamily
	labels   []compatLabelField
	unread   []CompatCounter
}

func planCompat(cs *CompatCounters) compatPlan {
	var p compatPlan
	for _, c := range cs.Counters {
		if c.Type == CounterLabel {
			if v, ok := compatLabelFields[c.ID]; ok {
				p.labels = append(p.labels, compatLabelField{name: c.Field, value: v})
			} else {
				p.unread = append(p.unread, c)
			}
			continue
		}
		vt := prometheus.GaugeValue
		if c.Type == CounterCounter {
			vt = prometheus.CounterValue
		}
		switch f, ok := compatFields[c.ID]; {
		case c.ID == fieldIDXIDErrors:
			p.families = append(p.families, compatFamily{name: c.Field, help: c.Help, valueType: vt})
		case ok:
			p.families = append(p.families, compatFamily{name: c.Field, help: c.Help, valueType: vt, field: f})
		default:
			p.unread = append(p.unread, c)
		}
	}
	return p
}

// CompatFamilyNames lists the families served without a counters file
// (dcgm-exporter's default list), for tests and
// docs/migration-dcgm-exporter.md.
func CompatFamilyNames() []string {
	var out []string
	for _, f := range planCompat(DefaultCompatCounters()).families {
		out = append(out, f.name)
	}
	return out
}

// CompatUnread lists the fields of a counters file this exporter never
// reads (per-link NVLink, NVSwitch and CPU fields, dcgm-exporter's
// DCGM_EXP_* windows...): served by no node, and logged at start.
func CompatUnread(cs *CompatCounters) []CompatCounter { return planCompat(cs).unread }

// compatLabels are one series' label names and values, in the same order.
// A label with an empty value is left out, as dcgm-exporter leaves it out.
type compatLabels struct {
	names, values []string
}

func (l compatLabels) add(name, value string) compatLabels {
	if value == "" {
		return l
	}
	return compatLabels{names: append(slices.Clip(l.names), name), values: append(slices.Clip(l.values), value)}
}

// compatRenderer keeps what the compatibility series are labelled with
// from one sample to the next. update runs once per sample, before the
// registry is gathered.
type compatRenderer struct {
	cfg  CompatConfig
	log  zerolog.Logger
	plan compatPlan
	// descs are the descriptors made so far, by family and label names:
	// a series' label names follow its device and holder.
	descs map[string]*prometheus.Desc
	// labelled is the holder each shared device's series were labelled
	// with last: kept while it holds the device, so the series do not
	// change when other holders come and go.
	labelled map[sample.UnitKey]state.Holder
	// lastLabels are the labels of each GPU's series (by UUID) when it
	// last answered.
	lastLabels map[string][]compatLabels
	// holders are the holders each device's series of the current state
	// are labelled with.
	holders map[sample.UnitKey][]state.Holder
	// lost are the labels of the last series of each GPU (by index) of the
	// current state that does not answer.
	lost map[int][]compatLabels
	// noValue are the listed families no GPU gave a value for in the last
	// render, logged when they change.
	noValue []string
}

func newCompatRenderer(cfg CompatConfig, log zerolog.Logger) *compatRenderer {
	if cfg.HostnameLabel == "" {
		cfg.HostnameLabel = HostnameLabelReleased
	}
	if cfg.Counters == nil {
		cfg.Counters = DefaultCompatCounters()
	}
	r := &compatRenderer{cfg: cfg, log: log, plan: planCompat(cfg.Counters), descs: map[string]*prometheus.Desc{},
		labelled: map[sample.UnitKey]state.Holder{}, lastLabels: map[string][]compatLabels{}}
	if len(r.plan.unread) > 0 {
		var names []string
		for _, c := range r.plan.unread {
			names = append(names, fmt.Sprintf("%s (line %d)", c.Field, c.Line))
		}
		log.Warn().Str("counters", cfg.Counters.Source).Strs("fields", names).
			Msg("the counters file lists DCGM fields this exporter does not read: they are left out (gpu_exporter_compat_fields{state=\"not_read\"} counts them)")
	}
	return r
}

// maxCompatDescs bounds the descriptor cache: label sets of pods that came
// and went are dropped with it.
const maxCompatDescs = 1 << 14

// desc is the descriptor of family name with these label names.
func (r *compatRenderer) desc(name, help string, names []string) *prometheus.Desc {
	key := name + "\xff" + strings.Join(names, "\xfe")
	d, ok := r.descs[key]
	if !ok {
		if len(r.descs) >= maxCompatDescs {
			clear(r.descs)
		}
		d = prometheus.NewDesc(name, help, names, nil)
		r.descs[key] = d
	}
	return d
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

// Values of gpu_exporter_compat_fields' state label.
const (
	compatFieldsServed  = "served"
	compatFieldsNoValue = "no_value"
	compatFieldsNotRead = "not_read"
)

var compatFieldsDesc = prometheus.NewDesc("gpu_exporter_compat_fields",
	"DCGM fields the dcgm-exporter counters file lists, by state: served on this page, read by the exporter but given by no GPU of this node in this sample (no_value: no DCGM profiling, no ECC...), or never read by the exporter (not_read: logged at start).",
	[]string{"state"}, nil)

// collect renders the compatibility families of the state update saw last.
func (r *compatRenderer) collect(st *state.State, ch chan<- prometheus.Metric) {
	s := st.Sample
	lastXID := map[int]*xid.DeviceLast{}
	for i := range st.XIDLast {
		lastXID[st.XIDLast[i].GPU] = &st.XIDLast[i]
	}
	served := make([]bool, len(r.plan.families))
	emit := func(fi int, v float64, l compatLabels) {
		f := &r.plan.families[fi]
		served[fi] = true
		ch <- prometheus.MustNewConstMetric(r.desc(f.name, f.help, l.names), f.valueType, v, l.values...)
	}
	xidSeries := func(fi int, last *xid.DeviceLast, l compatLabels) {
		code := 0
		if last != nil {
			code = last.Code
		}
		// err_msg is never empty; err_code "0" before any XID.
		l = compatLabels{names: append(slices.Clip(l.names), "err_code", "err_msg"), values: append(slices.Clip(l.values), strconv.Itoa(code), xidMessage(code))}
		emit(fi, float64(code), l)
	}
	upGPUs := 0
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if !g.Up {
			// A GPU that does not answer (fallen off the bus: XID 79) keeps
			// its last XID series, under the labels it had, while it is
			// lost: the alerts on DCGM_FI_DEV_XID_ERRORS see the XID that
			// took it. Its other values are unknown, so absent.
			for fi := range r.plan.families {
				if r.plan.families[fi].field == nil {
					for _, l := range r.lost[g.GPU] {
						xidSeries(fi, lastXID[g.GPU], l)
					}
				}
			}
			continue
		}
		upGPUs++
		for _, ds := range r.deviceSeries(st, g) {
			c := &compatDevice{d: ds.d, g: g, last: lastXID[g.GPU]}
			for fi, f := range r.plan.families {
				switch {
				case f.field == nil:
					for _, l := range ds.labels {
						xidSeries(fi, c.last, l)
					}
				case f.field.perPod != nil && ds.perPod != nil:
					// dcgm-exporter's --kubernetes-virtual-gpus: the
					// device's own value without holder labels, and each
					// holder's pod's own figure.
					v, ok := f.field.value(c)
					if !ok {
						continue
					}
					emit(fi, v, ds.base)
					for _, ps := range ds.perPod {
						if pv, ok := f.field.perPod(ps.use); ok {
							emit(fi, pv, ps.labels)
						}
					}
				default:
					if v, ok := f.field.value(c); ok {
						for _, l := range ds.labels {
							emit(fi, v, l)
						}
					}
				}
			}
		}
	}
	var noValue []string
	for fi, ok := range served {
		if !ok {
			noValue = append(noValue, r.plan.families[fi].name)
		}
	}
	ch <- prometheus.MustNewConstMetric(compatFieldsDesc, prometheus.GaugeValue, float64(len(r.plan.families)-len(noValue)), compatFieldsServed)
	ch <- prometheus.MustNewConstMetric(compatFieldsDesc, prometheus.GaugeValue, float64(len(noValue)), compatFieldsNoValue)
	ch <- prometheus.MustNewConstMetric(compatFieldsDesc, prometheus.GaugeValue, float64(len(r.plan.unread)), compatFieldsNotRead)
	if upGPUs > 0 && !slices.Equal(noValue, r.noValue) {
		r.noValue = noValue
		if len(noValue) > 0 {
			var why []string
			for fi, ok := range served {
				if f := r.plan.families[fi]; !ok && f.field != nil && f.field.needs != "" {
					why = append(why, f.name+": needs "+f.field.needs)
				}
			}
			r.log.Info().Str("counters", r.cfg.Counters.Source).Strs("fields", why).
				Msg("the counters file lists DCGM fields no GPU of this node gives now: they are left out until one does (gpu_exporter_compat_fields{state=\"no_value\"})")
		}
	}
}

// compatSeries is a device with series and the labels of each of its
// series (one per holder, or with VirtualGPUs per holder and replica, it is
// labelled with).
type compatSeries struct {
	d      *sample.DeviceState
	labels []compatLabels
	// base are the device's own labels, without a holder's.
	base compatLabels
	// perPod are, with VirtualGPUs on a held device whose processes NVML
	// listed, the series of the per-process fields: one per holder and
	// replica, with its pod's use of the device.
	perPod []podSeries
}

// podSeries is one holder's series of a per-process field.
type podSeries struct {
	labels compatLabels
	use    *podUse
}

// podUse is what one pod's processes use of a device (a GPU instance: all
// its compute instances).
type podUse struct {
	memoryMiB, sm        float64
	memoryKnown, smKnown bool
	// uid is the pod UID the processes' cgroup paths name.
	uid string
}

// podMemoryMiB is a pod's DCGM_FI_DEV_FB_USED: its processes' whole MiB.
func podMemoryMiB(u *podUse) (float64, bool) { return u.memoryMiB, u.memoryKnown }

// podSMPercent is a pod's DCGM_FI_DEV_GPU_UTIL: its processes' SM
// utilisation, in whole percent as NVML samples it.
func podSMPercent(u *podUse) (float64, bool) { return math.Round(u.sm * 100), u.smKnown }

// podUses are the use of each pod with processes on, or holding, the
// units; nil when their processes are not known (no per-process
// accounting, or NVML did not list them), so no per-pod figure is made up.
func podUses(st *state.State, units []sample.UnitKey) map[state.PodRef]*podUse {
	out := map[state.PodRef]*podUse{}
	for _, k := range units {
		du := st.Usage.Device(k)
		if du == nil || !du.Known {
			return nil
		}
		for _, cu := range du.Containers {
			ref := state.PodRef{Namespace: cu.Namespace, Pod: cu.Pod}
			u, ok := out[ref]
			if !ok {
				u = &podUse{memoryKnown: true, smKnown: true}
				out[ref] = u
			}
			u.memoryMiB += cu.Use.MemoryMiB
			u.sm += cu.Use.SM
			u.memoryKnown = u.memoryKnown && cu.Use.MemoryKnown
			u.smKnown = u.smKnown && cu.Use.SMKnown
			u.uid = cmp.Or(u.uid, cu.Use.PodUID)
		}
	}
	return out
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
		base := r.labels(g, d, &st.Sample.Driver)
		units := []sample.UnitKey{sample.GPUKey(g.GPU)}
		hs := r.holders[units[0]]
		if d.IsMIG() {
			units = giUnits(g, d.GPUInstance)
			hs = giHolders(r.holders, g, d.GPUInstance)
			if !r.cfg.VirtualGPUs && len(hs) > 1 {
				// One series per GPU instance, as for a shared GPU: the
				// holder of its first compute instance that has one.
				hs = hs[:1]
			}
		}
		cs := compatSeries{d: d, base: base}
		if len(hs) == 0 {
			cs.labels = []compatLabels{base}
			out = append(out, cs)
			continue
		}
		var uses map[state.PodRef]*podUse
		if r.cfg.VirtualGPUs {
			uses = podUses(st, units)
			cs.perPod = []podSeries{} // held: the per-process fields are served per pod
		}
		for _, h := range hs {
			l := r.holderLabels(st, base, h)
			if !r.cfg.VirtualGPUs {
				cs.labels = append(cs.labels, l)
				continue
			}
			// dcgm-exporter: one series per device ID the container
			// holds, its replica as vgpu; the per-process fields always
			// with the pod's UID.
			ref := state.PodRef{Namespace: h.Namespace, Pod: h.Pod}
			use := uses[ref]
			pl := l
			if !slices.Contains(pl.names, podUIDLabel) {
				uid := st.PodMeta[ref].UID
				if uid == "" && use != nil {
					uid = use.uid
				}
				pl = pl.add(podUIDLabel, uid)
			}
			for _, rep := range holderReplicas(st.Allocations, h, units) {
				vl, vpl := l, pl
				if rep >= 0 {
					vl, vpl = l.add(vgpuLabel, strconv.Itoa(rep)), pl.add(vgpuLabel, strconv.Itoa(rep))
				}
				cs.labels = append(cs.labels, vl)
				if use != nil {
					cs.perPod = append(cs.perPod, podSeries{labels: vpl, use: use})
				}
			}
		}
		// Without per-process figures (no accounting, or NVML did not list
		// the processes) the per-process fields keep only the device's
		// series: not the device's value repeated on every holder, not
		// made-up pod values.
		out = append(out, cs)
	}
	return out
}

// holderReplicas are the replicas (time-slicing, MPS) of the units that a
// holder holds, sorted; -1 alone when it holds them whole.
func holderReplicas(a *state.Allocations, h state.Holder, units []sample.UnitKey) []int {
	var out []int
	for _, k := range units {
		out = append(out, a.Replicas[state.HolderOn{Holder: h, Key: k}]...)
	}
	if len(out) == 0 {
		return []int{-1}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// giUnits are the compute instances of GPU instance gi.
func giUnits(g *sample.GPUState, gi int) []sample.UnitKey {
	var out []sample.UnitKey
	for j := range g.MIG {
		if g.MIG[j].GPUInstance == gi {
			out = append(out, sample.MIGKey(g.GPU, &g.MIG[j]))
		}
	}
	return out
}

// holderLabels adds the holder's labels to a device's. A device no
// container holds has none, as dcgm-exporter sends none: an empty label
// sent would, under honor_labels: true, remove the target's own namespace,
// pod and container, which dcgm-exporter's series keep.
func (r *compatRenderer) holderLabels(st *state.State, base compatLabels, h state.Holder) compatLabels {
	l := base.add("namespace", h.Namespace).add("pod", h.Pod).add("container", h.Container)
	if !r.cfg.PodUID && !r.cfg.PodLabels || h.Pod == "" {
		return l
	}
	meta, ok := st.PodMeta[state.PodRef{Namespace: h.Namespace, Pod: h.Pod}]
	if !ok {
		return l
	}
	if r.cfg.PodUID {
		l = l.add(podUIDLabel, meta.UID)
	}
	if r.cfg.PodLabels {
		for _, pl := range podLabels(meta.Labels) {
			if !slices.Contains(l.names, pl.name) && !slices.Contains(compatLaterLabels, pl.name) {
				l = l.add(pl.name, pl.value)
			}
		}
	}
	return l
}

// Label names dcgm-exporter gives the holder's pod UID and a shared GPU's
// replica.
const (
	podUIDLabel = "pod_uid"
	vgpuLabel   = "vgpu"
)

// compatLaterLabels are added to a series after the holder's: a pod label of
// the same name would make the name twice (a page client_golang refuses).
var compatLaterLabels = []string{"err_code", "err_msg", podUIDLabel, vgpuLabel}

type labelPair struct{ name, value string }

// podLabels are a pod's labels as dcgm-exporter names them: each key with
// every character outside [a-zA-Z0-9_] replaced by '_'
// (app.kubernetes.io/name is app_kubernetes_io_name), sorted by name. A key
// that starts with a digit gets a leading '_' (a label name cannot start
// with one; dcgm-exporter would serve an invalid page); of keys that become
// the same name, the first by key is kept.
func podLabels(labels map[string]string) []labelPair {
	keys := slices.Sorted(maps.Keys(labels))
	out := make([]labelPair, 0, len(keys))
	seen := map[string]bool{}
	for _, k := range keys {
		name := sanitizeLabelName(k)
		if name == "" || strings.HasPrefix(name, "__") || seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, labelPair{name, labels[k]})
	}
	return out
}

func sanitizeLabelName(k string) string {
	b := []byte(k)
	for i, c := range b {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		return "_" + string(b)
	}
	return string(b)
}

// updateLost remembers the label sets of each answering GPU's series and
// hands those of the GPUs that do not answer to collect (lost). A GPU that
// leaves the sample is forgotten.
func (r *compatRenderer) updateLost(st *state.State) {
	r.lost = map[int][]compatLabels{}
	seen := make(map[string]bool, len(st.Sample.GPUs))
	for i := range st.Sample.GPUs {
		g := &st.Sample.GPUs[i]
		if g.UUID == "" {
			continue
		}
		seen[g.UUID] = true
		if g.Up {
			var lvs []compatLabels
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

// labels are a device's own labels: dcgm-exporter 4.x's (gpu, UUID,
// pci_bus_id, device, modelName), the MIG instance's (GPU_I_PROFILE,
// GPU_I_ID; none on a whole GPU), the host name's and the text fields the
// counters file lists as labels (DCGM_FI_DRIVER_VERSION in its default).
func (r *compatRenderer) labels(g *sample.GPUState, d *sample.DeviceState, driver *sample.DriverInfo) compatLabels {
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
	l := compatLabels{}.add("gpu", strconv.Itoa(g.GPU)).add("UUID", g.UUID).add("pci_bus_id", strings.ToUpper(g.PCIBusID)).
		add("device", "nvidia"+strconv.Itoa(g.GPU)).add("modelName", g.Model).add("GPU_I_PROFILE", prof).add("GPU_I_ID", gi).
		add(r.cfg.HostnameLabel, r.cfg.Hostname)
	for _, lf := range r.plan.labels {
		l = l.add(lf.name, lf.value(driver))
	}
	return l
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
