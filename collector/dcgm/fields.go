package dcgm

import "math"

// Field is one DCGM value the sampler reads per device (whole GPU, MIG GPU
// instance or MIG compute instance, as far as DCGM measures it there: see
// Level). The ratio fields are DCGM profiling (DCP) metrics in 0-1; the
// PCIe and NVLink fields are byte counters that the sampler integrates from
// DCGM's byte rates (see PCIeTxBytes).
type Field int

// The fields, with the DCGM field IDs they come from (checked against
// go-dcgm's const_fields.go; DCGM 4 renamed the *_ACTIVE names to
// *_UTIL_RATIO and kept the old names as aliases with the same IDs).
const (
	// GraphicsActive is DCGM_FI_PROF_GR_ENGINE_ACTIVE (1001): ratio of time
	// the graphics or compute engine was active.
	GraphicsActive Field = iota
	// SMActive is DCGM_FI_PROF_SM_ACTIVE (1002): ratio of cycles an SM had at
	// least one warp assigned, averaged over all SMs.
	SMActive
	// SMOccupancy is DCGM_FI_PROF_SM_OCCUPANCY (1003): ratio of resident
	// warps to the maximum, averaged over all SMs.
	SMOccupancy
	// TensorActive is DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (1004): ratio of
	// cycles a tensor pipe was active.
	TensorActive
	// DRAMActive is DCGM_FI_PROF_DRAM_ACTIVE (1005): ratio of cycles the
	// device memory interface was sending or receiving data.
	DRAMActive
	// FP64Active is DCGM_FI_PROF_PIPE_FP64_ACTIVE (1006).
	FP64Active
	// FP32Active is DCGM_FI_PROF_PIPE_FP32_ACTIVE (1007).
	FP32Active
	// FP16Active is DCGM_FI_PROF_PIPE_FP16_ACTIVE (1008).
	FP16Active
	// PCIeTxBytes comes from DCGM_FI_PROF_PCIE_TX_BYTES (1009), which DCGM
	// reports as a rate in bytes per second (header and payload, from the
	// GPU's side: device to host). The sampler integrates the rate over the
	// time between two DCGM samples of the same device (rate x delta of
	// DCGM's own timestamps) into a monotonically increasing byte counter
	// that starts at 0 when the sampler first sees the device and survives
	// reconnects; that counter is the value, served as a _bytes_total
	// counter. A gap longer than MaxMissed intervals is not integrated
	// (the traffic in it is unknown), so the counter never jumps.
	PCIeTxBytes
	// PCIeRxBytes is DCGM_FI_PROF_PCIE_RX_BYTES (1010), integrated like
	// PCIeTxBytes (host to device).
	PCIeRxBytes
	// NVLinkTxBytes is DCGM_FI_PROF_NVLINK_TX_BYTES (1011, all links),
	// integrated like PCIeTxBytes.
	NVLinkTxBytes
	// NVLinkRxBytes is DCGM_FI_PROF_NVLINK_RX_BYTES (1012, all links),
	// integrated like PCIeTxBytes.
	NVLinkRxBytes

	// NumFields is the number of fields.
	NumFields int = iota
)

// DCGM field IDs. They are plain numbers here so that the sampler and the
// fake do not depend on the DCGM library; a cgo test checks them against
// go-dcgm's constants.
const (
	FieldIDGrEngineActive uint16 = 1001
	FieldIDSMActive       uint16 = 1002
	FieldIDSMOccupancy    uint16 = 1003
	FieldIDTensorActive   uint16 = 1004
	FieldIDDRAMActive     uint16 = 1005
	FieldIDFP64Active     uint16 = 1006
	FieldIDFP32Active     uint16 = 1007
	FieldIDFP16Active     uint16 = 1008
	FieldIDPCIeTxBytes    uint16 = 1009
	FieldIDPCIeRxBytes    uint16 = 1010
	FieldIDNVLinkTxBytes  uint16 = 1011
	FieldIDNVLinkRxBytes  uint16 = 1012
	FieldIDXIDErrors      uint16 = 230 // DCGM_FI_DEV_XID_ERRORS: the last XID, timestamped when it happened
	FieldIDGPUUUID        uint16 = 54  // DCGM_FI_DEV_UUID
	FieldIDNVMLIndex      uint16 = 52  // DCGM_FI_DEV_NVML_INDEX
	fieldIDNone           uint16 = 0
)

var fieldIDs = [NumFields]uint16{
	GraphicsActive: FieldIDGrEngineActive,
	SMActive:       FieldIDSMActive,
	SMOccupancy:    FieldIDSMOccupancy,
	TensorActive:   FieldIDTensorActive,
	DRAMActive:     FieldIDDRAMActive,
	FP64Active:     FieldIDFP64Active,
	FP32Active:     FieldIDFP32Active,
	FP16Active:     FieldIDFP16Active,
	PCIeTxBytes:    FieldIDPCIeTxBytes,
	PCIeRxBytes:    FieldIDPCIeRxBytes,
	NVLinkTxBytes:  FieldIDNVLinkTxBytes,
	NVLinkRxBytes:  FieldIDNVLinkRxBytes,
}

var fieldNames = [NumFields]string{
	GraphicsActive: "graphics_active",
	SMActive:       "sm_active",
	SMOccupancy:    "sm_occupancy",
	TensorActive:   "tensor_active",
	DRAMActive:     "dram_active",
	FP64Active:     "fp64_active",
	FP32Active:     "fp32_active",
	FP16Active:     "fp16_active",
	PCIeTxBytes:    "pcie_transmit_bytes",
	PCIeRxBytes:    "pcie_receive_bytes",
	NVLinkTxBytes:  "nvlink_transmit_bytes",
	NVLinkRxBytes:  "nvlink_receive_bytes",
}

