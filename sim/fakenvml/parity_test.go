package fakenvml_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// nodeFromSim describes a simulated node, at its clock's present, as a
// fake driver's node file: every answer the simulator gives (a value, or an
// error other than NOT_SUPPORTED) is what the fake library answers. One
// scenario thus drives both the simulator and the fake driver.
//
// The simulator's methods are found through small interfaces of go-nvml
// types, so a method the simulator gains (e.g. GetMemoryInfo_v2) is carried
// over as soon as it exists, and one it lacks leaves the function
// unsupported in the fake too.
func nodeFromSim(t *testing.T, sim *simnode.Node) *fakenvml.Node {
	t.Helper()
	n := &fakenvml.Node{}
	n.DriverVersion, _ = sim.SystemGetDriverVersion()
	n.NVMLVersion, _ = sim.SystemGetNVMLVersion()
	n.CUDADriverVersion, _ = sim.SystemGetCudaDriverVersion()
	for i, d := range sim.Devices() {
		g := fakenvml.GPU{Minor: -1}
		snapshotDevice(any(d), &g.Device)
		ask(&g.Device, "nvmlDeviceGetMinorNumber", func() nvml.Return {
			v, r := d.GetMinorNumber()
			g.Minor = v
			return r
		})
		if pci, r := d.GetPciInfo(); r == nvml.SUCCESS {
			g.PCIBusID = cString(pci.BusId[:])
			g.PCIDeviceID = pci.PciDeviceId
		}
		snapshotBoard(any(d), &g)
		snapshotMIG(t, d, &g)
		if len(g.Returns) > 0 {
			t.Logf("GPU %d answers errors: %v", i, g.Returns)
		}
		n.GPUs = append(n.GPUs, g)
	}
	return n
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// ask records an error answer of a function as the fake's answer to it.
func ask(d *fakenvml.Device, symbol string, call func() nvml.Return) bool {
	r := call()
	if r == nvml.SUCCESS {
		return true
	}
	if r != nvml.ERROR_NOT_SUPPORTED {
		if d.Returns == nil {
			d.Returns = map[string]nvml.Return{}
		}
		d.Returns[symbol] = r
	}
	return false
}

func snapshotDevice(d any, out *fakenvml.Device) {
	if x, ok := d.(interface{ GetUUID() (string, nvml.Return) }); ok {
		ask(out, "nvmlDeviceGetUUID", func() (r nvml.Return) { out.UUID, r = x.GetUUID(); return })
	}
	if x, ok := d.(interface{ GetName() (string, nvml.Return) }); ok {
		ask(out, "nvmlDeviceGetName", func() (r nvml.Return) { out.Name, r = x.GetName(); return })
	}
	if x, ok := d.(interface {
		GetMemoryInfo() (nvml.Memory, nvml.Return)
	}); ok {
		var m nvml.Memory
		if ask(out, "nvmlDeviceGetMemoryInfo", func() (r nvml.Return) { m, r = x.GetMemoryInfo(); return }) {
			out.Memory = &fakenvml.Memory{Total: m.Total, Used: m.Used}
		}
	}
	if x, ok := d.(interface {
		GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return)
	}); ok {
		var m nvml.Memory_v2
		if ask(out, "nvmlDeviceGetMemoryInfo_v2", func() (r nvml.Return) { m, r = x.GetMemoryInfo_v2(); return }) {
			out.Memory = &fakenvml.Memory{Total: m.Total, Reserved: m.Reserved, Used: m.Used}
		}
	}
	if x, ok := d.(interface {
		GetUtilizationRates() (nvml.Utilization, nvml.Return)
	}); ok {
		var u nvml.Utilization
		if ask(out, "nvmlDeviceGetUtilizationRates", func() (r nvml.Return) { u, r = x.GetUtilizationRates(); return }) {
			out.Utilization = &u
		}
	}
	if x, ok := d.(interface {
		GetEncoderUtilization() (uint32, uint32, nvml.Return)
		GetDecoderUtilization() (uint32, uint32, nvml.Return)
	}); ok {
		var u, period uint32
		if ask(out, "nvmlDeviceGetEncoderUtilization", func() (r nvml.Return) { u, period, r = x.GetEncoderUtilization(); return }) {
			out.EncoderUtilization = &[2]uint32{u, period}
		}
		if ask(out, "nvmlDeviceGetDecoderUtilization", func() (r nvml.Return) { u, period, r = x.GetDecoderUtilization(); return }) {
			out.DecoderUtilization = &[2]uint32{u, period}
		}
	}
	if x, ok := d.(interface {
		GetAttributes() (nvml.DeviceAttributes, nvml.Return)
	}); ok {
		var a nvml.DeviceAttributes
		if ask(out, "nvmlDeviceGetAttributes_v2", func() (r nvml.Return) { a, r = x.GetAttributes(); return }) {
			out.Attributes = &a
		}
	}
}

