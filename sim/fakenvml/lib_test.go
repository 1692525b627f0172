package fakenvml_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// One builder per test process: the C library is compiled once, and every
// variant linked from that object.
var (
	builder  *fakenvml.Builder
	nodeFile string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakenvml-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	builder = fakenvml.NewBuilder(filepath.Join(dir, "lib"))
	nodeFile = filepath.Join(dir, "node.conf")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func library(t testing.TB, variant string) string {
	t.Helper()
	p, err := builder.Library(variant)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// open loads the full library in this process (through go-nvml, as the
// exporter does) serving node. A process can bind NVML's functions to one
// library only, so in-process tests use the Full variant; branch variants
// run in the exporter binary (binary_test.go).
func open(t *testing.T, node *fakenvml.Node) nvml.Interface {
	t.Helper()
	write(t, node)
	t.Setenv(fakenvml.EnvNode, nodeFile)
	lib := nvml.New(nvml.WithLibraryPath(library(t, fakenvml.Full)))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	return lib
}

func write(t testing.TB, node *fakenvml.Node) {
	t.Helper()
	if err := node.WriteFile(nodeFile); err != nil {
		t.Fatal(err)
	}
}

func must[T any](t *testing.T, what string) func(T, nvml.Return) T {
	return func(v T, ret nvml.Return) T {
		t.Helper()
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: %v", what, ret)
		}
		return v
	}
}

func TestInitWithoutNodeFileFailsClearly(t *testing.T) {
	t.Setenv(fakenvml.EnvNode, "")
	lib := nvml.New(nvml.WithLibraryPath(library(t, fakenvml.Full)))
	if ret := lib.Init(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		_ = lib.Shutdown()
		t.Fatalf("Init without %s = %v, want ERROR_DRIVER_NOT_LOADED", fakenvml.EnvNode, ret)
	}
}

func TestIdentityAndTelemetry(t *testing.T) {
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	g := &node.GPUs[1]
	g.Memory.Used = 10 << 30
	g.Utilization = &nvml.Utilization{Gpu: 87, Memory: 40}
	g.ECC.Counts[nvml.MEMORY_ERROR_TYPE_CORRECTED][nvml.AGGREGATE_ECC] = 12
	g.RemappedRows = &fakenvml.RemappedRows{Correctable: 2, Pending: true}
	g.NVLinks[3].Errors[nvml.NVLINK_ERROR_DL_CRC_FLIT] = 9
	g.NVLinks[17].Active = false
	g.Fields[nvml.FI_DEV_GET_GPU_RECOVERY_ACTION] = uint64(nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
	g.ClockEventReasons = fakenvml.Ptr[uint64](nvml.ClocksEventReasonSwThermalSlowdown)
	g.ScopedFields = map[uint32]map[uint32]uint64{nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: {2: 5}}
	lib := open(t, node)

	if n := must[int](t, "count")(lib.DeviceGetCount()); n != 2 {
		t.Fatalf("count %d", n)
	}
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(1))
	if v := must[string](t, "driver")(lib.SystemGetDriverVersion()); v != node.DriverVersion {
		t.Errorf("driver %q", v)
	}
	if v := must[int](t, "cuda")(lib.SystemGetCudaDriverVersion()); v != 13000 {
		t.Errorf("cuda %d", v)
	}
	if v := must[string](t, "name")(d.GetName()); v != gpus.H100_SXM5_80GB.Name {
		t.Errorf("name %q", v)
	}
	if v := must[string](t, "uuid")(d.GetUUID()); v != g.UUID {
		t.Errorf("uuid %q", v)
	}
	if v := must[int](t, "index")(d.GetIndex()); v != 1 {
		t.Errorf("index %d", v)
	}
	pci := must[nvml.PciInfo](t, "pci")(d.GetPciInfo())
	if pci.Bus != 0x28 || pci.PciDeviceId != gpus.H100_SXM5_80GB.PciDeviceId {
		t.Errorf("pci %+v", pci)
	}
	for _, by := range []func() (nvml.Device, nvml.Return){
		func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByUUID(g.UUID) },
		func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByPciBusId(g.PCIBusID) },
	} {
		h := must[nvml.Device](t, "handle by key")(by())
		if i, _ := h.GetIndex(); i != 1 {
			t.Errorf("handle by UUID/bus ID is GPU %d", i)
		}
	}
	// v1 counts reserved memory as used; v2 reports it apart. The total is
	// the framebuffer an H100 80GB HBM3 reports (81559 MiB), not go-nvml's
	// catalogue figure.
	m1 := must[nvml.Memory](t, "memory")(d.GetMemoryInfo())
	m2 := must[nvml.Memory_v2](t, "memory v2")(d.GetMemoryInfo_v2())
	if m1.Used != 10<<30+512<<20 || m2.Used != 10<<30 || m2.Reserved != 512<<20 || m2.Free != m2.Total-m2.Used-m2.Reserved || m1.Total != 81559<<20 {
		t.Errorf("memory v1 %+v v2 %+v", m1, m2)
	}
	if u := must[nvml.Utilization](t, "util")(d.GetUtilizationRates()); u.Gpu != 87 || u.Memory != 40 {
		t.Errorf("util %+v", u)
	}
	if v := must[uint32](t, "temp")(d.GetTemperature(nvml.TEMPERATURE_GPU)); v != 31 {
		t.Errorf("temp %d", v)
	}
	if v := must[uint32](t, "slowdown")(d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)); v != 89 {
		t.Errorf("slowdown %d", v)
	}
	if v := must[uint32](t, "power")(d.GetPowerUsage()); v != 70000 {
		t.Errorf("power %d", v)
	}
	if v := must[uint64](t, "energy")(d.GetTotalEnergyConsumption()); v != 6_048_000_000 {
		t.Errorf("energy %d", v)
	}
	if v := must[uint32](t, "sm clock")(d.GetClockInfo(nvml.CLOCK_SM)); v != 345 {
		t.Errorf("sm clock %d", v)
	}
	if v := must[uint64](t, "ecc")(d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC)); v != 12 {
		t.Errorf("ecc %d", v)
	}
	if c, u, p, f, ret := d.GetRemappedRows(); ret != nvml.SUCCESS || c != 2 || u != 0 || !p || f {
		t.Errorf("remapped %d %d %v %v %v", c, u, p, f, ret)
	}
	if st, _ := d.GetNvLinkState(17); st != nvml.FEATURE_DISABLED {
		t.Errorf("link 17 state %v", st)
	}
	if _, ret := d.GetNvLinkState(18); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("link 18: %v, want INVALID_ARGUMENT past the last link", ret)
	}
	if v := must[uint64](t, "nvlink")(d.GetNvLinkErrorCounter(3, nvml.NVLINK_ERROR_DL_CRC_FLIT)); v != 9 {
		t.Errorf("nvlink crc %d", v)
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}, {FieldId: nvml.FI_DEV_MEMORY_TEMP},
		{FieldId: nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, ScopeId: 2}, {FieldId: nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, ScopeId: 3}}
	if ret := d.GetFieldValues(fv); ret != nvml.SUCCESS || fv[0].NvmlReturn != uint32(nvml.SUCCESS) ||
		fv[0].Value[0] != byte(nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET) || fv[1].NvmlReturn != uint32(nvml.ERROR_NOT_SUPPORTED) ||
		fv[2].NvmlReturn != uint32(nvml.SUCCESS) || fv[2].Value[0] != 5 || fv[3].NvmlReturn != uint32(nvml.ERROR_NOT_SUPPORTED) {
		t.Errorf("field values %v %+v", ret, fv)
	}
	// One driver function under its R535 name and its older one.
	if v := must[uint64](t, "event reasons")(d.GetCurrentClocksEventReasons()); v != nvml.ClocksEventReasonSwThermalSlowdown {
		t.Errorf("event reasons %#x", v)
	}
	if v := must[uint64](t, "throttle reasons")(d.GetCurrentClocksThrottleReasons()); v != nvml.ClocksEventReasonSwThermalSlowdown {
		t.Errorf("throttle reasons %#x", v)
	}
	// Absent from the node: not supported, as on x86 (NUMA) or without MIG.
	if _, ret := d.GetNumaNodeId(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("NUMA node: %v, want NOT_SUPPORTED", ret)
	}
	if _, ret := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("retired pages: %v, want NOT_SUPPORTED on Hopper", ret)
	}
}

