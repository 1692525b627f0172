package render

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// CompatConfig configures the dcgm-exporter compatibility families
// (--compat.dcgm-exporter).
type CompatConfig struct {
	// Release is the dcgm-exporter release line whose contract the
	// families follow (CompatReleases: its default counters file and host
	// name label); "" is DefaultCompatRelease.
	Release string
	// Hostname is the value of the host name label (dcgm-exporter: the
	// node's host name); the node name on Kubernetes.
	Hostname string
	// HostnameLabel names that label: Hostname (dcgm-exporter up to 4.8.2)
	// or hostname (4.8.3 and later); "" is the release line's.
	HostnameLabel string
	// VirtualGPUs: as dcgm-exporter's --kubernetes-virtual-gpus, a held
	// device gets one series per holder and replica (vgpu), and
	// DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_GPU_UTIL an unlabelled device
	// series plus one per holder with its pod's own figures from NVML's
	// per-process accounting (pod_uid). Otherwise, as dcgm-exporter by
	// default, one series per device, labelled with one of its holders.
	VirtualGPUs bool
	// Counters are the fields served, as dcgm-exporter's counters file
	// (-f) lists them; nil serves the release line's default file.
	Counters *CompatCounters
	// PodUID adds the holder's pod UID (pod_uid), and PodLabels its pod's
	// labels, each under its key made a label name, as dcgm-exporter's
	// --kubernetes-enable-pod-uid and --kubernetes-enable-pod-labels: from
	// the state's PodMeta (the API server's).
	PodUID, PodLabels bool
	// DRA, as dcgm-exporter's --kubernetes-enable-dra: a device held
	// through DRA ResourceClaims gets one series per holder, with the
	// claim's dra_* labels (draLabels), instead of the device's one.
	DRA bool
	// NvidiaResourceNames are, as dcgm-exporter's --nvidia-resource-names,
	// the device plugin resources besides nvidia.com/gpu and
	// nvidia.com/mig-* whose holders label the series (nvidia.com/gpu.shared
	// for time-sliced GPUs renamed by the NVIDIA device plugin). A device
	// held only through another resource has its series without holder
	// labels, as dcgm-exporter serves it.
	NvidiaResourceNames []string
	// XIDCountWindow is DCGM_EXP_XID_ERRORS_COUNT's window (dcgm-exporter's
	// --xid-count-window-size); 0 is its default, DefaultXIDCountWindow.
	XIDCountWindow time.Duration
}

// DefaultXIDCountWindow is dcgm-exporter's --xid-count-window-size default
// (300000 ms).
const DefaultXIDCountWindow = 5 * time.Minute

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
	// value reads the field in its base unit (hertz, bytes, joules, bytes
	// per second, a 0-1 ratio); ok false leaves the series out, as
	// dcgm-exporter does with blank values.
	value func(c *compatDevice) (float64, bool)
	// legacy is the unit DCGM gives the field under its legacy name and
	// every name of its ID that states no unit (MHz, MiB, mJ, percent).
	legacy compatUnit
	// perPod, for the fields dcgm-exporter serves per pod under
	// --kubernetes-virtual-gpus, reads a pod's own figure from its
	// processes on the device, in the base unit.
	perPod func(u *podUse) (float64, bool)
}

// compatUnit is a unit a field is served in, from its base unit.
type compatUnit struct {
	// scale converts the base unit into this one.
	scale float64
	// whole: DCGM gives an integer (MiB, MHz, mJ: truncated).
	whole bool
}

// Units of DCGM's legacy fields.
var (
	unitBase     = compatUnit{scale: 1}
	unitMHz      = compatUnit{scale: 1e-6, whole: true}
	unitMiB      = compatUnit{scale: 1.0 / mib, whole: true}
	unitMilliJ   = compatUnit{scale: 1000, whole: true}
	unitPercent  = compatUnit{scale: 100}
	unitNVLinkMB = compatUnit{scale: 1.0 / 1024 / 1000} // DCGM's "MB/s": KiB/s divided by 1000
)

// convert is v, in the base unit, in u. A float product a hair off a whole
// number (0.57 × 100) is that number; a whole unit is truncated as DCGM
// truncates it: a byte short of a MiB is the MiB below.
func (u compatUnit) convert(v float64) float64 {
	v *= u.scale
	if u.whole {
		// Relative: a float product a hair under a whole number is that
		// number, but a byte short of a MiB is not the MiB.
		return math.Floor(v + 1e-12*max(1, math.Abs(v)))
	}
	if r := math.Round(v); math.Abs(v-r) <= 1e-9*max(1, math.Abs(v)) {
		return r
	}
	return v
}