// snapshotBoard reads what only a whole GPU answers.
func snapshotBoard(d any, g *fakenvml.GPU) {
	u32 := func(sym string, f func() (uint32, nvml.Return)) *uint32 {
		var v uint32
		if ask(&g.Device, sym, func() (r nvml.Return) { v, r = f(); return }) {
			return &v
		}
		return nil
	}
	if x, ok := d.(interface {
		GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return)
	}); ok {
		if v := u32("nvmlDeviceGetTemperature", func() (uint32, nvml.Return) { return x.GetTemperature(nvml.TEMPERATURE_GPU) }); v != nil {
			g.Temperatures = map[nvml.TemperatureSensors]uint32{nvml.TEMPERATURE_GPU: *v}
		}
	}
	if x, ok := d.(interface {
		GetTemperatureThreshold(nvml.TemperatureThresholds) (uint32, nvml.Return)
	}); ok {
		g.Thresholds = map[nvml.TemperatureThresholds]uint32{}
		for _, th := range []nvml.TemperatureThresholds{nvml.TEMPERATURE_THRESHOLD_SHUTDOWN, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN,
			nvml.TEMPERATURE_THRESHOLD_MEM_MAX, nvml.TEMPERATURE_THRESHOLD_GPU_MAX} {
			if v, r := x.GetTemperatureThreshold(th); r == nvml.SUCCESS {
				g.Thresholds[th] = v
			}
		}
	}
	if x, ok := d.(interface{ GetPowerUsage() (uint32, nvml.Return) }); ok {
		g.PowerUsage = u32("nvmlDeviceGetPowerUsage", x.GetPowerUsage)
	}
	if x, ok := d.(interface {
		GetPowerManagementLimit() (uint32, nvml.Return)
	}); ok {
		g.PowerLimit = u32("nvmlDeviceGetPowerManagementLimit", x.GetPowerManagementLimit)
	}
	if x, ok := d.(interface {
		GetTotalEnergyConsumption() (uint64, nvml.Return)
	}); ok {
		var v uint64
		if ask(&g.Device, "nvmlDeviceGetTotalEnergyConsumption", func() (r nvml.Return) { v, r = x.GetTotalEnergyConsumption(); return }) {
			g.Energy = &v
		}
	}
	if x, ok := d.(interface {
		GetClockInfo(nvml.ClockType) (uint32, nvml.Return)
	}); ok {
		g.Clocks = map[nvml.ClockType]uint32{}
		for _, c := range []nvml.ClockType{nvml.CLOCK_GRAPHICS, nvml.CLOCK_SM, nvml.CLOCK_MEM, nvml.CLOCK_VIDEO} {
			if v, r := x.GetClockInfo(c); r == nvml.SUCCESS {
				g.Clocks[c] = v
			}
		}
	}
	pcie := &fakenvml.PCIe{}
	hasPCIe := false
	if x, ok := d.(interface {
		GetCurrPcieLinkGeneration() (int, nvml.Return)
	}); ok {
		if v, r := x.GetCurrPcieLinkGeneration(); r == nvml.SUCCESS {
			pcie.Gen, pcie.MaxGen, hasPCIe = uint32(v), uint32(v), true
		}
	}
	if x, ok := d.(interface {
		GetCurrPcieLinkWidth() (int, nvml.Return)
	}); ok {
		if v, r := x.GetCurrPcieLinkWidth(); r == nvml.SUCCESS {
			pcie.Width, pcie.MaxWidth = uint32(v), uint32(v)
		}
	}
	if x, ok := d.(interface{ GetPcieReplayCounter() (int, nvml.Return) }); ok {
		if v, r := x.GetPcieReplayCounter(); r == nvml.SUCCESS {
			pcie.Replays = uint32(v)
		}
	}
	if hasPCIe {
		g.PCIe = pcie
	}
	if x, ok := d.(interface {
		GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return)
	}); ok {
		e := &fakenvml.ECC{Enabled: true}
		all := true
		for et := 0; et < 2; et++ {
			for ct := 0; ct < 2; ct++ {
				v, r := x.GetTotalEccErrors(nvml.MemoryErrorType(et), nvml.EccCounterType(ct))
				e.Counts[et][ct] = v
				all = all && r == nvml.SUCCESS
			}
		}
		if all {
			g.ECC = e
		}
	}
	if x, ok := d.(interface {
		GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return)
	}); ok {
		for c := 0; c < 2; c++ {
			if pages, r := x.GetRetiredPages(nvml.PageRetirementCause(c)); r == nvml.SUCCESS {
				if g.RetiredPages == nil {
					g.RetiredPages = map[nvml.PageRetirementCause][]uint64{}
				}
				g.RetiredPages[nvml.PageRetirementCause(c)] = append([]uint64{}, pages...)
			}
		}
	}
	if x, ok := d.(interface {
		GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return)
	}); ok {
		if v, r := x.GetRetiredPagesPendingStatus(); r == nvml.SUCCESS {
			g.RetiredPagesPending = fakenvml.Ptr(v == nvml.FEATURE_ENABLED)
		}
	}
	if x, ok := d.(interface {
		GetRemappedRows() (int, int, bool, bool, nvml.Return)
	}); ok {
		if c, u, p, f, r := x.GetRemappedRows(); r == nvml.SUCCESS {
			g.RemappedRows = &fakenvml.RemappedRows{Correctable: c, Uncorrectable: u, Pending: p, Failed: f}
		}
	}
	if x, ok := d.(interface {
		GetRowRemapperHistogram() (nvml.RowRemapperHistogramValues, nvml.Return)
	}); ok {
		if h, r := x.GetRowRemapperHistogram(); r == nvml.SUCCESS {
			g.RemapperHistogram = &[5]uint32{h.Max, h.High, h.Partial, h.Low, h.None}
		}
	}
	if x, ok := d.(interface {
		GetCurrentClocksEventReasons() (uint64, nvml.Return)
	}); ok {
		var v uint64
		if ask(&g.Device, "nvmlDeviceGetCurrentClocksEventReasons", func() (r nvml.Return) { v, r = x.GetCurrentClocksEventReasons(); return }) {
			g.ClockEventReasons = &v
		}
	}
	if x, ok := d.(interface{ GetNumaNodeId() (int, nvml.Return) }); ok {
		if v, r := x.GetNumaNodeId(); r == nvml.SUCCESS {
			g.NUMANode = &v
		}
	}
	if x, ok := d.(interface {
		GetNvLinkState(int) (nvml.EnableState, nvml.Return)
		GetNvLinkErrorCounter(int, nvml.NvLinkErrorCounter) (uint64, nvml.Return)
	}); ok {
		for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
			st, r := x.GetNvLinkState(l)
			if r != nvml.SUCCESS {
				break
			}
			link := fakenvml.NVLink{Active: st == nvml.FEATURE_ENABLED, Errors: map[nvml.NvLinkErrorCounter]uint64{}}
			for _, c := range []nvml.NvLinkErrorCounter{nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA} {
				if v, r := x.GetNvLinkErrorCounter(l, c); r == nvml.SUCCESS {
					link.Errors[c] = v
				}
			}
			g.NVLinks = append(g.NVLinks, link)
		}
	}
	if x, ok := d.(interface {
		GetFieldValues([]nvml.FieldValue) nvml.Return
	}); ok {
		for _, id := range []uint32{nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, nvml.FI_DEV_MEMORY_TEMP} {
			fv := []nvml.FieldValue{{FieldId: id}}
			if x.GetFieldValues(fv) == nvml.SUCCESS && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
				if g.Fields == nil {
					g.Fields = map[uint32]uint64{}
				}
				var v uint64
				for i := 7; i >= 0; i-- {
					v = v<<8 | uint64(fv[0].Value[i])
				}
				g.Fields[id] = v
			}
		}
	}
}