func TestFaultsPerDeviceAndFunction(t *testing.T) {
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 3, "r550")
	node.GPUs[0].Lost = true
	node.GPUs[1].Returns = map[string]nvml.Return{"nvmlDeviceGetPowerUsage": nvml.ERROR_NO_PERMISSION, "nvmlDeviceGetTemperature": nvml.ERROR_NOT_SUPPORTED}
	node.Returns = map[string]nvml.Return{"nvmlDeviceGetHandleByUUID": nvml.ERROR_UNKNOWN}
	node.GPUs[2].Blocks = map[string]time.Duration{"nvmlDeviceGetMemoryInfo": fakenvml.Forever}
	lib := open(t, node)
	h := func(i int) nvml.Device { return must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(i)) }

	if _, ret := lib.DeviceGetHandleByIndex(3); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("handle of GPU 3 of 3: %v", ret)
	}
	if _, ret := h(0).GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost GPU memory: %v", ret)
	}
	if _, ret := h(0).GetUUID(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost GPU UUID: %v", ret)
	}
	if _, ret := lib.DeviceGetHandleByUUID(node.GPUs[1].UUID); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("handle by UUID: %v, want the forced ERROR_UNKNOWN", ret)
	}
	if _, ret := h(1).GetPowerUsage(); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("power: %v, want NO_PERMISSION", ret)
	}
	if _, ret := h(1).GetTemperature(nvml.TEMPERATURE_GPU); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("temperature: %v, want NOT_SUPPORTED", ret)
	}
	if _, ret := h(1).GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("other functions on GPU 1: %v", ret)
	}
	// The hung call returns only once the block is lifted.
	done := make(chan nvml.Return, 1)
	go func() { _, ret := h(2).GetMemoryInfo(); done <- ret }()
	select {
	case ret := <-done:
		t.Fatalf("blocked call returned %v", ret)
	case <-time.After(300 * time.Millisecond):
	}
	if _, ret := h(1).GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("a hung GPU holds up another: %v", ret)
	}
	node.GPUs[2].Blocks = nil
	node.GPUs[0].Lost = false // and the lost GPU comes back
	write(t, node)
	select {
	case ret := <-done:
		if ret != nvml.SUCCESS {
			t.Errorf("unblocked call: %v", ret)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("call still blocked after the block was lifted")
	}
	if _, ret := h(0).GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("recovered GPU: %v", ret)
	}
}