// baseUnitSuffixes are the endings of DCGM's field naming standard
// (dcgm_field_naming.py: a unit of BYTES, CELSIUS, HERTZ, JOULES, SECONDS,
// WATTS, or the RATIO suffix, then an optional TOTAL) that state a base
// unit; BYTES_PER_SECOND is DCGM 4.8's rate.
var baseUnitSuffixes = []string{"_RATIO", "_BYTES", "_BYTES_PER_SECOND", "_CELSIUS", "_HERTZ", "_JOULES", "_SECONDS", "_WATTS"}

// statesBaseUnit says whether a field name states its unit: then it is
// served in that base unit, whatever unit DCGM gives the field's ID under
// another name. DCGM 4.6 gives the name DCGM_FI_DEV_GPU_UTIL_RATIO to ID
// 203, which holds a percentage; the name says a 0-1 ratio, and a ratio is
// what dcgm-exporter 4.9 serves under it.
func statesBaseUnit(name string) bool {
	name = strings.TrimSuffix(name, "_TOTAL")
	for _, s := range baseUnitSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// compatFieldOf is the field a name serves and the unit it serves it in:
// the name's own ID, or the legacy field a base-unit name replaces (DCGM
// 4.6.1's DCGM_FI_DEV_SM_CLOCK_HERTZ is DCGM_FI_DEV_SM_CLOCK in hertz).
func compatFieldOf(name string) (*compatField, compatUnit, bool) {
	fn, ok := dcgmFieldNames()[name]
	if !ok {
		return nil, compatUnit{}, false
	}
	f, ok := compatFields[fn.id]
	if !ok && fn.replaces != "" {
		f, ok = compatFields[dcgmFieldNames()[fn.replaces].id]
	}
	if !ok {
		return nil, compatUnit{}, false
	}
	if statesBaseUnit(name) {
		return f, unitBase, true
	}
	return f, f.legacy, true
}

// compatDevice is what one compatibility series is rendered from.
type compatDevice struct {
	d    *sample.DeviceState // the device: whole GPU or MIG instance
	g    *sample.GPUState    // its board
	last *xid.DeviceLast
}

const mib = 1 << 20

func field(f sample.Field, scope compatScope) func(c *compatDevice) (float64, bool) {
	return func(c *compatDevice) (float64, bool) {
		src := c.d
		if scope == scopeBoard {
			src = &c.g.DeviceState
		}
		return src.Values.Get(f)
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

// compatFields are the DCGM fields served, by the field ID of their legacy
// name (dcgmfields.go names them, and the base-unit fields that replace
// some), each read in its base unit with the unit DCGM gives the legacy
// name.
var compatFields = map[int]*compatField{
	100: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldSMClock, scopeBoard), legacy: unitMHz},     // DCGM_FI_DEV_SM_CLOCK, MHz
	101: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldMemoryClock, scopeBoard), legacy: unitMHz}, // DCGM_FI_DEV_MEM_CLOCK, MHz
	112: {scope: scopeBoard, needs: needsNVML, legacy: unitBase, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_CLOCKS_EVENT_REASONS, NVML's bit mask
		o := c.g.Health.ClockReasons
		return float64(o.V), o.OK
	}},
	140: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldMemoryTemperature, scopeBoard), legacy: unitBase},                                         // DCGM_FI_DEV_MEMORY_TEMP, C
	150: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldTemperature, scopeBoard), legacy: unitBase},                                               // DCGM_FI_DEV_GPU_TEMP, C
	155: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPower, scopeBoard), legacy: unitBase},                                                     // DCGM_FI_DEV_POWER_USAGE, W
	156: {scope: scopeBoard, count: true, needs: needsNVML, value: field(sample.FieldEnergy, scopeBoard), legacy: unitMilliJ},                                     // DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
	158: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldSlowdownTemperature, scopeBoard), legacy: unitBase},                                       // DCGM_FI_DEV_SLOWDOWN_TEMP, C
	159: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldShutdownTemperature, scopeBoard), legacy: unitBase},                                       // DCGM_FI_DEV_SHUTDOWN_TEMP, C
	160: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPowerLimit, scopeBoard), legacy: unitBase},                                                // DCGM_FI_DEV_POWER_MGMT_LIMIT, W
	202: {scope: scopeBoard, count: true, needs: needsNVML, legacy: unitBase, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.PCIeReplay })}, // DCGM_FI_DEV_PCIE_REPLAY_COUNTER
	203: {needs: needsNVML, value: field(sample.FieldUtilization, scopeDevice), legacy: unitPercent, perPod: podSMRatio},                                          // DCGM_FI_DEV_GPU_UTIL, %
	204: {needs: needsNVML, value: field(sample.FieldMemoryUtilization, scopeDevice), legacy: unitPercent},                                                        // DCGM_FI_DEV_MEM_COPY_UTIL, %
	206: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldEncoderUtilization, scopeBoard), legacy: unitPercent},                                     // DCGM_FI_DEV_ENC_UTIL, %
	207: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldDecoderUtilization, scopeBoard), legacy: unitPercent},                                     // DCGM_FI_DEV_DEC_UTIL, %
	237: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPCIeLinkGeneration, scopeBoard), legacy: unitBase},                                        // DCGM_FI_DEV_PCIE_LINK_GEN
	238: {scope: scopeBoard, needs: needsNVML, value: field(sample.FieldPCIeLinkWidth, scopeBoard), legacy: unitBase},                                             // DCGM_FI_DEV_PCIE_LINK_WIDTH
	250: {needs: needsNVML, value: field(sample.FieldMemoryTotal, scopeDevice), legacy: unitMiB},                                                                  // DCGM_FI_DEV_FB_TOTAL, MiB
	251: {needs: needsNVML, legacy: unitMiB, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_FB_FREE, MiB
		total, ok1 := c.d.Values.Get(sample.FieldMemoryTotal)
		used, ok2 := c.d.Values.Get(sample.FieldMemoryUsed)
		reserved, _ := c.d.Values.Get(sample.FieldMemoryReserved)
		if !ok1 || !ok2 {
			return 0, false
		}
		return max(0, total-used-reserved), true
	}},
	252: {needs: needsNVML, value: field(sample.FieldMemoryUsed, scopeDevice), legacy: unitMiB, perPod: podMemoryBytes}, // DCGM_FI_DEV_FB_USED, MiB
	253: {needs: needsNVML, value: field(sample.FieldMemoryReserved, scopeDevice), legacy: unitMiB},                     // DCGM_FI_DEV_FB_RESERVED, MiB
	310: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(0, 0), legacy: unitBase},                          // DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
	311: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(1, 0), legacy: unitBase},                          // DCGM_FI_DEV_ECC_DBE_VOL_TOTAL
	312: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(0, 1), legacy: unitBase},                          // DCGM_FI_DEV_ECC_SBE_AGG_TOTAL
	313: {scope: scopeBoard, count: true, needs: needsECC, value: ecc(1, 1), legacy: unitBase},                          // DCGM_FI_DEV_ECC_DBE_AGG_TOTAL
	390: {scope: scopeBoard, count: true, needs: needsECC, legacy: unitBase, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_RETIRED_SBE
		o := c.g.Health.RetiredPages[0]
		return float64(o.V), o.OK
	}},
	391: {scope: scopeBoard, count: true, needs: needsECC, legacy: unitBase, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_RETIRED_DBE
		o := c.g.Health.RetiredPages[1]
		return float64(o.V), o.OK
	}},
	392: {scope: scopeBoard, needs: needsECC, legacy: unitBase, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RetiredPending })},                 // DCGM_FI_DEV_RETIRED_PENDING
	393: {scope: scopeBoard, count: true, needs: needsRemapping, legacy: unitBase, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.RemapUncorr })}, // DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS
	394: {scope: scopeBoard, count: true, needs: needsRemapping, legacy: unitBase, value: healthCount(func(h *sample.Health) sample.Opt[int] { return h.RemapCorr })},   // DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS
	395: {scope: scopeBoard, needs: needsRemapping, legacy: unitBase, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RemapFailed })},              // DCGM_FI_DEV_ROW_REMAP_FAILURE
	396: {scope: scopeBoard, needs: needsRemapping, legacy: unitBase, value: healthFlag(func(h *sample.Health) sample.Opt[bool] { return h.RemapPending })},             // DCGM_FI_DEV_ROW_REMAP_PENDING
	409: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("crc_flit"), legacy: unitBase},                                                        // DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
	419: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("crc_data"), legacy: unitBase},                                                        // DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
	429: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("replay"), legacy: unitBase},                                                          // DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
	439: {scope: scopeBoard, count: true, needs: needsNVLink, value: nvlinkErrors("recovery"), legacy: unitBase},                                                        // DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
	449: {scope: scopeBoard, needs: needsDCGM, legacy: unitNVLinkMB, value: func(c *compatDevice) (float64, bool) { // DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL
		// DCGM reports a rate here despite the counter type: NVML's
		// NVLink throughput counters (KiB, both directions) per second,
		// divided by 1000 (DcgmCacheManager's ReadAndCacheNvLinkBandwidth,
		// as dcgm-exporter's PR 658 reads it: "MiB/s"). The base unit is
		// the bytes per second of both directions.
		tx, ok1 := c.g.Rates.Get(sample.FieldNVLinkTxBytes)
		rx, ok2 := c.g.Rates.Get(sample.FieldNVLinkRxBytes)
		return tx + rx, ok1 && ok2
	}},
	526:  {scope: scopeBoard, legacy: unitBase, value: func(*compatDevice) (float64, bool) { return 0, true }}, // DCGM_FI_DEV_VGPU_LICENSE_STATUS: 0 on bare metal, as DCGM answers there
	1001: {needs: needsDCGM, value: field(sample.FieldGraphicsActive, scopeDevice), legacy: unitBase},          // DCGM_FI_PROF_GR_ENGINE_ACTIVE
	1002: {needs: needsDCGM, value: field(sample.FieldSMActive, scopeDevice), legacy: unitBase},                // DCGM_FI_PROF_SM_ACTIVE
	1003: {needs: needsDCGM, value: field(sample.FieldSMOccupancy, scopeDevice), legacy: unitBase},             // DCGM_FI_PROF_SM_OCCUPANCY
	1004: {needs: needsDCGM, value: field(sample.FieldTensorActive, scopeDevice), legacy: unitBase},            // DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
	1005: {needs: needsDCGM, value: field(sample.FieldDRAMActive, scopeDevice), legacy: unitBase},              // DCGM_FI_PROF_DRAM_ACTIVE
	1006: {needs: needsDCGM, value: field(sample.FieldFP64Active, scopeDevice), legacy: unitBase},              // DCGM_FI_PROF_PIPE_FP64_ACTIVE
	1007: {needs: needsDCGM, value: field(sample.FieldFP32Active, scopeDevice), legacy: unitBase},              // DCGM_FI_PROF_PIPE_FP32_ACTIVE
	1008: {needs: needsDCGM, value: field(sample.FieldFP16Active, scopeDevice), legacy: unitBase},              // DCGM_FI_PROF_PIPE_FP16_ACTIVE
	1009: {needs: needsDCGM, value: rate(sample.FieldPCIeTxBytes), legacy: unitBase},                           // DCGM_FI_PROF_PCIE_TX_BYTES, B/s
	1010: {needs: needsDCGM, value: rate(sample.FieldPCIeRxBytes), legacy: unitBase},                           // DCGM_FI_PROF_PCIE_RX_BYTES, B/s
	1011: {needs: needsDCGM, value: rate(sample.FieldNVLinkTxBytes), legacy: unitBase},                         // DCGM_FI_PROF_NVLINK_TX_BYTES, B/s
	1012: {needs: needsDCGM, value: rate(sample.FieldNVLinkRxBytes), legacy: unitBase},                         // DCGM_FI_PROF_NVLINK_RX_BYTES, B/s
}

