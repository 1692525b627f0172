package sample

// Field is one per-device value slot. NVML fills most of them; DCGM's
// profiling fields are merged into the same record before rendering, and
// collector/render's fieldSpecs names every field's metric and source.
type Field int

// The per-device fields. Sources are named in collector/render's fieldSpecs and in docs/metrics.md.
const (
	FieldMemoryUsed Field = iota
	FieldMemoryTotal
	FieldUtilization
	FieldMemoryUtilization
	FieldTemperature
	FieldPower
	FieldEnergy
	FieldSMClock
	FieldMemoryClock
	FieldPCIeLinkGeneration
	FieldPCIeLinkWidth
	FieldPowerLimit
	FieldSlowdownTemperature
	FieldShutdownTemperature
	// DCGM profiling fields.
	FieldSMActive
	FieldSMOccupancy
	FieldTensorActive
	FieldDRAMActive
	FieldGraphicsActive
	FieldFP64Active
	FieldFP32Active
	FieldFP16Active
	FieldPCIeTxBytes
	FieldPCIeRxBytes
	FieldNVLinkTxBytes
	FieldNVLinkRxBytes
	// NVML fields served for dcgm-exporter parity too.
	FieldMemoryTemperature  // NVML_FI_DEV_MEMORY_TEMP, degrees Celsius
	FieldEncoderUtilization // nvmlDeviceGetEncoderUtilization, 0-1
	FieldDecoderUtilization // nvmlDeviceGetDecoderUtilization, 0-1
	FieldMemoryReserved     // nvmlDeviceGetMemoryInfo_v2 reserved, bytes
	// NumFields is the number of fields.
	NumFields
)

// Values holds the fields read for one device in one sample. A field that is
// not set (not supported, or failed) is not exported.
type Values struct {
	v   [NumFields]float64
	set [NumFields]bool
}

// Set records a field's value.
func (v *Values) Set(f Field, x float64) { v.v[f], v.set[f] = x, true }

// Get returns a field's value and whether it was read.
func (v *Values) Get(f Field) (float64, bool) { return v.v[f], v.set[f] }

// Clear forgets a field.
func (v *Values) Clear(f Field) { v.v[f], v.set[f] = 0, false }