// snapshotMIG reads MIG mode, profiles, GPU instances and MIG devices.
func snapshotMIG(t *testing.T, d *simnode.Device, g *fakenvml.GPU) {
	cur, _, r := d.GetMigMode()
	if r != nvml.SUCCESS {
		return
	}
	m := &fakenvml.MIG{Enabled: cur == nvml.DEVICE_MIG_ENABLE, Profiles: map[int]fakenvml.GPUInstanceProfile{}}
	if n, r := d.GetMaxMigDeviceCount(); r == nvml.SUCCESS {
		m.MaxDevices = n
	}
	g.MIG = m
	gis := map[int]*fakenvml.GPUInstance{}
	for idx := 0; idx < nvml.GPU_INSTANCE_PROFILE_COUNT; idx++ {
		info, r := d.GetGpuInstanceProfileInfo(idx)
		if r != nvml.SUCCESS {
			continue
		}
		// Without the driver's name (R470) the table's name stands in.
		p := fakenvml.GPUInstanceProfile{Info: info}
		if name, r := d.GetName(); r == nvml.SUCCESS {
			if geo, ok := miggeometry.ByNVMLName(name); ok {
				gp, _ := geo.ProfileByIndex(idx)
				p.Name = gp.Name
			}
		}
		// The name the simulated driver gives (nvmlDeviceGetGpuInstanceProfileInfoV).
		if v2, r := d.GetGpuInstanceProfileInfoV2(idx); r == nvml.SUCCESS {
			var b []byte
			for _, c := range v2.Name {
				if c == 0 {
					break
				}
				b = append(b, byte(c))
			}
			p.Name = strings.TrimPrefix(string(b), "MIG ")
		}
		p.Placements, _ = d.GetGpuInstancePossiblePlacements(&info)
		m.Profiles[idx] = p
		list, r := d.GetGpuInstances(&info)
		if r != nvml.SUCCESS {
			continue
		}
		for _, gi := range list {
			gii, r := gi.GetInfo()
			if r != nvml.SUCCESS {
				t.Fatalf("simulated GPU instance info: %v", r)
			}
			gis[int(gii.Id)] = &fakenvml.GPUInstance{ID: int(gii.Id), ProfileID: gii.ProfileId, Placement: gii.Placement}
		}
	}
	for _, md := range d.MIG() {
		var dev fakenvml.MIGDevice
		snapshotDevice(any(md), &dev.Device)
		gi, r1 := md.GetGpuInstanceId()
		ci, r2 := md.GetComputeInstanceId()
		if r1 != nvml.SUCCESS || r2 != nvml.SUCCESS || gis[gi] == nil {
			t.Fatalf("simulated MIG device %s: GPU instance %d (%v), compute instance %d (%v)", dev.UUID, gi, r1, ci, r2)
		}
		dev.GPUInstance, dev.ComputeInstance = gi, ci
		if idx, r := md.GetIndex(); r == nvml.SUCCESS {
			dev.Index = &idx
		}
		x := gis[gi]
		x.ComputeInstances = append(x.ComputeInstances, fakenvml.ComputeInstance{ID: ci, Placement: nvml.ComputeInstancePlacement{Size: x.Placement.Size}})
		m.Devices = append(m.Devices, dev)
	}
	var ids []int
	for id := range gis {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		m.GPUInstances = append(m.GPUInstances, *gis[id])
	}
}

