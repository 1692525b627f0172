//go:build cgo && linux && !nodcgm

package dcgm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	godcgm "github.com/NVIDIA/go-dcgm/pkg/dcgm"
	"github.com/rs/zerolog"
)

// go-dcgm keeps one process-wide handle and a reference count behind Init;
// realMu makes sure this package holds at most one of it.
var (
	realMu   sync.Mutex
	realOpen bool
	groupSeq atomic.Uint64
)

// maxValuesPerQuery bounds entities x fields per dcgmEntitiesGetLatestValues
// call: every value is a 4 KiB C struct, and go-dcgm reuses its buffers only
// up to 256 values, so big MIG nodes are read in chunks rather than with
// one multi-megabyte allocation per sample.
const maxValuesPerQuery = 256

// healthSystems are the DCGM health watches the sampler sets, and their
// names.
var healthSystems = []struct {
	sys  godcgm.HealthSystem
	name string
}{
	{godcgm.DCGM_HEALTH_WATCH_PCIE, HealthPCIe},
	{godcgm.DCGM_HEALTH_WATCH_MEM, HealthMemory},
	{godcgm.DCGM_HEALTH_WATCH_INFOROM, HealthInforom},
	{godcgm.DCGM_HEALTH_WATCH_THERMAL, HealthThermal},
	{godcgm.DCGM_HEALTH_WATCH_POWER, HealthPower},
	{godcgm.DCGM_HEALTH_WATCH_NVLINK, HealthNVLink},
	{godcgm.DCGM_HEALTH_WATCH_DRIVER, HealthDriver},
}

func openReal(cfg Config, standalone bool, addr, isSocket string) (c Client, err error) {
	realMu.Lock()
	defer realMu.Unlock()
	if realOpen {
		return nil, ErrBusy
	}
	defer func() {
		// go-dcgm only panics on an invalid mode, but a panic inside cgo
		// set-up must not take the exporter down.
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("DCGM init panicked: %v", r)
		}
	}()
	if standalone {
		_, err = godcgm.Init(godcgm.Standalone, addr, isSocket)
	} else {
		_, err = godcgm.Init(godcgm.Embedded)
	}
	if err != nil {
		return nil, classifyInitError(err, standalone, addr)
	}
	realOpen = true
	return &realClient{log: cfg.Log}, nil
}

func classifyInitError(err error, standalone bool, addr string) error {
	msg := err.Error()
	if strings.Contains(msg, LibraryName) && strings.Contains(msg, "not found") {
		return fmt.Errorf("%w (dlopen failed; install DCGM or add its lib directory to LD_LIBRARY_PATH)", ErrLibraryNotFound)
	}
	if standalone {
		return fmt.Errorf("DCGM standalone %s: %w", addr, err)
	}
	return fmt.Errorf("DCGM embedded: %w", err)
}

// realClient is Client over go-dcgm's package functions.
type realClient struct {
	log zerolog.Logger

	watchGroup  godcgm.GroupHandle
	healthGroup godcgm.GroupHandle
	fieldGroups []godcgm.FieldHandle
	hasWatch    bool
	hasHealth   bool
	// ciGroup holds the compute instances, watched for the profiling
	// fields apart from the GPUs and GPU instances: a DCGM that refuses
	// them costs only the per-compute-instance values.
	ciGroup    godcgm.GroupHandle
	hasCIGroup bool

	warnedProfiling bool
	warnedCI        bool
	broken          bool // the connection failed: skip clean-up calls
	closed          bool
}