func TestMIGLayoutInMemorySlices(t *testing.T) {
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
	g := &node.GPUs[0]
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 2); err != nil { // two compute instances
		t.Fatal(err)
	}
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1); err == nil {
		t.Error("a 1g instance fit beside two 3g instances in 8 memory slices")
	}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	if cur, _, ret := d.GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d %v", cur, ret)
	}
	info7 := must[nvml.GpuInstanceProfileInfo](t, "7g profile")(d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE))
	pl7 := must[[]nvml.GpuInstancePlacement](t, "7g placements")(d.GetGpuInstancePossiblePlacements(&info7))
	info3 := must[nvml.GpuInstanceProfileInfo](t, "3g profile")(d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE))
	pl3 := must[[]nvml.GpuInstancePlacement](t, "3g placements")(d.GetGpuInstancePossiblePlacements(&info3))
	if info7.SliceCount != 7 || !slices.Equal(pl7, []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}) ||
		!slices.Equal(pl3, []nvml.GpuInstancePlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}) {
		t.Errorf("7g %+v at %v, 3g at %v: want memory slices", info7, pl7, pl3)
	}
	if n := must[int](t, "3g capacity")(d.GetGpuInstanceRemainingCapacity(&info3)); n != 0 {
		t.Errorf("3g capacity left %d, want 0", n)
	}
	gis := must[[]nvml.GpuInstance](t, "3g instances")(d.GetGpuInstances(&info3))
	if len(gis) != 2 {
		t.Fatalf("%d 3g instances", len(gis))
	}
	gi1 := must[nvml.GpuInstanceInfo](t, "GI info")(gis[0].GetInfo())
	if gi1.Id != 1 || gi1.Placement != (nvml.GpuInstancePlacement{Start: 0, Size: 4}) || gi1.ProfileId != info3.Id {
		t.Errorf("GI %+v", gi1)
	}
	cip := must[nvml.ComputeInstanceProfileInfo](t, "CI profile")(gis[0].GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 0))
	cis := must[[]nvml.ComputeInstance](t, "CIs")(gis[0].GetComputeInstances(&cip))
	if len(cis) != 2 {
		t.Fatalf("GI 1 holds %d compute instances, want 2", len(cis))
	}
	if ci := must[nvml.ComputeInstanceInfo](t, "CI info")(cis[1].GetInfo()); ci.Id != 1 || ci.Placement.Start != 1 {
		t.Errorf("CI %+v", ci)
	}
	if n := must[int](t, "max MIG")(d.GetMaxMigDeviceCount()); n != 7 {
		t.Errorf("max MIG devices %d", n)
	}
	type ids struct{ gi, ci int }
	var got []ids
	for i := 0; i < 7; i++ {
		m, ret := d.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("MIG %d: %v", i, ret)
		}
		if is := must[bool](t, "is MIG")(m.IsMigDeviceHandle()); !is {
			t.Error("MIG handle is not a MIG handle")
		}
		p := must[nvml.Device](t, "parent")(m.GetDeviceHandleFromMigDeviceHandle())
		if u, _ := p.GetUUID(); u != g.UUID {
			t.Errorf("parent %s", u)
		}
		got = append(got, ids{must[int](t, "GI")(m.GetGpuInstanceId()), must[int](t, "CI")(m.GetComputeInstanceId())})
	}
	if !slices.Equal(got, []ids{{1, 0}, {1, 1}, {2, 0}}) {
		t.Errorf("MIG devices (GI, CI) %v", got)
	}
	if _, ret := d.GetGpuInstanceId(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GI ID of a whole GPU: %v", ret)
	}
}

