package state

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// Config says what a Joiner joins a sample with; a source left nil is off.
type Config struct {
	Log zerolog.Logger
	// Now is the clock of the unmatched-ID log; nil is time.Now.
	Now func() time.Time
	// Pods, when set, maps devices to the pods holding them.
	Pods PodSource
	// PodMeta, when set, gives the holders' pod UIDs and labels from the
	// API server.
	PodMeta PodMetaSource
	// XID, when set, counts XID events (its Run is the caller's to start).
	XID *xid.Reader
	// DCGM, when set, adds DCGM's profiling fields and health watches.
	DCGM DCGMSource
	// Processes, when set, maps the processes NVML lists to containers:
	// per-container use of shared devices.
	Processes *procs.Resolver
	// Derived configures idle allocations, prices and fragmentation; the
	// zero value uses the defaults.
	Derived DerivedConfig
	// Reporters add the status of parts that run beside the sample (the
	// node condition's writer) to each sample's collectors.
	Reporters []StatusReporter
	// Slices, when set, gives the devices of this node's DRA
	// ResourceSlices: their taints are joined onto the sample's devices.
	Slices SliceSource
}

// StatusReporter is a part of the exporter whose health shows as a
// collector (gpu_exporter_collector_up).
type StatusReporter interface {
	CollectorStatus() CollectorStatus
}

// Joiner joins each sample with the other sources into a State. It
// remembers what spans samples (idle windows, each GPU's last good read,
// ECC counts, what was logged); Join is called one sample at a time.
type Joiner struct {
	cfg       Config
	idle      *fragmentation.IdleTracker
	unmatched *podmap.UnmatchedLogger
	ecc       eccWatch
	lastGood  []time.Time
	lastAns   []time.Time
	// procsWarned: the proc-root warning was logged.
	procsWarned bool
	// procRootDown: the proc root could not be read at the last sample.
	procRootDown bool
	// faults remembers the GPU resets that clear fatal XIDs.
	faults faultTracker
	// gpuByUUID maps the physical GPUs' UUIDs to their NVML indexes, as of
	// the last sample: the XIDs DCGM hands over are placed by UUID, as
	// DCGM's own GPU numbering need not be NVML's.
	gpuByUUID atomic.Pointer[map[string]int]
}

// NewJoiner builds a Joiner, and connects a DCGM source that records XIDs
// to the XID reader.
func NewJoiner(cfg Config) (*Joiner, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Derived = cfg.Derived.withDefaults()
	idle, err := fragmentation.NewIdleTracker(cfg.Derived.Idle)
	if err != nil {
		return nil, err
	}
	j := &Joiner{cfg: cfg, idle: idle, unmatched: podmap.NewUnmatchedLogger(cfg.Log, 0)}
	j.unmatched.Now = cfg.Now
	if sink, ok := cfg.DCGM.(XIDSink); ok && cfg.XID != nil {
		counter := cfg.XID.Counter()
		sink.SetXIDSink(func(gpu int, uuid string, code int, at time.Time) {
			if m := j.gpuByUUID.Load(); m != nil && uuid != "" {
				if i, ok := (*m)[uuid]; ok {
					gpu = i
				}
			}
			counter.AddFrom(xid.SourceDCGM, gpu, uuid, code, at)
		})
	}
	return j, nil
}

