//go:build cgo && linux && !nodcgm

package dcgm

import (
	"errors"
	"fmt"
	"testing"

	godcgm "github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// TestConstantsMatchGoDCGM keeps our copies of DCGM's numbers honest.
func TestConstantsMatchGoDCGM(t *testing.T) {
	ids := map[Field]godcgm.Short{
		GraphicsActive: godcgm.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
		SMActive:       godcgm.DCGM_FI_PROF_SM_ACTIVE,
		SMOccupancy:    godcgm.DCGM_FI_PROF_SM_OCCUPANCY,
		TensorActive:   godcgm.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
		DRAMActive:     godcgm.DCGM_FI_PROF_DRAM_ACTIVE,
		FP64Active:     godcgm.DCGM_FI_PROF_PIPE_FP64_ACTIVE,
		FP32Active:     godcgm.DCGM_FI_PROF_PIPE_FP32_ACTIVE,
		FP16Active:     godcgm.DCGM_FI_PROF_PIPE_FP16_ACTIVE,
		PCIeTxBytes:    godcgm.DCGM_FI_PROF_PCIE_TX_BYTES,
		PCIeRxBytes:    godcgm.DCGM_FI_PROF_PCIE_RX_BYTES,
		NVLinkTxBytes:  godcgm.DCGM_FI_PROF_NVLINK_TX_BYTES,
		NVLinkRxBytes:  godcgm.DCGM_FI_PROF_NVLINK_RX_BYTES,
	}
	for f, id := range ids {
		if f.ID() != uint16(id) {
			t.Errorf("%s: %d, go-dcgm %d", f, f.ID(), id)
		}
	}
	for name, pair := range map[string][2]int64{
		"XID":           {int64(FieldIDXIDErrors), int64(godcgm.DCGM_FI_DEV_XID_ERRORS)},
		"UUID":          {int64(FieldIDGPUUUID), int64(godcgm.DCGM_FI_DEV_UUID)},
		"NVMLIndex":     {int64(FieldIDNVMLIndex), int64(godcgm.DCGM_FI_DEV_NVML_INDEX)},
		"int32 blank":   {Int32Blank, godcgm.DCGM_FT_INT32_BLANK},
		"int64 blank":   {Int64Blank, godcgm.DCGM_FT_INT64_BLANK},
		"int64 not sup": {Int64NotSupported, godcgm.DCGM_FT_INT64_NOT_SUPPORTED},
		"not supported": {StatusNotSupported, godcgm.DCGM_ST_NOT_SUPPORTED},
		"no data":       {StatusNoData, godcgm.DCGM_ST_NO_DATA},
		"not watched":   {StatusNotWatched, godcgm.DCGM_ST_NOT_WATCHED},
		"conn":          {StatusConnectionNotValid, godcgm.DCGM_ST_CONNECTION_NOT_VALID},
		"prof":          {StatusProfilingNotSupported, godcgm.DCGM_ST_PROFILING_NOT_SUPPORTED},
		"double":        {int64(FieldTypeDouble), int64(godcgm.DCGM_FT_DOUBLE)},
		"int64":         {int64(FieldTypeInt64), int64(godcgm.DCGM_FT_INT64)},
		"string":        {int64(FieldTypeString), int64(godcgm.DCGM_FT_STRING)},
	} {
		t.Run(name, func(t *testing.T) {
			if pair[0] != pair[1] {
				t.Errorf("%s: %d, go-dcgm %d", name, pair[0], pair[1])
			}
		})
	}
	if FP64Blank != godcgm.DCGM_FT_FP64_BLANK || FP64NotSupported != godcgm.DCGM_FT_FP64_NOT_SUPPORTED {
		t.Error("FP64 sentinels differ from go-dcgm's")
	}
	if !isBlankFloat(godcgm.DCGM_FT_FP64_NOT_PERMISSIONED) || !isBlankInt(godcgm.DCGM_FT_INT64_NOT_FOUND) {
		t.Error("a sentinel is not treated as blank")
	}
	if isBlankInt(int64(godcgm.DCGM_FT_INT32_BLANK)) {
		t.Error("2.1 GB/s must not count as blank in an int64 field")
	}
}

func TestConnectionErrorClassification(t *testing.T) {
	// dcgm_structs.h's comment on DCGM_ST_CONNECTION_NOT_VALID; DCGM's
	// errorString() says "Host engine connection invalid/disconnected".
	if !isConnectionError(errors.New("error retrieving DCGM MIG hierarchy: Host engine connection invalid/disconnected")) {
		t.Error("connection loss not recognised")
	}
	if isConnectionError(errors.New("error watching fields: Profiling is not supported for this group of GPUs or GPU")) {
		t.Error("profiling error taken for a connection loss")
	}
}

// TestRealClientSingleton: a failed open leaves nothing held, so the next
// attempt is not refused as busy.
func TestRealClientSingleton(t *testing.T) {
	for range 3 {
		c, err := DefaultOpen(Config{Mode: ModeEmbedded})
		if err == nil {
			_ = c.Close()
			t.Skip("DCGM is usable here")
		}
		if errors.Is(err, ErrBusy) {
			t.Fatalf("open refused as busy after a failure: %v", err)
		}
	}
}

// Connection loss is what DCGM's return code says, and
// go-dcgm's plain errors carry only errorString()'s text of that code
// ("Host engine connection invalid/disconnected"), often after a prefix.
func TestConnectionLossByReturnCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		lost bool
	}{
		{errors.New("Host engine connection invalid/disconnected"), true},
		{errors.New("Error watching fields: Host engine connection invalid/disconnected"), true},
		{fmt.Errorf("error connecting to nv-hostengine: %w", errors.New("Host engine connection invalid/disconnected")), true},
		{errors.New("Error destroying group: Object is in an undefined state"), true},
		{errors.New("GPU is lost"), false},
		{errors.New("Feature not supported"), false},
		{errors.New("This request is serviced by a module of DCGM that is not currently loaded"), false},
		{errors.New("something else"), false},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			if got := isConnectionError(tc.err); got != tc.lost {
				t.Errorf("isConnectionError(%q) = %v, want %v", tc.err, got, tc.lost)
			}
		})
	}
	if code, ok := returnCode(errors.New("Error watching fields: Host engine connection invalid/disconnected")); !ok || code != godcgm.DCGM_ST_CONNECTION_NOT_VALID {
		t.Errorf("return code %d, %v; want DCGM_ST_CONNECTION_NOT_VALID", code, ok)
	}
}