// A MIG device handle names its compute instance: destroyed, the handle
// answers INVALID_ARGUMENT (nvml.h: it "would remain invalid and must be
// requested again"), even once an instance created since fills its slot;
// asked for again, the slot's handle serves the new instance, with a new
// UUID.
func TestMIGHandleGoesStaleOnReconfiguration(t *testing.T) {
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	g := &node.GPUs[0]
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	old := must[nvml.Device](t, "MIG handle")(d.GetMigDeviceHandleByIndex(0))
	oldUUID := must[string](t, "MIG UUID")(old.GetUUID())

	// nvidia-smi mig -dci -dgi: the slot is empty.
	if err := g.RemoveGPUInstance(1); err != nil {
		t.Fatal(err)
	}
	write(t, node)
	if _, ret := old.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("UUID of a destroyed instance's handle: %v, want INVALID_ARGUMENT", ret)
	}
	if _, ret := d.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG handle of an empty slot: %v, want NOT_FOUND", ret)
	}

	// -cgi -C: a new instance in the slot, numbered by its placement.
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	write(t, node)
	if _, ret := old.GetMemoryInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("memory of the old handle with a new instance in its slot: %v, want INVALID_ARGUMENT", ret)
	}
	cur := must[nvml.Device](t, "new MIG handle")(d.GetMigDeviceHandleByIndex(0))
	uuid := must[string](t, "new MIG UUID")(cur.GetUUID())
	if uuid == oldUUID || uuid != g.MIG.Devices[0].UUID {
		t.Errorf("new instance's UUID %s (old %s), want %s", uuid, oldUUID, g.MIG.Devices[0].UUID)
	}
	if gi := must[int](t, "GI")(cur.GetGpuInstanceId()); gi != 3 {
		t.Errorf("new instance in GPU instance %d, want 3 (a 2g.20gb at 0:2)", gi)
	}
	if _, ret := old.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("old handle after the new one was issued: %v, want INVALID_ARGUMENT", ret)
	}
	if again := must[nvml.Device](t, "MIG handle again")(d.GetMigDeviceHandleByIndex(0)); again != cur {
		t.Error("asking again for an unchanged slot gave another handle")
	}
}