// Join joins one sample, taken at now, with DCGM's values, the pod map,
// the processes, the derived gauges and the XID counts. DCGM's values are
// merged into the sample itself before anything else reads it.
func (j *Joiner) Join(ctx context.Context, s *sample.NodeSample, now time.Time) *State {
	if len(j.lastGood) != len(s.GPUs) {
		j.lastGood = make([]time.Time, len(s.GPUs))
		j.lastAns = make([]time.Time, len(s.GPUs))
	}
	j.noteGPUIndexes(s)
	for i, g := range s.GPUs {
		if g.Up {
			j.lastGood[i] = s.Time
		}
		if !g.Hung {
			j.lastAns[i] = s.Time
		}
	}
	st := &State{
		Sample:      s,
		Collectors:  []CollectorStatus{{Name: "nvml", Up: s.AnyUp() && s.NVML.Down == "", Duration: s.Duration}},
		LastGood:    append([]time.Time(nil), j.lastGood...),
		LastAnswer:  append([]time.Time(nil), j.lastAns...),
		Rendered:    now,
		Allocations: &Allocations{},
	}
	if j.cfg.DCGM != nil {
		snap := j.cfg.DCGM.Snapshot()
		mergeDCGM(snap, s)
		if cs, ok := dcgmStatus(snap); ok {
			st.Collectors = append(st.Collectors, cs)
		}
	}
	st.ECCUncorrectedGrew = j.ecc.observe(s)
	if j.cfg.Slices != nil {
		devs, synced, lastErr := j.cfg.Slices.Devices()
		joinDeviceTaints(s, devs)
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "dra_slices", Up: synced && lastErr == ""})
	}
	st.Units = s.Units()
	if j.cfg.Pods != nil {
		st.Allocations = resolveAllocations(j.cfg.Pods.Snapshot(), s, st.Units, now, j.unmatched)
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "podmap", Up: st.Allocations.Up, Duration: st.Allocations.Duration})
	}
	if j.cfg.PodMeta != nil {
		st.PodMeta = holdersMeta(j.cfg.PodMeta, st.Allocations)
	}
	if j.cfg.Processes != nil {
		st.Usage = attributeProcesses(ctx, j.cfg.Processes, st.Units, st.Allocations)
		j.logProcesses(st.Usage)
		st.Collectors = append(st.Collectors, CollectorStatus{Name: "processes", Up: st.Usage.IdentityErr == "" && st.Usage.RootErr == "", Duration: st.Usage.Duration})
	}
	st.Derived = computeDerived(&j.cfg.Derived, j.idle, s, st.Units, st.Allocations, st.Usage, s.Time)
	if j.cfg.XID != nil {
		joinXIDs(st, j.cfg.XID)
	}
	st.Faults = j.faults.faults(st)
	for _, r := range j.cfg.Reporters {
		st.Collectors = append(st.Collectors, r.CollectorStatus())
	}
	return st
}

// logProcesses says when process accounting cannot see the host's
// processes, and when it can again.
func (j *Joiner) logProcesses(u *Usage) {
	// Every PID missing is a proc root that is not the host's, not
	// processes that happened to exit: say so once.
	lost := u.RootErr == "" && u.PIDs > 0 && u.NotFound == u.PIDs
	if lost && !j.procsWarned {
		j.cfg.Log.Warn().Int("pids", u.PIDs).Msg("none of the PIDs NVML reports is in the proc root: mount the host's /proc (read-only hostPath) and pass --procs.proc-root; until then every GPU process counts as outside pods")
	}
	j.procsWarned = lost
	switch unreadable := u.RootErr != ""; {
	case unreadable && !j.procRootDown:
		j.cfg.Log.Error().Str("error", u.RootErr).Msg("process accounting is down: the proc root cannot be read, so no per-container or outside-pods figures are served until it can (check the --procs.proc-root mount)")
	case !unreadable && j.procRootDown:
		j.cfg.Log.Info().Msg("process accounting is back: the proc root can be read again")
	}
	j.procRootDown = u.RootErr != ""
}

// noteGPUIndexes updates gpuByUUID when the sample's GPUs differ from it.
func (j *Joiner) noteGPUIndexes(s *sample.NodeSample) {
	if m := j.gpuByUUID.Load(); m != nil {
		same := true
		for i := range s.GPUs {
			if g := &s.GPUs[i]; g.UUID != "" {
				if idx, ok := (*m)[g.UUID]; !ok || idx != g.GPU {
					same = false
					break
				}
			}
		}
		if same {
			return
		}
	}
	m := make(map[string]int, len(s.GPUs))
	for i := range s.GPUs {
		if g := &s.GPUs[i]; g.UUID != "" {
			m[g.UUID] = g.GPU
		}
	}
	j.gpuByUUID.Store(&m)
}

// dcgmStatus is the collector status of DCGM: absent when DCGM is off (auto
// mode without libdcgm is a supported setup, not a failure).
func dcgmStatus(snap *dcgm.Snapshot) (CollectorStatus, bool) {
	if snap == nil || snap.Mode == dcgm.ModeOff {
		return CollectorStatus{}, false
	}
	return CollectorStatus{Name: "dcgm", Up: snap.Up}, true
}