// TestEntityKindsMatchGoDCGM: each kind the sampler watches is the DCGM
// entity group of that name, both ways.
func TestEntityKindsMatchGoDCGM(t *testing.T) {
	for k, g := range map[EntityKind]godcgm.Field_Entity_Group{
		EntityGPU:             godcgm.FE_GPU,
		EntityGPUInstance:     godcgm.FE_GPU_I,
		EntityComputeInstance: godcgm.FE_GPU_CI,
	} {
		if got := toEntityGroup(k); got != g {
			t.Errorf("%s: group %v, want %v", k, got, g)
		}
		if got, ok := toEntityKind(g); !ok || got != k {
			t.Errorf("group %v: kind %v, want %s", g, got, k)
		}
	}
}

// TestMIGHierarchy: DCGM's hierarchy lists GPU instances under GPUs and
// compute instances under GPU instances, in whatever order; each compute
// instance becomes an entity with its GPU instance's GPU, UUID and NVML
// GPU instance ID and its own NVML compute instance ID.
func TestMIGHierarchy(t *testing.T) {
	const uuid = "GPU-11111111-2222-3333-4444-555555555555"
	var h godcgm.MigHierarchy_v2
	add := func(g godcgm.Field_Entity_Group, id uint, pg godcgm.Field_Entity_Group, pid uint, gi, ci uint) {
		h.EntityList[h.Count] = godcgm.MigHierarchyInfo_v2{
			Entity: godcgm.GroupEntityPair{EntityGroupId: g, EntityId: id},
			Parent: godcgm.GroupEntityPair{EntityGroupId: pg, EntityId: pid},
			Info:   godcgm.MigEntityInfo{GpuUuid: uuid, NvmlGpuIndex: 3, NvmlInstanceId: gi, NvmlComputeInstanceId: ci},
		}
		h.Count++
	}
	// A compute instance listed before its GPU instance; GPU instance 7
	// (DCGM entity 1) split into compute instances 0 and 1, GPU instance
	// 2 (entity 0) whole.
	add(godcgm.FE_GPU_CI, 5, godcgm.FE_GPU_I, 1, 7, 1)
	add(godcgm.FE_GPU_I, 0, godcgm.FE_GPU, 0, 2, 0xFFFFFFFF)
	add(godcgm.FE_GPU_CI, 4, godcgm.FE_GPU_I, 0, 2, 0)
	add(godcgm.FE_GPU_I, 1, godcgm.FE_GPU, 0, 7, 0xFFFFFFFF)
	add(godcgm.FE_GPU_CI, 6, godcgm.FE_GPU_I, 1, 7, 0)
	gpus := []DeviceInfo{{Entity: Entity{EntityGPU, 0}, GPU: 0, GPUInstance: -1, ComputeInstance: -1}}
	got := migDevices(gpus, map[uint]int{0: 0}, &h)
	want := []DeviceInfo{
		{Entity: Entity{EntityGPU, 0}, GPU: 3, UUID: uuid, GPUInstance: -1, ComputeInstance: -1},
		{Entity: Entity{EntityGPUInstance, 0}, GPU: 3, UUID: uuid, GPUInstance: 2, ComputeInstance: -1},
		{Entity: Entity{EntityGPUInstance, 1}, GPU: 3, UUID: uuid, GPUInstance: 7, ComputeInstance: -1},
		{Entity: Entity{EntityComputeInstance, 5}, GPU: 3, UUID: uuid, GPUInstance: 7, ComputeInstance: 1},
		{Entity: Entity{EntityComputeInstance, 4}, GPU: 3, UUID: uuid, GPUInstance: 2, ComputeInstance: 0},
		{Entity: Entity{EntityComputeInstance, 6}, GPU: 3, UUID: uuid, GPUInstance: 7, ComputeInstance: 0},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("devices\n got %v\nwant %v", got, want)
	}
}