// ID returns the DCGM field ID the field is read from.
func (f Field) ID() uint16 {
	if f < 0 || int(f) >= NumFields {
		return fieldIDNone
	}
	return fieldIDs[f]
}

// String returns a short snake_case name ("sm_active").
func (f Field) String() string {
	if f < 0 || int(f) >= NumFields {
		return "unknown"
	}
	return fieldNames[f]
}

// IsCounter reports whether the field's value is a monotonically increasing
// byte counter (integrated from a DCGM rate) rather than a 0-1 ratio.
func (f Field) IsCounter() bool {
	return f >= PCIeTxBytes && f <= NVLinkRxBytes
}

// fieldLevels is the finest entity DCGM measures each field for: the
// entity level of DCGM's field metadata (dcgmlib/src/dcgm_fields.cpp, DCGM
// 4.x). The engine and pipe ratios are measured per compute instance, the
// DRAM ratio per GPU instance (the compute instances of a GPU instance share
// its memory), the PCIe and NVLink bytes per GPU only. DCGM answers a field
// watched on a finer entity with no data (DCGM_ST_NO_DATA), or on older
// profiling back-ends with the value of the entity above it.
var fieldLevels = [NumFields]EntityKind{
	GraphicsActive: EntityComputeInstance,
	SMActive:       EntityComputeInstance,
	SMOccupancy:    EntityComputeInstance,
	TensorActive:   EntityComputeInstance,
	DRAMActive:     EntityGPUInstance,
	FP64Active:     EntityComputeInstance,
	FP32Active:     EntityComputeInstance,
	FP16Active:     EntityComputeInstance,
	PCIeTxBytes:    EntityGPU,
	PCIeRxBytes:    EntityGPU,
	NVLinkTxBytes:  EntityGPU,
	NVLinkRxBytes:  EntityGPU,
}

// Level returns the finest entity DCGM measures the field for.
func (f Field) Level() EntityKind {
	if f < 0 || int(f) >= NumFields {
		return EntityGPU
	}
	return fieldLevels[f]
}

// MeasuredFor reports whether DCGM measures the field for entities of kind
// k itself, rather than for an entity that holds them: a value of a field
// read from a finer entity than its level is its parent's, and is never
// taken (it would count the parent once per child).
func (f Field) MeasuredFor(k EntityKind) bool {
	return k <= f.Level()
}

// Fields returns all fields in order.
func Fields() []Field {
	out := make([]Field, NumFields)
	for i := range out {
		out[i] = Field(i)
	}
	return out
}

// FieldByID maps a DCGM field ID to a Field.
func FieldByID(id uint16) (Field, bool) {
	for f, fid := range fieldIDs {
		if fid == id {
			return Field(f), true
		}
	}
	return 0, false
}

// DCGM's sentinel values (dcgm_structs.h, mirrored in go-dcgm's const.go):
// a value at or above the blank of its type means "no data": blank, not
// found, not supported or not permissioned. They are never exported.
const (
	Int32Blank = int64(0x7ffffff0)         // DCGM_FT_INT32_BLANK
	Int64Blank = int64(0x7ffffffffffffff0) // DCGM_FT_INT64_BLANK
	FP64Blank  = 140737488355328.0         // DCGM_FT_FP64_BLANK (2^47)

	// Int64NotSupported and FP64NotSupported are what DCGM puts in a value
	// whose field the device does not support.
	Int64NotSupported = Int64Blank + 2 // DCGM_FT_INT64_NOT_SUPPORTED
	FP64NotSupported  = FP64Blank + 2  // DCGM_FT_FP64_NOT_SUPPORTED
)

// DCGM field value types (dcgm_fields.h).
const (
	FieldTypeDouble byte = 'd' // DCGM_FT_DOUBLE
	FieldTypeInt64  byte = 'i' // DCGM_FT_INT64
	FieldTypeString byte = 's' // DCGM_FT_STRING
)

// DCGM return codes the sampler distinguishes (dcgm_structs.h).
const (
	StatusOK                    = 0
	StatusNotSupported          = -6
	StatusNoData                = -14
	StatusNotWatched            = -16
	StatusConnectionNotValid    = -21
	StatusProfilingNotSupported = -36
)

// isBlankFloat reports whether a double is one of DCGM's sentinels (or not a
// number at all).
func isBlankFloat(v float64) bool {
	return v >= FP64Blank || math.IsNaN(v) || math.IsInf(v, 0)
}

// isBlankInt reports whether an int64 value is one of DCGM's 64-bit
// sentinels. DCGM returns every integer field through an int64 value
// (DCGM_FT_INT64) and fills an empty one with the 64-bit sentinels; the
// 32-bit ones (Int32Blank) would be legitimate rates for the byte fields
// (0x7ffffff0 B/s is 2.1 GB/s), so they are not checked here.
func isBlankInt(v int64) bool {
	return v >= Int64Blank
}

// HealthSystem names, as exported in gpu_dcgm_health{system=...}.
const (
	HealthPCIe    = "pcie"
	HealthMemory  = "memory"
	HealthInforom = "inforom"
	HealthThermal = "thermal"
	HealthPower   = "power"
	HealthNVLink  = "nvlink"
	HealthDriver  = "driver"
)

// HealthSystems lists the systems the sampler watches, in order.
var HealthSystems = []string{HealthPCIe, HealthMemory, HealthInforom, HealthThermal, HealthPower, HealthNVLink, HealthDriver}

// Health results, as exported in gpu_dcgm_health{status=...}.
const (
	HealthPass = "pass"
	HealthWarn = "warn"
	HealthFail = "fail"
)

func healthRank(s string) int {
	switch s {
	case HealthFail:
		return 2
	case HealthWarn:
		return 1
	}
	return 0
}
