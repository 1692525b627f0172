package state

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// Fault kinds: what takes a GPU out of service until someone resets,
// reboots or replaces it (the critical alerts' faults: GPUXIDResetRequired,
// GPUXIDNodeRebootRequired, GPULost, GPURowRemapFailed,
// GPURecoveryActionRequired).
const (
	// FaultXID: an XID whose catalog action is reset_gpu, reboot_node or
	// restart_vm, not followed by a reset of the GPU.
	FaultXID = "xid"
	// FaultLost: NVML answers the GPU with an error (fallen off the bus,
	// GPU_IS_LOST).
	FaultLost = "lost"
	// FaultHung: NVML calls on the GPU do not return (hung in the driver).
	FaultHung = "hung"
	// FaultRowRemapFailed: row remapping failed, no spare rows left.
	FaultRowRemapFailed = "row_remap_failed"
	// FaultRecoveryAction: NVML asks for a recovery action (XID 154).
	FaultRecoveryAction = "recovery_action"
)

// Fault is one fatal fault of one GPU in one sample.
type Fault struct {
	GPU  int
	UUID string
	Kind string
	// XID is the code and its catalog entry (FaultXID); MIGUUID and
	// GPUInstance name the MIG device NVML attributed it to ("" and -1:
	// the whole GPU).
	XID         xid.Entry
	MIGUUID     string
	GPUInstance int
	// Action is the recovery action NVML asks for (FaultRecoveryAction),
	// by name.
	Action string
	// Since is the XID's time (FaultXID); zero for the others.
	Since time.Time
}

// Reason is the fault as a Kubernetes condition reason (UpperCamelCase,
// no spaces): the GPU's index and the fault, e.g. GPU1Xid79,
// GPU3RowRemapFailed.
func (f Fault) Reason() string {
	p := "GPU" + strconv.Itoa(f.GPU)
	switch f.Kind {
	case FaultXID:
		return p + "Xid" + strconv.Itoa(f.XID.Code)
	case FaultLost:
		return p + "Lost"
	case FaultHung:
		return p + "Hung"
	case FaultRowRemapFailed:
		return p + "RowRemapFailed"
	case FaultRecoveryAction:
		return p + "RecoveryAction" + camel(f.Action)
	}
	return p + camel(f.Kind)
}

// Message says which GPU, its UUID, the fault and what to do, in one line.
func (f Fault) Message() string {
	where := fmt.Sprintf("GPU %d (%s)", f.GPU, f.UUID)
	switch f.Kind {
	case FaultXID:
		on := ""
		if f.MIGUUID != "" {
			on = fmt.Sprintf(" on MIG device %s (GPU instance %d)", f.MIGUUID, f.GPUInstance)
		}
		return fmt.Sprintf("%s: XID %d (%s)%s at %s, not followed by a GPU reset: %s", where, f.XID.Code, f.XID.Name, on,
			f.Since.UTC().Format(time.RFC3339), actionAdvice(f.XID.Action))
	case FaultLost:
		return where + ": lost, NVML answers it with an error (fallen off the bus?): reboot the node"
	case FaultHung:
		return where + ": hung in the driver, NVML calls on it do not return: reset the GPU or reboot the node"
	case FaultRowRemapFailed:
		return where + ": row remapping failed, no spare memory rows left: replace the GPU"
	case FaultRecoveryAction:
		return where + ": NVML asks for the recovery action " + f.Action
	}
	return where + ": " + f.Kind
}

func actionAdvice(action string) string {
	switch action {
	case xid.ActionResetGPU:
		return "reset the GPU"
	case xid.ActionRebootNode:
		return "reboot the node"
	case xid.ActionRestartVM:
		return "restart the VM"
	}
	return action
}

// camel turns gpu_reset into GpuReset.
func camel(s string) string {
	var b strings.Builder
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == '_' || r == '-' || r == ' ' }) {
		b.WriteString(strings.ToUpper(p[:1]) + p[1:])
	}
	return b.String()
}

// fatalXID reports whether an XID's catalog action takes the GPU out of
// service until a reset or reboot.
func fatalXID(e xid.Entry) bool {
	switch e.Action {
	case xid.ActionResetGPU, xid.ActionRebootNode, xid.ActionRestartVM:
		return true
	}
	return false
}

func recoveryActionName(v int) string {
	for _, a := range sample.RecoveryActions {
		if int(a.Value) == v {
			return a.Name
		}
	}
	return "code_" + strconv.Itoa(v)
}