// DCGM field IDs with a rendering of their own.
const (
	fieldIDXIDErrors     = 230 // DCGM_FI_DEV_XID_ERRORS: the last XID, with err_code and err_msg
	fieldIDDriverVersion = 1   // DCGM_FI_DRIVER_VERSION: a label
	fieldIDNVMLVersion   = 2   // DCGM_FI_NVML_VERSION: a label
)

// dcgm-exporter's own XID families (internal/pkg/counters), by the IDs
// dcgmfields.go gives them (TestXIDFieldIDs checks them against the table).
const (
	fieldIDXIDCount = 9001
	fieldIDXIDTotal = 9005
)

// compatLabelFields are the text fields served as labels, by field ID.
var compatLabelFields = map[int]func(d *sample.DriverInfo) string{
	fieldIDDriverVersion: func(d *sample.DriverInfo) string { return d.DriverVersion },
	fieldIDNVMLVersion:   func(d *sample.DriverInfo) string { return d.NVMLVersion },
}

// compatKind is where a family's series come from.
type compatKind int

const (
	kindField     compatKind = iota // a DCGM field of compatFields
	kindXIDLast                     // DCGM_FI_DEV_XID_ERRORS: the last XID, err_code, err_msg
	kindXIDWindow                   // DCGM_EXP_XID_ERRORS_COUNT: XIDs of the window, per xid
	kindXIDTotal                    // DCGM_EXP_XID_ERRORS_TOTAL: XIDs since the start, per xid
)