// check turns a go-dcgm error into ours: connection losses wrap
// ErrConnection and mark the client broken.
func (r *realClient) check(err error, what string) error {
	if err == nil {
		return nil
	}
	if isConnectionError(err) {
		r.broken = true
		return fmt.Errorf("%s: %w: %v", what, ErrConnection, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// isConnectionError classifies by DCGM's return code: the host engine is
// gone (DCGM_ST_CONNECTION_NOT_VALID) or DCGM is not set up any more
// (DCGM_ST_UNINITIALIZED).
func isConnectionError(err error) bool {
	code, ok := returnCode(err)
	return ok && (code == godcgm.DCGM_ST_CONNECTION_NOT_VALID || code == godcgm.DCGM_ST_UNINITIALIZED)
}

// dcgmMessages are the texts of DCGM's errorString() for the return codes
// the exporter acts on (dcgmlib's errorString switch). Most go-dcgm
// functions return fmt errors carrying only that text, possibly after a
// prefix of go-dcgm's; the text is then the only trace of the code.
var dcgmMessages = map[string]int{
	"Host engine connection invalid/disconnected": godcgm.DCGM_ST_CONNECTION_NOT_VALID,
	"Object is in an undefined state":             godcgm.DCGM_ST_UNINITIALIZED,
	"GPU is lost":                                 godcgm.DCGM_ST_GPU_IS_LOST,
	"Feature not supported":                       godcgm.DCGM_ST_NOT_SUPPORTED,
	"This request is serviced by a module of DCGM that is not currently loaded": godcgm.DCGM_ST_MODULE_NOT_LOADED,
}

// returnCode recovers DCGM's return code from a go-dcgm error: the code of
// a *godcgm.Error, else the code whose errorString() text ends the message.
func returnCode(err error) (int, bool) {
	var de *godcgm.Error
	if errors.As(err, &de) {
		return int(de.Code), true
	}
	m := err.Error()
	for msg, code := range dcgmMessages {
		if strings.HasSuffix(m, msg) {
			return code, true
		}
	}
	return 0, false
}

func toEntityKind(g godcgm.Field_Entity_Group) (EntityKind, bool) {
	switch g {
	case godcgm.FE_GPU:
		return EntityGPU, true
	case godcgm.FE_GPU_I:
		return EntityGPUInstance, true
	case godcgm.FE_GPU_CI:
		return EntityComputeInstance, true
	}
	return 0, false
}

func toEntityGroup(k EntityKind) godcgm.Field_Entity_Group {
	switch k {
	case EntityGPUInstance:
		return godcgm.FE_GPU_I
	case EntityComputeInstance:
		return godcgm.FE_GPU_CI
	}
	return godcgm.FE_GPU
}

func isBlankString(s string) bool {
	return s == "" || strings.HasPrefix(s, "<<<")
}

func (r *realClient) Devices() ([]DeviceInfo, error) {
	if r.closed {
		return nil, ErrConnection
	}
	ids, err := godcgm.GetSupportedDevices()
	if err != nil {
		return nil, r.check(err, "list DCGM GPUs")
	}
	var out []DeviceInfo
	index := map[uint]int{}
	for _, id := range ids {
		uuid, idx := r.gpuIdentity(id)
		index[id] = len(out)
		out = append(out, DeviceInfo{Entity: Entity{EntityGPU, id}, GPU: idx, UUID: uuid, GPUInstance: -1, ComputeInstance: -1, Parent: id})
	}
	h, err := godcgm.GetGPUInstanceHierarchy()
	if err != nil {
		if isConnectionError(err) {
			return nil, r.check(err, "read DCGM MIG hierarchy")
		}
		// No MIG support: whole GPUs only.
		r.log.Debug().Err(err).Msg("DCGM MIG hierarchy unavailable")
		return out, nil
	}
	return migDevices(out, index, &h), nil
}

// migDevices adds the GPU and compute instances of DCGM's MIG hierarchy to
// the whole GPUs in out (index: their positions by DCGM GPU ID), in any
// order DCGM lists them.
func migDevices(out []DeviceInfo, index map[uint]int, h *godcgm.MigHierarchy_v2) []DeviceInfo {
	n := min(h.Count, uint(len(h.EntityList)))
	// GPU instances first: a compute instance's parent is its GPU
	// instance, whose parent is the GPU.
	gis := map[uint]DeviceInfo{}
	for i := range n {
		e := h.EntityList[i]
		if e.Entity.EntityGroupId != godcgm.FE_GPU_I {
			continue
		}
		d := DeviceInfo{
			Entity:          Entity{EntityGPUInstance, e.Entity.EntityId},
			GPU:             int(e.Info.NvmlGpuIndex),
			UUID:            e.Info.GpuUuid,
			GPUInstance:     int(e.Info.NvmlInstanceId),
			ComputeInstance: -1,
			Parent:          e.Parent.EntityId,
		}
		gis[e.Entity.EntityId] = d
		if p, ok := index[d.Parent]; ok {
			// The hierarchy knows the NVML index and UUID for sure.
			out[p].GPU = d.GPU
			if out[p].UUID == "" {
				out[p].UUID = d.UUID
			}
		}
		out = append(out, d)
	}
	for i := range n {
		e := h.EntityList[i]
		if e.Entity.EntityGroupId != godcgm.FE_GPU_CI || e.Parent.EntityGroupId != godcgm.FE_GPU_I {
			continue
		}
		gi, ok := gis[e.Parent.EntityId]
		if !ok {
			continue
		}
		// The GPU, UUID and GPU instance are its GPU instance's.
		ci := gi
		ci.Entity = Entity{EntityComputeInstance, e.Entity.EntityId}
		ci.ComputeInstance = int(e.Info.NvmlComputeInstanceId)
		out = append(out, ci)
	}
	return out
}

// gpuIdentity reads a GPU's UUID and NVML index; DCGM's GPU ID stands in
// for the index when DCGM does not give one.
func (r *realClient) gpuIdentity(id uint) (string, int) {
	uuid, idx := "", int(id)
	vals, err := godcgm.EntityGetLatestValues(godcgm.FE_GPU, id, []godcgm.Short{godcgm.Short(FieldIDGPUUUID), godcgm.Short(FieldIDNVMLIndex)})
	if err == nil && len(vals) == 2 {
		if vals[0].Status == StatusOK && vals[0].FieldType == uint(FieldTypeString) {
			if s := vals[0].String(); !isBlankString(s) {
				uuid = s
			}
		}
		if vals[1].Status == StatusOK && vals[1].FieldType == uint(FieldTypeInt64) {
			if v := vals[1].Int64(); v >= 0 && !isBlankInt(v) {
				idx = int(v)
			}
		}
	}
	if uuid == "" {
		if d, err := godcgm.GetDeviceInfo(id); err == nil && !isBlankString(d.UUID) {
			uuid = d.UUID
		}
	}
	return uuid, idx
}

func (r *realClient) unwatch() {
	if r.broken {
		r.fieldGroups, r.hasWatch, r.hasHealth, r.hasCIGroup = nil, false, false, false
		return
	}
	for _, fg := range r.fieldGroups {
		if r.hasWatch {
			_ = godcgm.UnwatchFields(fg, r.watchGroup)
		}
		if r.hasCIGroup {
			_ = godcgm.UnwatchFields(fg, r.ciGroup)
		}
		_ = godcgm.FieldGroupDestroy(fg)
	}
	r.fieldGroups = nil
	if r.hasWatch {
		_ = godcgm.DestroyGroup(r.watchGroup)
		r.hasWatch = false
	}
	if r.hasCIGroup {
		_ = godcgm.DestroyGroup(r.ciGroup)
		r.hasCIGroup = false
	}
	if r.hasHealth {
		_ = godcgm.DestroyGroup(r.healthGroup)
		r.hasHealth = false
	}
}

func groupName(kind string) string {
	return fmt.Sprintf("gpu-pool-exporter-%d-%s-%d", os.Getpid(), kind, groupSeq.Add(1))
}

func (r *realClient) Watch(entities []Entity, fieldIDs []uint16, every, keep time.Duration) error {
	if r.closed {
		return ErrConnection
	}
	r.unwatch()
	if len(entities) == 0 || len(fieldIDs) == 0 {
		return nil
	}
	g, err := godcgm.CreateGroup(groupName("watch"))
	if err != nil {
		return r.check(err, "create DCGM group")
	}
	r.watchGroup, r.hasWatch = g, true
	var gpus []uint
	var cis []Entity
	for _, e := range entities {
		if e.Kind == EntityComputeInstance {
			cis = append(cis, e)
			continue
		}
		if err := godcgm.AddEntityToGroup(g, toEntityGroup(e.Kind), e.ID); err != nil {
			if isConnectionError(err) {
				return r.check(err, "add DCGM entity")
			}
			r.log.Debug().Err(err).Stringer("entity", e).Msg("DCGM entity not added to the watch group")
			continue
		}
		if e.Kind == EntityGPU {
			gpus = append(gpus, e.ID)
		}
	}

	// Device fields (XID) and profiling fields are watched through two
	// field groups: a GPU without profiling support (or with the profiling
	// module held by another client) must not cost the XID watch.
	var dev, prof []godcgm.Short
	for _, id := range fieldIDs {
		if id >= FieldIDGrEngineActive && id <= FieldIDNVLinkRxBytes {
			prof = append(prof, godcgm.Short(id))
		} else {
			dev = append(dev, godcgm.Short(id))
		}
	}
	usec := every.Microseconds()
	if usec <= 0 {
		usec = 1
	}
	keepSec := keep.Seconds()
	var profFG godcgm.FieldHandle
	hasProf := false
	for i, fields := range [][]godcgm.Short{dev, prof} {
		if len(fields) == 0 {
			continue
		}
		kind := "dev"
		if i == 1 {
			kind = "prof"
		}
		fg, err := godcgm.FieldGroupCreate(groupName(kind), fields)
		if err != nil {
			return r.check(err, "create DCGM field group")
		}
		r.fieldGroups = append(r.fieldGroups, fg)
		if i == 1 {
			profFG, hasProf = fg, true
		}
		if err := godcgm.WatchFieldsWithGroupEx(fg, g, usec, keepSec, 0); err != nil {
			if isConnectionError(err) || i == 0 {
				return r.check(err, "watch DCGM fields")
			}
			if !r.warnedProfiling {
				r.warnedProfiling = true
				r.log.Warn().Err(err).Msg("DCGM profiling fields (SM active, occupancy, tensor, DRAM, PCIe/NVLink bytes) not watched; they will be absent")
			}
		}
	}

	if len(cis) > 0 && hasProf {
		if err := r.watchComputeInstances(cis, profFG, usec, keepSec); err != nil {
			return err
		}
	}

	if len(gpus) > 0 {
		hg, err := godcgm.CreateGroup(groupName("health"))
		if err != nil {
			return r.check(err, "create DCGM health group")
		}
		r.healthGroup, r.hasHealth = hg, true
		for _, id := range gpus {
			if err := godcgm.AddToGroup(hg, id); err != nil {
				return r.check(err, "add GPU to DCGM health group")
			}
		}
		var systems godcgm.HealthSystem
		for _, s := range healthSystems {
			systems |= s.sys
		}
		if err := godcgm.HealthSet(hg, systems); err != nil {
			if isConnectionError(err) {
				return r.check(err, "set DCGM health watches")
			}
			r.log.Warn().Err(err).Msg("DCGM health watches not set; gpu_dcgm_health will be absent")
			_ = godcgm.DestroyGroup(hg)
			r.hasHealth = false
		}
	}
	return nil
}

// watchComputeInstances watches the profiling fields on the compute
// instances, in a group of their own. Only a lost connection is an error:
// a DCGM that will not watch them leaves the compute instances of split GPU
// instances without DCGM values (one log line), the rest unharmed.
func (r *realClient) watchComputeInstances(cis []Entity, fg godcgm.FieldHandle, usec int64, keepSec float64) error {
	g, err := godcgm.CreateGroup(groupName("ci"))
	if err != nil {
		return r.check(err, "create DCGM compute instance group")
	}
	r.ciGroup, r.hasCIGroup = g, true
	for _, e := range cis {
		if err := godcgm.AddEntityToGroup(g, godcgm.FE_GPU_CI, e.ID); err != nil {
			if isConnectionError(err) {
				return r.check(err, "add DCGM compute instance")
			}
			r.log.Debug().Err(err).Stringer("entity", e).Msg("DCGM compute instance not added to the watch group")
		}
	}
	if err := godcgm.WatchFieldsWithGroupEx(fg, g, usec, keepSec, 0); err != nil {
		if isConnectionError(err) {
			return r.check(err, "watch DCGM fields on compute instances")
		}
		if !r.warnedCI {
			r.warnedCI = true
			r.log.Info().Err(err).Msg("DCGM does not watch profiling fields per compute instance; compute instances of GPU instances split in several get no DCGM values")
		}
	}
	return nil
}

func (r *realClient) Latest(entities []Entity, fieldIDs []uint16) ([]RawValue, error) {
	if r.closed {
		return nil, ErrConnection
	}
	if len(entities) == 0 || len(fieldIDs) == 0 {
		return nil, nil
	}
	fields := make([]godcgm.Short, len(fieldIDs))
	for i, id := range fieldIDs {
		fields[i] = godcgm.Short(id)
	}
	per := max(1, maxValuesPerQuery/len(fields))
	out := make([]RawValue, 0, len(entities)*len(fields))
	for start := 0; start < len(entities); start += per {
		chunk := entities[start:min(len(entities), start+per)]
		pairs := make([]godcgm.GroupEntityPair, len(chunk))
		for i, e := range chunk {
			pairs[i] = godcgm.GroupEntityPair{EntityGroupId: toEntityGroup(e.Kind), EntityId: e.ID}
		}
		vals, err := godcgm.EntitiesGetLatestValues(pairs, fields, 0)
		if err != nil {
			return nil, r.check(err, "read DCGM values")
		}
		for i := range vals {
			v := &vals[i]
			kind, ok := toEntityKind(v.EntityGroupId)
			if !ok {
				continue
			}
			rv := RawValue{
				Entity:  Entity{kind, v.EntityID},
				FieldID: uint16(v.FieldID),
				Status:  v.Status,
				Type:    byte(v.FieldType),
			}
			switch rv.Type {
			case FieldTypeDouble:
				rv.Float = v.Float64()
			case FieldTypeInt64:
				rv.Int = v.Int64()
			}
			if v.TS > 0 {
				rv.Time = time.UnixMicro(v.TS)
			}
			out = append(out, rv)
		}
	}
	return out, nil
}

func (r *realClient) HealthCheck() ([]HealthIncident, error) {
	if r.closed {
		return nil, ErrConnection
	}
	if !r.hasHealth {
		return nil, errors.New("DCGM health watches not set")
	}
	resp, err := godcgm.HealthCheck(r.healthGroup)
	if err != nil {
		return nil, r.check(err, "DCGM health check")
	}
	var out []HealthIncident
	for _, in := range resp.Incidents {
		kind, ok := toEntityKind(in.EntityInfo.EntityGroupId)
		if !ok {
			continue
		}
		result := ""
		switch in.Health {
		case godcgm.DCGM_HEALTH_RESULT_WARN:
			result = HealthWarn
		case godcgm.DCGM_HEALTH_RESULT_FAIL:
			result = HealthFail
		default:
			continue
		}
		for _, s := range healthSystems {
			if in.System == s.sys {
				out = append(out, HealthIncident{
					Entity:  Entity{kind, in.EntityInfo.EntityId},
					System:  s.name,
					Result:  result,
					Message: in.Error.Message,
				})
			}
		}
	}
	return out, nil
}

func (r *realClient) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.unwatch()
	realMu.Lock()
	defer realMu.Unlock()
	realOpen = false
	if err := godcgm.Shutdown(); err != nil {
		return fmt.Errorf("DCGM shutdown: %w", err)
	}
	return nil
}