func TestH100PlacementsInMemorySlices(t *testing.T) {
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	if _, err := node.GPUs[0].AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	for _, tc := range []struct {
		profile int
		want    []nvml.GpuInstancePlacement
	}{
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, []nvml.GpuInstancePlacement{{Start: 0, Size: 8}}},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, []nvml.GpuInstancePlacement{{Start: 0, Size: 4}, {Start: 4, Size: 4}}},
	} {
		t.Run(fmt.Sprintf("profile%d", tc.profile), func(t *testing.T) {
			info := must[nvml.GpuInstanceProfileInfo](t, "profile")(d.GetGpuInstanceProfileInfo(tc.profile))
			if pl := must[[]nvml.GpuInstancePlacement](t, "placements")(d.GetGpuInstancePossiblePlacements(&info)); !slices.Equal(pl, tc.want) {
				t.Errorf("H100 profile %d (%d slices) placed at %v, want %v", tc.profile, info.SliceCount, pl, tc.want)
			}
		})
	}
	gis := must[[]nvml.GpuInstance](t, "instances")(d.GetGpuInstances(fakenvml.Ptr(must[nvml.GpuInstanceProfileInfo](t, "7g")(d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)))))
	if len(gis) != 1 {
		t.Fatalf("%d 7g instances", len(gis))
	}
	if info := must[nvml.GpuInstanceInfo](t, "info")(gis[0].GetInfo()); info.Placement != (nvml.GpuInstancePlacement{Start: 0, Size: 8}) {
		t.Errorf("7g instance at %+v", info.Placement)
	}
}

func TestMIGInstanceLimitPerProfile(t *testing.T) {
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
	g := &node.GPUs[0]
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1); err != nil { // 1g.10gb+me: one per GPU
		t.Fatal(err)
	}
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1); err == nil {
		t.Error("a second +me instance was created")
	}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	me := must[nvml.GpuInstanceProfileInfo](t, "+me profile")(d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1))
	one := must[nvml.GpuInstanceProfileInfo](t, "1g profile")(d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE))
	if n := must[int](t, "+me capacity")(d.GetGpuInstanceRemainingCapacity(&me)); n != 0 || me.InstanceCount != 1 {
		t.Errorf("+me: %d left of %d, want 0 of 1", n, me.InstanceCount)
	}
	if n := must[int](t, "1g capacity")(d.GetGpuInstanceRemainingCapacity(&one)); n != 6 {
		t.Errorf("1g: %d left, want 6", n)
	}
}