// compatFamily is one family a counters file lists and this exporter
// serves.
type compatFamily struct {
	name, help string
	valueType  prometheus.ValueType
	kind       compatKind
	field      *compatField // kindField
	unit       compatUnit   // kindField: the unit the name states, or the field's legacy one
}

// fromXIDs: the family's series come from the XID counter, which has
// them also for a GPU that does not answer.
func (f *compatFamily) fromXIDs() bool { return f.kind != kindField }

// compatLabelField is one text field a counters file lists as label.
type compatLabelField struct {
	name  string
	value func(d *sample.DriverInfo) string
}

// compatPlan is what a counters file asks of this exporter: the families
// served, in the file's order, the label fields, the fields it lists that
// the exporter never reads, and those neither DCGM nor dcgm-exporter
// defines as far as this exporter knows.
type compatPlan struct {
	families []compatFamily
	labels   []compatLabelField
	unread   []CompatCounter
	unknown  []CompatCounter
}

func planCompat(cs *CompatCounters) compatPlan {
	p := compatPlan{unknown: cs.Unknown}
	for _, c := range cs.Counters {
		if c.Type == CounterLabel {
			if v, ok := compatLabelFields[c.ID]; ok {
				p.labels = append(p.labels, compatLabelField{name: c.Field, value: v})
			} else {
				p.unread = append(p.unread, c)
			}
			continue
		}
		fam := compatFamily{name: c.Field, help: c.Help, valueType: prometheus.GaugeValue}
		if c.Type == CounterCounter {
			fam.valueType = prometheus.CounterValue
		}
		switch f, unit, ok := compatFieldOf(c.Field); {
		case c.ID == fieldIDXIDErrors:
			fam.kind = kindXIDLast
		case c.ID == fieldIDXIDCount:
			fam.kind = kindXIDWindow
		case c.ID == fieldIDXIDTotal:
			fam.kind = kindXIDTotal
		case ok:
			fam.field, fam.unit = f, unit
		default:
			p.unread = append(p.unread, c)
			continue
		}
		p.families = append(p.families, fam)
	}
	return p
}