// fixedClock stands the simulator still, so its answers do not move
// between the snapshot and the simulator's own sample.
type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func parsePage(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	f, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// seriesValues flattens a family into "labels" -> value.
func seriesValues(mf *dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mf.Metric {
		var ls []string
		for _, l := range m.Label {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(ls)
		v := math.NaN()
		switch {
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		}
		out["{"+strings.Join(ls, ",")+"}"] = v
	}
	return out
}

// The parity test requires these families on both sides, so that it cannot
// pass by comparing nothing.
var parityCore = []string{
	"gpu_up", "gpu_info", "gpu_driver_info", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization_ratio",
	"gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_sm_clock_hertz", "gpu_memory_clock_hertz",
	"gpu_power_limit_watts", "gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_clock_event_active", "gpu_recovery_action_code",
	"gpu_nvlink_active_links", "gpu_row_remap_banks",
}

// Families that describe the exporter itself or time, not the node.
func ignoredInParity(name string) bool {
	if name == "gpu_last_sample_timestamp_seconds" {
		return true // the simulator's clock stands still
	}
	for _, p := range []string{"gpu_exporter_", "go_", "process_", "promhttp_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// TestParitySimulatorAndFakeDriver runs one scenario through the simulator
// (in process, as gpu-pool-exporter-sim does) and through the fake driver
// library (the agent's binary), and requires the same series and values in
// every family both serve.
func TestParitySimulatorAndFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	sc, err := simnode.LoadScenario(filepath.Join("testdata", "parity.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clk := fixedClock{time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	sim, err := simnode.New(sc, simnode.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	node := nodeFromSim(t, sim)

	full, _ := render.ProfileGroups(render.ProfileFull) // the binary runs with --collector.profile=full
	n, err := collector.Assemble(collector.NodeConfig{Log: zerolog.Nop(), Now: clk.Now, Stepped: true,
		Exporter: collector.Config{Interval: 5 * time.Second, Groups: full},
		Sampler:  nvmlsampler.SamplerConfig{DeviceTimeout: 5 * time.Second}}, collector.Sources{NVML: sim})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	e := n.Exporter
	e.SampleOnce(context.Background())
	simPage := parsePage(t, e.Page().Plain)

	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	x := startExporter(t, fakenvml.Full, path)
	fakePage := x.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_nvlink_active_links"] != nil }, "health families")

	var both, onlySim, onlyFake []string
	for name := range simPage {
		if ignoredInParity(name) {
			continue
		}
		if fakePage[name] != nil {
			both = append(both, name)
		} else {
			onlySim = append(onlySim, name)
		}
	}
	for name := range fakePage {
		if !ignoredInParity(name) && simPage[name] == nil {
			onlyFake = append(onlyFake, name)
		}
	}
	sort.Strings(both)
	sort.Strings(onlySim)
	sort.Strings(onlyFake)
	t.Logf("compared %d families; only the simulator serves %v; only the fake driver serves %v", len(both), onlySim, onlyFake)
	for _, name := range parityCore {
		if simPage[name] == nil || fakePage[name] == nil {
			t.Errorf("%s is not served by both (simulator %v, fake driver %v)", name, simPage[name] != nil, fakePage[name] != nil)
		}
	}
	for _, name := range both {
		a, b := seriesValues(simPage[name]), seriesValues(fakePage[name])
		var diffs []string
		for k, va := range a {
			vb, ok := b[k]
			switch {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("  %s%s only in the simulator (%v)", name, k, va))
			case !(va == vb || math.Abs(va-vb) <= 1e-9*math.Max(math.Abs(va), math.Abs(vb))):
				diffs = append(diffs, fmt.Sprintf("  %s%s simulator %v, fake driver %v", name, k, va, vb))
			}
		}
		for k, vb := range b {
			if _, ok := a[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("  %s%s only in the fake driver (%v)", name, k, vb))
			}
		}
		if len(diffs) > 0 {
			sort.Strings(diffs)
			t.Errorf("%s differs:\n%s", name, strings.Join(diffs, "\n"))
		}
	}
}