func TestXIDEventsCarryMIGInstances(t *testing.T) {
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
	lib := open(t, node)
	set := must[nvml.EventSet](t, "event set")(lib.EventSetCreate())
	defer func() { _ = set.Free() }()
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(1))
	types := must[uint64](t, "types")(d.GetSupportedEventTypes())
	if ret := d.RegisterEvents(types&nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := set.Wait(20); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("wait with no event: %v", ret)
	}
	node.Events = []fakenvml.Event{
		{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 79}, // GPU 0 is not registered
		{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 13, GPUInstance: fakenvml.Ptr[uint32](1), ComputeInstance: fakenvml.Ptr[uint32](1)},
		{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 48},
	}
	write(t, node)
	e := must[nvml.EventData](t, "wait")(set.Wait(5000))
	if e.EventData != 13 || e.GpuInstanceId != 1 || e.ComputeInstanceId != 1 {
		t.Errorf("event %+v", e)
	}
	if i, _ := e.Device.GetIndex(); i != 1 {
		t.Errorf("event on GPU %d", i)
	}
	e = must[nvml.EventData](t, "wait")(set.Wait(5000))
	if e.EventData != 48 || e.GpuInstanceId != 0xFFFFFFFF {
		t.Errorf("event %+v", e)
	}
	if _, ret := set.Wait(20); ret != nvml.ERROR_TIMEOUT {
		t.Errorf("events delivered twice: %v", ret)
	}
}

// A burst delivers one event per wait, to every set registered then: a
// set registered between two waits gets the events delivered after.
func TestEventBurstDeliveredAtWaits(t *testing.T) {
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	sets := make([]nvml.EventSet, 2)
	for i := range sets {
		sets[i] = must[nvml.EventSet](t, "event set")(lib.EventSetCreate())
		defer func() { _ = sets[i].Free() }()
	}
	if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, sets[0]); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	node.Bursts = []fakenvml.Burst{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13, Count: 3, Every: time.Microsecond}}
	write(t, node)
	if e := must[nvml.EventData](t, "wait")(sets[0].Wait(5000)); e.EventData != 13 {
		t.Fatalf("event %+v", e)
	}
	if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, sets[1]); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	got := [2]int{1, 0}
	for i := 0; i < 4; i++ { // two events left, each to both sets
		for j, set := range sets {
			if _, ret := set.Wait(20); ret == nvml.SUCCESS {
				got[j]++
			}
		}
	}
	if got != [2]int{3, 2} {
		t.Errorf("events per set %v, want [3 2]: the second set registered after the first event", got)
	}
}

func TestProcesses(t *testing.T) {
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	node.GPUs[0].Processes = &fakenvml.Processes{
		Compute:     []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}, {Pid: 4243, UsedGpuMemory: 1 << 30, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}},
		Utilization: []nvml.ProcessUtilizationInfo_v1{{Pid: 4242, TimeStamp: 1000, SmUtil: 55, MemUtil: 20}, {Pid: 4243, TimeStamp: 2000, SmUtil: 5}},
	}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	ps := must[[]nvml.ProcessInfo](t, "processes")(d.GetComputeRunningProcesses())
	if len(ps) != 2 || ps[0].Pid != 4242 || ps[0].UsedGpuMemory != 3<<30 {
		t.Errorf("processes %+v", ps)
	}
	if g := must[[]nvml.ProcessInfo](t, "graphics")(d.GetGraphicsRunningProcesses()); len(g) != 0 {
		t.Errorf("graphics %+v", g)
	}
	us := must[[]nvml.ProcessUtilizationSample](t, "utilization")(d.GetProcessUtilization(1500))
	if len(us) != 1 || us[0].Pid != 4243 || us[0].SmUtil != 5 {
		t.Errorf("samples since 1500: %+v", us)
	}
	// go-nvml passes no array: the driver answers with the count needed.
	info, ret := d.GetProcessesUtilizationInfo()
	if ret != nvml.ERROR_INSUFFICIENT_SIZE || info.ProcessSamplesCount != 2 {
		t.Errorf("processes utilization info %v %+v", ret, info)
	}
}