// CompatFamilyNames lists the families served without a counters file
// (the default release line's default list), for tests and
// docs/migration-dcgm-exporter.md.
func CompatFamilyNames() []string { return CompatFamilyNamesOf(DefaultCompatCounters()) }

// CompatFamilyNamesOf lists the families served for a counters file.
func CompatFamilyNamesOf(cs *CompatCounters) []string {
	var out []string
	for _, f := range planCompat(cs).families {
		out = append(out, f.name)
	}
	return out
}

// CompatUnread lists the fields of a counters file this exporter never
// reads (per-link NVLink, NVSwitch and CPU fields, dcgm-exporter's clock
// event and health families...): served by no node, and logged at start.
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
	// windowLabel is DCGM_EXP_XID_ERRORS_COUNT's window_size_in_ms.
	windowLabel string
}

func newCompatRenderer(cfg CompatConfig, log zerolog.Logger) (*compatRenderer, error) {
	rel, err := CompatReleaseNamed(cmp.Or(cfg.Release, DefaultCompatRelease))
	if err != nil {
		return nil, err
	}
	cfg.Release = rel.Name
	if cfg.HostnameLabel == "" {
		cfg.HostnameLabel = rel.HostnameLabel
	}
	if cfg.Counters == nil {
		cfg.Counters = rel.DefaultCounters()
	}
	if cfg.XIDCountWindow <= 0 {
		cfg.XIDCountWindow = DefaultXIDCountWindow
	}
	r := &compatRenderer{cfg: cfg, log: log, plan: planCompat(cfg.Counters), descs: map[string]*prometheus.Desc{},
		labelled: map[sample.UnitKey]state.Holder{}, lastLabels: map[string][]compatLabels{},
		windowLabel: strconv.FormatInt(cfg.XIDCountWindow.Milliseconds(), 10)}
	if len(r.plan.unread) > 0 {
		var names []string
		for _, c := range r.plan.unread {
			names = append(names, fmt.Sprintf("%s (line %d)", c.Field, c.Line))
		}
		log.Warn().Str("counters", cfg.Counters.Source).Strs("fields", names).
			Msg("the counters file lists DCGM fields this exporter does not read: they are left out (gpu_exporter_compat_fields{state=\"not_read\"} counts them)")
	}
	if len(r.plan.unknown) > 0 {
		var names []string
		for _, c := range r.plan.unknown {
			names = append(names, fmt.Sprintf("%s (line %d)", c.Field, c.Line))
		}
		log.Warn().Str("counters", cfg.Counters.Source).Strs("fields", names).
			Msg("the counters file lists fields this exporter does not know (neither of DCGM's headers nor of dcgm-exporter's names as far as its table goes: a newer DCGM, or a misspelling): they are left out and the others served (gpu_exporter_compat_fields{state=\"unknown\"} counts them)")
	}
	return r, nil
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
	r.holders = make(map[sample.UnitKey][]state.Holder, len(st.Allocations.ByDevice))
	next := make(map[sample.UnitKey]state.Holder, len(st.Allocations.ByDevice))
	for k, all := range st.Allocations.ByDevice {
		hs := slices.DeleteFunc(slices.Clone(all), func(h state.Holder) bool { return !r.labelledBy(h) })
		if len(hs) == 0 {
			continue
		}
		if r.cfg.DRA {
			// dcgm-exporter: the holders through DRA claims replace the
			// device's series, one copy each.
			if dra := slices.DeleteFunc(slices.Clone(hs), func(h state.Holder) bool {
				return len(st.Allocations.Claims[state.HolderOn{Holder: h, Key: k}]) == 0
			}); len(dra) > 0 {
				r.holders[k] = dra
				continue
			}
		}
		if r.cfg.VirtualGPUs {
			r.holders[k] = hs
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

// Device plugin resources whose holders dcgm-exporter always names
// (internal/pkg/appconfig: NvidiaResourceName, NvidiaMigResourcePrefix).
const (
	resourceNVIDIAGPU       = "nvidia.com/gpu"
	resourceNVIDIAMIGPrefix = "nvidia.com/mig-"
)

// labelledBy says whether a holder labels the series of the device it holds:
// as dcgm-exporter, one holding it through nvidia.com/gpu, an
// nvidia.com/mig-* resource or one of NvidiaResourceNames. A DRA claim
// (its driver's name, no '/') labels them as the device plugin's do.
func (r *compatRenderer) labelledBy(h state.Holder) bool {
	res := h.Resource
	return !strings.Contains(res, "/") || res == resourceNVIDIAGPU || strings.HasPrefix(res, resourceNVIDIAMIGPrefix) ||
		slices.Contains(r.cfg.NvidiaResourceNames, res)
}

// Values of gpu_exporter_compat_fields' state label.
const (
	compatFieldsServed  = "served"
	compatFieldsNoValue = "no_value"
	compatFieldsNotRead = "not_read"
	compatFieldsUnknown = "unknown"
)

var compatFieldsDesc = prometheus.NewDesc("gpu_exporter_compat_fields",
	"DCGM fields the dcgm-exporter counters file lists, by state: served on this page, read by the exporter but given by no GPU of this node in this sample (no_value: no DCGM profiling, no ECC...), never read by the exporter (not_read: logged at start), or not known to it (unknown: a field of a newer DCGM or a misspelling, logged at start).",
	[]string{"state"}, nil)

// collect renders the compatibility families of the state update saw last.
func (r *compatRenderer) collect(st *state.State, ch chan<- prometheus.Metric) {
	s := st.Sample
	lastXID := map[int]*xid.DeviceLast{}
	for i := range st.XIDLast {
		lastXID[st.XIDLast[i].GPU] = &st.XIDLast[i]
	}
	xids := r.xidCounts(st)
	served := make([]bool, len(r.plan.families))
	emit := func(fi int, v float64, l compatLabels) {
		f := &r.plan.families[fi]
		served[fi] = true
		ch <- prometheus.MustNewConstMetric(r.desc(f.name, f.help, l.names), f.valueType, v, l.values...)
	}
	// xidSeries are the series of a family from the XID counter.
	xidSeries := func(fi int, gpu int, l compatLabels) {
		x := xids[gpu]
		if x == nil {
			x = &gpuXIDs{}
		}
		switch r.plan.families[fi].kind {
		case kindXIDLast:
			code := 0
			if last := lastXID[gpu]; last != nil {
				code = last.Code
			}
			// err_msg is never empty; err_code "0" before any XID.
			emit(fi, float64(code), l.add("err_code", strconv.Itoa(code)).add("err_msg", xidMessage(code)))
		case kindXIDWindow:
			// dcgm-exporter: one series per XID of the window, and one 0
			// without xid when the window holds none.
			wl := l.add(xidWindowLabel, r.windowLabel)
			w := x.window
			if len(w) == 0 {
				emit(fi, 0, wl)
			}
			for _, c := range w {
				emit(fi, float64(c.n), wl.add(xidLabel, strconv.Itoa(c.code)))
			}
		case kindXIDTotal:
			// Only the XIDs seen, none for 0 (no error).
			for _, c := range x.total {
				emit(fi, float64(c.n), l.add(xidLabel, strconv.Itoa(c.code)))
			}
		}
	}
	upGPUs := 0
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if !g.Up {
			// A GPU that does not answer (fallen off the bus: XID 79) keeps
			// its XID series, under the labels it had, while it is lost:
			// the alerts on DCGM_FI_DEV_XID_ERRORS and the XID counts see
			// the XID that took it. Its other values are unknown, so absent.
			for fi := range r.plan.families {
				if r.plan.families[fi].fromXIDs() {
					for _, l := range r.lost[g.GPU] {
						xidSeries(fi, g.GPU, l)
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
				case f.fromXIDs():
					for _, l := range ds.labels {
						xidSeries(fi, g.GPU, l)
					}
				case f.field.perPod != nil && ds.perPod != nil:
					// dcgm-exporter's --kubernetes-virtual-gpus: the
					// device's own value without holder labels, and each
					// holder's pod's own figure.
					v, ok := f.field.value(c)
					if !ok {
						continue
					}
					emit(fi, f.unit.convert(v), ds.base)
					for _, ps := range ds.perPod {
						if pv, ok := f.field.perPod(ps.use); ok {
							emit(fi, f.unit.convert(pv), ps.labels)
						}
					}
				default:
					if v, ok := f.field.value(c); ok {
						for _, l := range ds.labels {
							emit(fi, f.unit.convert(v), l)
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
	ch <- prometheus.MustNewConstMetric(compatFieldsDesc, prometheus.GaugeValue, float64(len(r.plan.unknown)), compatFieldsUnknown)
	if upGPUs > 0 && !slices.Equal(noValue, r.noValue) {
		r.noValue = noValue
		if len(noValue) > 0 {
			var why []string
			for fi, ok := range served {
				if f := r.plan.families[fi]; !ok && f.kind == kindField && f.field.needs != "" {
					why = append(why, f.name+": needs "+f.field.needs)
				}
			}
			r.log.Info().Str("counters", r.cfg.Counters.Source).Strs("fields", why).
				Msg("the counters file lists DCGM fields no GPU of this node gives now: they are left out until one does (gpu_exporter_compat_fields{state=\"no_value\"})")
		}
	}
}

// Label names of dcgm-exporter's XID count families.
const (
	xidLabel       = "xid"
	xidWindowLabel = "window_size_in_ms"
)

// xidCount is the number of XIDs of one code.
type xidCount struct{ code, n int }

// gpuXIDs are one GPU's XIDs: those of DCGM_EXP_XID_ERRORS_COUNT's window
// and DCGM_EXP_XID_ERRORS_TOTAL's since the start, by code.
type gpuXIDs struct{ window, total []xidCount }

// xidCounts are the XIDs of each GPU (by index) for the XID count
// families, when the counters file lists one. The window ends at the
// sample's time: as dcgm-exporter's, it counts every XID recorded in the
// last window; the total counts every XID but 0 (no error) since the
// exporter started, as dcgm-exporter's does since its start.
func (r *compatRenderer) xidCounts(st *state.State) map[int]*gpuXIDs {
	out := map[int]*gpuXIDs{}
	get := func(gpu int) *gpuXIDs {
		x := out[gpu]
		if x == nil {
			x = &gpuXIDs{}
			out[gpu] = x
		}
		return x
	}
	for _, c := range st.XIDs {
		if c.Code != 0 && c.Total > 0 {
			x := get(c.GPU)
			x.total = append(x.total, xidCount{c.Code, int(c.Total)})
		}
	}
	since := st.Sample.Time.Add(-r.cfg.XIDCountWindow)
	window := map[[2]int]int{}
	for _, e := range st.XIDRecent {
		if !e.At.Before(since) {
			window[[2]int{e.GPU, e.Code}]++
		}
	}
	for k, n := range window {
		x := get(k[0])
		x.window = append(x.window, xidCount{k[1], n})
	}
	for _, x := range out {
		for _, l := range [][]xidCount{x.window, x.total} {
			slices.SortFunc(l, func(a, b xidCount) int { return cmp.Compare(a.code, b.code) })
		}
	}
	return out
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

// podMemoryBytes is a pod's DCGM_FI_DEV_FB_USED: its processes' whole MiB
// (as DCGM reports each), in bytes.
func podMemoryBytes(u *podUse) (float64, bool) { return u.memoryMiB * mib, u.memoryKnown }

// podSMRatio is a pod's DCGM_FI_DEV_GPU_UTIL: its processes' SM
// utilisation, in the whole percent NVML samples it, as a ratio.
func podSMRatio(u *podUse) (float64, bool) { return math.Round(u.sm*100) / 100, u.smKnown }

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
			if !r.cfg.VirtualGPUs && len(hs) > 1 && !r.draHeld(st, units, hs[0]) {
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
			if r.cfg.DRA {
				l = r.draLabels(st, units, h, l)
			}
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

// dcgm-exporter's DRA labels (internal/pkg/transformation/const.go).
const (
	draClaimNameLabel      = "dra_claim_name"
	draClaimNamespaceLabel = "dra_claim_namespace"
	draDriverNameLabel     = "dra_driver_name"
	draPoolNameLabel       = "dra_pool_name"
	draDeviceNameLabel     = "dra_device_name"
	draMIGProfileLabel     = "dra_mig_profile"
	draMIGDeviceUUIDLabel  = "dra_mig_device_uuid"
)

// draHeld says whether h holds one of the units through a DRA claim.
func (r *compatRenderer) draHeld(st *state.State, units []sample.UnitKey, h state.Holder) bool {
	if !r.cfg.DRA {
		return false
	}
	for _, k := range units {
		if len(st.Allocations.Claims[state.HolderOn{Holder: h, Key: k}]) > 0 {
			return true
		}
	}
	return false
}

// draLabels adds, to the labels of a holder through a DRA claim, the
// claim's dra_* labels as dcgm-exporter's --kubernetes-enable-dra does:
// claim name and namespace, driver, pool and device from the kubelet, and
// on a MIG device its profile and MIG UUID (dcgm-exporter reads them from
// the ResourceSlice; NVML names them here, so a dynamic MIG device, which
// has no UUID in its slice, has them too). A holder through a device
// plugin keeps l.
func (r *compatRenderer) draLabels(st *state.State, units []sample.UnitKey, h state.Holder, l compatLabels) compatLabels {
	for _, k := range units {
		cs := st.Allocations.Claims[state.HolderOn{Holder: h, Key: k}]
		if len(cs) == 0 {
			continue
		}
		c := cs[0]
		l = l.add(draClaimNameLabel, c.ClaimName).add(draClaimNamespaceLabel, c.ClaimNamespace).
			add(draDriverNameLabel, c.Driver).add(draPoolNameLabel, c.Pool).add(draDeviceNameLabel, c.Device)
		if k.GPUInstance >= 0 {
			if m := st.Sample.UnitDevice(k); m != nil {
				l = l.add(draMIGProfileLabel, m.MIGProfile).add(draMIGDeviceUUIDLabel, m.MIGUUID)
			}
		}
		return l
	}
	return l
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
var compatLaterLabels = []string{"err_code", "err_msg", podUIDLabel, vgpuLabel, xidLabel, xidWindowLabel,
	draClaimNameLabel, draClaimNamespaceLabel, draDriverNameLabel, draPoolNameLabel, draDeviceNameLabel, draMIGProfileLabel, draMIGDeviceUUIDLabel}

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
