package state

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// CollectorStatus is the health of one part of the exporter in one sample.
type CollectorStatus struct {
	Name     string
	Up       bool
	Duration time.Duration
}

// State is everything one render shows: one sample joined with who holds
// which device, what each container uses, the derived gauges and the XID
// counts. It is not changed once Join returns it.
type State struct {
	Sample *sample.NodeSample
	// Units are the sample's schedulable units (sample.NodeSample.Units),
	// listed once per sample for every part that goes over them.
	Units       []sample.Unit
	Allocations *Allocations
	// PodMeta are the UIDs and labels of the pods holding devices, from the
	// API server; nil when not asked for.
	PodMeta map[PodRef]podmap.PodMeta
	XIDs    []xid.Count
	XIDLast []xid.DeviceLast
	// XIDRecent are the XID events the counter keeps the times of
	// (Counter.KeepEvents): dcgm-exporter's windowed XID count.
	XIDRecent []xid.RecentEvent
	// XIDOn: an XID reader runs (XIDUp: its set works). XIDCoverage says
	// which GPUs are registered for events (nil where the source cannot
	// tell); XIDUncoveredSeconds is how long no event set was open.
	XIDOn, XIDUp        bool
	XIDCoverage         []xid.Coverage
	XIDUncoveredSeconds float64
	// XIDInstances are the XIDs NVML attributed to MIG devices, as served
	// (spreadInstanceXIDs): one NVML attributed to a GPU instance but to
	// none of its compute instances is on each compute instance of it.
	XIDInstances []xid.InstanceCount
	// XIDEventsSupported is nil without an XID reader; false when the
	// node's boards do not support NVML events (nothing to watch: the xid
	// collector is then not applicable rather than down).
	XIDEventsSupported *bool
	// ECCEvents are the ECC error events per GPU, by sample GPU position,
	// with whether the GPU was registered for each type.
	ECCEvents []xid.ECCEventCount
	// ECCUncorrectedGrew lists the GPUs whose uncorrected ECC count grew
	// while the exporter ran.
	ECCUncorrectedGrew []ECCIncrease
	Derived            *Derived
	// Usage is per-container use from process accounting; nil when off.
	Usage      *Usage
	Collectors []CollectorStatus
	// Faults are the GPUs' fatal faults in this sample (Fault), sorted by
	// GPU: what the node condition reports.
	Faults []Fault
	// LastGood is, per GPU, the time of its last successful read.
	LastGood []time.Time
	// LastAnswer is, per GPU, the time NVML last answered at all (a lost
	// GPU answers with an error; a hung one does not answer).
	LastAnswer []time.Time
	Rendered   time.Time
}