func TestVariantsExportOnlyTheirBranch(t *testing.T) {
	impl, err := builder.Implemented()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nvmlInit_v2", "nvmlDeviceGetMemoryInfo_v2", "nvmlEventSetWait_v2", "nvmlDeviceGetNumaNodeId",
		"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetProcessesUtilizationInfo",
		"nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetGpuInstancePossiblePlacements_v2", "nvmlGpuInstanceGetComputeInstances",
		"nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlErrorString"} {
		if !slices.Contains(impl, want) {
			t.Errorf("the library does not implement %s", want)
		}
	}
	absent := map[string][]string{
		"r470": {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetComputeRunningProcesses_v3"},
		"r535": {"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetProcessesUtilizationInfo"},
		"r550": {"nvmlDeviceGetTemperatureV"},
	}
	present := map[string][]string{
		"r470": {"nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetMemoryInfo", "nvmlEventSetWait_v2", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetComputeRunningProcesses_v2"},
		"r535": {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3"},
		"r550": {"nvmlDeviceGetNumaNodeId", "nvmlDeviceGetProcessesUtilizationInfo"},
		"r570": {"nvmlDeviceGetTemperatureV"},
		"r580": {"nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetTemperature"},
	}
	for _, br := range fakenvml.Branches {
		lib := library(t, br)
		syms, err := fakenvml.BranchSymbols(br)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fakenvml.Exports(lib)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, s := range impl {
			if syms[s] {
				want = append(want, s)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s exports %d functions, want the %d its header declares", br, len(got), len(want))
		}
		// What the dynamic loader sees, as go-nvml's symbol probes do.
		h := dl.New(lib, dl.RTLD_LAZY|dl.RTLD_LOCAL)
		if err := h.Open(); err != nil {
			t.Fatal(err)
		}
		for _, s := range absent[br] {
			if h.Lookup(s) == nil {
				t.Errorf("%s: dlsym(%s) succeeds; the branch has no such function", br, s)
			}
		}
		for _, s := range present[br] {
			if err := h.Lookup(s); err != nil {
				t.Errorf("%s: dlsym(%s): %v", br, s, err)
			}
		}
	}
}

func TestMalformedNodeFile(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.conf")
	if err := os.WriteFile(bad, []byte("device_count=1\ngpu.0.name NVIDIA H100\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakenvml.EnvNode, bad)
	lib := nvml.New(nvml.WithLibraryPath(library(t, fakenvml.Full)))
	if ret := lib.Init(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		_ = lib.Shutdown()
		t.Fatalf("Init on a malformed node file = %v, want ERROR_DRIVER_NOT_LOADED", ret)
	}

	// A malformed rewrite while running keeps the node as it was.
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	lib = open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	tmp := nodeFile + ".tmp"
	if err := os.WriteFile(tmp, []byte("gpu.0.name=x\ngpu.0.name=y\n"), 0o644); err != nil { // a key twice
		t.Fatal(err)
	}
	if err := os.Rename(tmp, nodeFile); err != nil {
		t.Fatal(err)
	}
	if name := must[string](t, "name")(d.GetName()); name != gpus.H100_SXM5_80GB.Name {
		t.Errorf("name after a malformed rewrite %q", name)
	}
	node.GPUs[0].Name = "NVIDIA H100 80GB HBM3"
	write(t, node)
	if name := must[string](t, "name")(d.GetName()); name != "NVIDIA H100 80GB HBM3" {
		t.Errorf("name after a good rewrite %q", name)
	}
}

func TestBlockForAWhile(t *testing.T) {
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 1, fakenvml.Full)
	node.GPUs[0].Blocks = map[string]time.Duration{"nvmlDeviceGetPowerUsage": 300 * time.Millisecond}
	lib := open(t, node)
	d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
	start := time.Now()
	if _, ret := d.GetPowerUsage(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("blocked call returned after %v, want at least 300ms", took)
	}
}

// TestFakeServesEverySymbolTheExporterCalls: the fake library implements
// every function in the exporter's call table (collector/nvmlsampler/symbols.go),
// and each fallback.
func TestFakeServesEverySymbolTheExporterCalls(t *testing.T) {
	impl, err := builder.Implemented()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range nvmlsampler.Symbols {
		for _, name := range []string{s.Name, s.Fallback} {
			if name != "" && !slices.Contains(impl, name) {
				t.Errorf("the fake library does not implement %s, which the exporter calls", name)
			}
		}
	}
}

// The fake behaves as the driver where code is easily written to expect
// otherwise: events with no set registered are lost, a lost GPU breaks the
// sets it is registered in, and a driver reload uninitialises the library.
func TestDriverLifeCycle(t *testing.T) {
	t.Run("events raised with no set registered are lost", func(t *testing.T) {
		node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
		lib := open(t, node)
		node.Events = []fakenvml.Event{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 79}}
		write(t, node)
		must[int](t, "count")(lib.DeviceGetCount()) // the library sees the event: nobody listens
		set := must[nvml.EventSet](t, "event set")(lib.EventSetCreate())
		defer func() { _ = set.Free() }()
		d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(0))
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if e, ret := set.Wait(50); ret != nvml.ERROR_TIMEOUT {
			t.Errorf("an event raised before registration was delivered: %+v %v", e, ret)
		}
		node.Events = append(node.Events, fakenvml.Event{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 48})
		write(t, node)
		if e := must[nvml.EventData](t, "wait")(set.Wait(5000)); e.EventData != 48 {
			t.Errorf("event %d, want 48", e.EventData)
		}
	})
	t.Run("a lost GPU makes the wait answer GPU_IS_LOST", func(t *testing.T) {
		node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
		lib := open(t, node)
		set := must[nvml.EventSet](t, "event set")(lib.EventSetCreate())
		defer func() { _ = set.Free() }()
		for i := 0; i < 2; i++ {
			d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(i))
			if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
		}
		node.Events = []fakenvml.Event{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13}}
		node.GPUs[1].Lost = true
		write(t, node)
		if e := must[nvml.EventData](t, "wait")(set.Wait(5000)); e.EventData != 13 {
			t.Errorf("queued event %d, want 13", e.EventData)
		}
		if _, ret := set.Wait(50); ret != nvml.ERROR_GPU_IS_LOST {
			t.Errorf("wait on a set holding a lost GPU: %v, want GPU_IS_LOST", ret)
		}
	})
	t.Run("a driver reload answers UNINITIALIZED until Init", func(t *testing.T) {
		node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 1, fakenvml.Full)
		lib := open(t, node)
		set := must[nvml.EventSet](t, "event set")(lib.EventSetCreate())
		node.DriverGeneration = 2
		write(t, node)
		if _, ret := lib.DeviceGetCount(); ret != nvml.ERROR_UNINITIALIZED {
			t.Errorf("count after a reload: %v, want UNINITIALIZED", ret)
		}
		if _, ret := set.Wait(10); ret != nvml.ERROR_UNINITIALIZED {
			t.Errorf("wait after a reload: %v, want UNINITIALIZED", ret)
		}
		node.DriverUnloaded = true
		write(t, node)
		if ret := lib.Init(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
			t.Errorf("Init with the module unloaded: %v, want DRIVER_NOT_LOADED", ret)
		}
		node.DriverUnloaded = false
		write(t, node)
		if ret := lib.Init(); ret != nvml.SUCCESS {
			t.Fatalf("Init after the reload: %v", ret)
		}
		if n := must[int](t, "count")(lib.DeviceGetCount()); n != 1 {
			t.Errorf("count %d", n)
		}
	})
	t.Run("a driver-wide stall blocks every device", func(t *testing.T) {
		node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
		lib := open(t, node)
		d := must[nvml.Device](t, "handle")(lib.DeviceGetHandleByIndex(1))
		node.Blocks = map[string]time.Duration{"all": 300 * time.Millisecond}
		write(t, node)
		start := time.Now()
		must[nvml.Memory](t, "memory")(d.GetMemoryInfo())
		if time.Since(start) < 300*time.Millisecond {
			t.Errorf("a call on GPU 1 did not wait for the driver-wide block")
		}
	})
}
