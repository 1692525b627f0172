package collector_test

// Fault injection driven by the simulator: NVML calls that fail once, a GPU
// lost in the middle of a sample, an XID event set that breaks and is
// re-created. Across all of it counters never decrease, no device vanishes
// for good and every device reports up again once NVML answers.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// faultyNVML wraps a nvmlsampler.NVML and fails chosen calls on chosen devices.
type faultyNVML struct {
	nvmlsampler.NVML

	mu sync.Mutex
	// once fails the next call of a method on a device, then disarms.
	once map[faultKey]nvml.Return
	// lostGPU, when >= 0, is a GPU that answers lostAfter more calls and
	// then GPU_IS_LOST to everything (its handle lookup included) until
	// recover is called.
	lostGPU   int
	lostAfter int
	lost      bool
	// fired counts the calls that were made to fail.
	fired int
}

// faultKey names a method on a device: mig is -1 for the whole GPU, else the
// position of the MIG handle (GetMigDeviceHandleByIndex's index).
type faultKey struct {
	gpu, mig int
	method   string
}

func newFaultyNVML(lib nvmlsampler.NVML) *faultyNVML {
	return &faultyNVML{NVML: lib, once: map[faultKey]nvml.Return{}, lostGPU: -1}
}

// failOnce makes the next call of method on the device fail with ret.
func (f *faultyNVML) failOnce(gpu, mig int, method string, ret nvml.Return) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.once[faultKey{gpu, mig, method}] = ret
}

// loseAfter makes gpu answer n more calls and then GPU_IS_LOST.
func (f *faultyNVML) loseAfter(gpu, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lostGPU, f.lostAfter, f.lost = gpu, n, false
}

// recoverGPU ends the loss (a GPU reset brought it back).
func (f *faultyNVML) recoverGPU() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lostGPU, f.lost = -1, false
}

func (f *faultyNVML) firedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

func (f *faultyNVML) pendingOnce() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.once)
}

// check is called first by every wrapped device method.
func (f *faultyNVML) check(gpu, mig int, method string) nvml.Return {
	f.mu.Lock()
	defer f.mu.Unlock()
	if gpu == f.lostGPU {
		if !f.lost && f.lostAfter > 0 {
			f.lostAfter--
		} else {
			f.lost = true
			f.fired++
			return nvml.ERROR_GPU_IS_LOST
		}
	}
	k := faultKey{gpu, mig, method}
	if ret, ok := f.once[k]; ok {
		delete(f.once, k)
		f.fired++
		return ret
	}
	return nvml.SUCCESS
}

func (f *faultyNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	f.mu.Lock()
	lost := f.lost && i == f.lostGPU
	f.mu.Unlock()
	if lost {
		// As on a GPU that fell off the bus: no handle at all.
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	d, ret := f.NVML.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, ret
	}
	return &faultyDevice{Device: d, f: f, gpu: i, mig: -1}, ret
}

// faultyDevice wraps every method of nvmlsampler.Device.
type faultyDevice struct {
	nvmlsampler.Device
	f        *faultyNVML
	gpu, mig int
}

func (d *faultyDevice) c(m string) nvml.Return { return d.f.check(d.gpu, d.mig, m) }

func (d *faultyDevice) GetUUID() (string, nvml.Return) {
	if r := d.c("GetUUID"); r != nvml.SUCCESS {
		return "", r
	}
	return d.Device.GetUUID()
}

func (d *faultyDevice) GetName() (string, nvml.Return) {
	if r := d.c("GetName"); r != nvml.SUCCESS {
		return "", r
	}
	return d.Device.GetName()
}

func (d *faultyDevice) GetIndex() (int, nvml.Return) {
	if r := d.c("GetIndex"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetIndex()
}

func (d *faultyDevice) GetMinorNumber() (int, nvml.Return) {
	if r := d.c("GetMinorNumber"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetMinorNumber()
}

func (d *faultyDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	if r := d.c("GetPciInfo"); r != nvml.SUCCESS {
		return nvml.PciInfo{}, r
	}
	return d.Device.GetPciInfo()
}

func (d *faultyDevice) GetMigMode() (int, int, nvml.Return) {
	if r := d.c("GetMigMode"); r != nvml.SUCCESS {
		return 0, 0, r
	}
	return d.Device.GetMigMode()
}

func (d *faultyDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	if r := d.c("GetMaxMigDeviceCount"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetMaxMigDeviceCount()
}

func (d *faultyDevice) GetMigDeviceHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	if r := d.c("GetMigDeviceHandleByIndex"); r != nvml.SUCCESS {
		return nil, r
	}
	m, ret := d.Device.GetMigDeviceHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return m, ret
	}
	return &faultyDevice{Device: m, f: d.f, gpu: d.gpu, mig: i}, ret
}

func (d *faultyDevice) GetGpuInstanceId() (int, nvml.Return) {
	if r := d.c("GetGpuInstanceId"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetGpuInstanceId()
}

func (d *faultyDevice) GetComputeInstanceId() (int, nvml.Return) {
	if r := d.c("GetComputeInstanceId"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetComputeInstanceId()
}

func (d *faultyDevice) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	if r := d.c("GetAttributes"); r != nvml.SUCCESS {
		return nvml.DeviceAttributes{}, r
	}
	return d.Device.GetAttributes()
}

func (d *faultyDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if r := d.c("GetMemoryInfo"); r != nvml.SUCCESS {
		return nvml.Memory{}, r
	}
	return d.Device.GetMemoryInfo()
}

// GetMemoryInfo_v2 fails with the same faults as v1: both are "memory info".
func (d *faultyDevice) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	if r := d.c("GetMemoryInfo"); r != nvml.SUCCESS {
		return nvml.Memory_v2{}, r
	}
	return d.Device.GetMemoryInfo_v2()
}

func (d *faultyDevice) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	if r := d.c("GetUtilizationRates"); r != nvml.SUCCESS {
		return nvml.Utilization{}, r
	}
	return d.Device.GetUtilizationRates()
}

func (d *faultyDevice) GetTemperature(s nvml.TemperatureSensors) (uint32, nvml.Return) {
	if r := d.c("GetTemperature"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetTemperature(s)
}

// GetTemperatureV1 fails with the same faults as the older call: both are
// "temperature".
func (d *faultyDevice) GetTemperatureV1() (nvml.Temperature, nvml.Return) {
	if r := d.c("GetTemperature"); r != nvml.SUCCESS {
		return nvml.Temperature{}, r
	}
	return d.Device.GetTemperatureV1()
}

func (d *faultyDevice) GetPowerUsage() (uint32, nvml.Return) {
	if r := d.c("GetPowerUsage"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetPowerUsage()
}

func (d *faultyDevice) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	if r := d.c("GetTotalEnergyConsumption"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetTotalEnergyConsumption()
}

func (d *faultyDevice) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	if r := d.c("GetClockInfo"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetClockInfo(t)
}

func (d *faultyDevice) GetCurrPcieLinkGeneration() (int, nvml.Return) {
	if r := d.c("GetCurrPcieLinkGeneration"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetCurrPcieLinkGeneration()
}

func (d *faultyDevice) GetCurrPcieLinkWidth() (int, nvml.Return) {
	if r := d.c("GetCurrPcieLinkWidth"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetCurrPcieLinkWidth()
}

func (d *faultyDevice) GetTotalEccErrors(e nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	if r := d.c("GetTotalEccErrors"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetTotalEccErrors(e, c)
}

func (d *faultyDevice) GetRetiredPages(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	if r := d.c("GetRetiredPages"); r != nvml.SUCCESS {
		return nil, r
	}
	return d.Device.GetRetiredPages(c)
}

func (d *faultyDevice) GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return) {
	if r := d.c("GetRetiredPagesPendingStatus"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetRetiredPagesPendingStatus()
}

func (d *faultyDevice) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	if r := d.c("GetRemappedRows"); r != nvml.SUCCESS {
		return 0, 0, false, false, r
	}
	return d.Device.GetRemappedRows()
}

func (d *faultyDevice) GetRowRemapperHistogram() (nvml.RowRemapperHistogramValues, nvml.Return) {
	if r := d.c("GetRowRemapperHistogram"); r != nvml.SUCCESS {
		return nvml.RowRemapperHistogramValues{}, r
	}
	return d.Device.GetRowRemapperHistogram()
}

func (d *faultyDevice) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	if r := d.c("GetCurrentClocksEventReasons"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetCurrentClocksEventReasons()
}

func (d *faultyDevice) GetPcieReplayCounter() (int, nvml.Return) {
	if r := d.c("GetPcieReplayCounter"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetPcieReplayCounter()
}

func (d *faultyDevice) GetNvLinkState(link int) (nvml.EnableState, nvml.Return) {
	if r := d.c("GetNvLinkState"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetNvLinkState(link)
}

func (d *faultyDevice) GetNvLinkErrorCounter(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	if r := d.c("GetNvLinkErrorCounter"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetNvLinkErrorCounter(link, c)
}

func (d *faultyDevice) GetPowerManagementLimit() (uint32, nvml.Return) {
	if r := d.c("GetPowerManagementLimit"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetPowerManagementLimit()
}

func (d *faultyDevice) GetTemperatureThreshold(t nvml.TemperatureThresholds) (uint32, nvml.Return) {
	if r := d.c("GetTemperatureThreshold"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetTemperatureThreshold(t)
}

func (d *faultyDevice) GetFieldValues(fv []nvml.FieldValue) nvml.Return {
	if r := d.c("GetFieldValues"); r != nvml.SUCCESS {
		return r
	}
	return d.Device.GetFieldValues(fv)
}

func (d *faultyDevice) GetNumaNodeId() (int, nvml.Return) {
	if r := d.c("GetNumaNodeId"); r != nvml.SUCCESS {
		return 0, r
	}
	return d.Device.GetNumaNodeId()
}

func (d *faultyDevice) GetGpuInstanceProfileInfo(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if r := d.c("GetGpuInstanceProfileInfo"); r != nvml.SUCCESS {
		return nvml.GpuInstanceProfileInfo{}, r
	}
	return d.Device.GetGpuInstanceProfileInfo(p)
}

func (d *faultyDevice) GetGpuInstancePossiblePlacements(p *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	if r := d.c("GetGpuInstancePossiblePlacements"); r != nvml.SUCCESS {
		return nil, r
	}
	return d.Device.GetGpuInstancePossiblePlacements(p)
}

func (d *faultyDevice) GetGpuInstances(p *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	if r := d.c("GetGpuInstances"); r != nvml.SUCCESS {
		return nil, r
	}
	return d.Device.GetGpuInstances(p)
}

var _ nvmlsampler.Device = (*faultyDevice)(nil)

// flakyEvents wraps an XID event source: while broken, Open fails once and
// every Wait fails, as an NVML event set does when the driver resets it.
type flakyEvents struct {
	src xid.EventSource

	mu        sync.Mutex
	broken    bool
	openFails int
	waitFails int
}

var errEventSetBroken = errors.New("NVML event set wait: Unknown Error")

func (f *flakyEvents) breakSet() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken, f.openFails = true, 1
}

func (f *flakyEvents) repair() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = false
}

func (f *flakyEvents) failedWaits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waitFails
}

func (f *flakyEvents) Open() (xid.Waiter, error) {
	f.mu.Lock()
	if f.broken && f.openFails > 0 {
		f.openFails--
		f.mu.Unlock()
		return nil, errors.New("creating an NVML event set: Unknown Error")
	}
	f.mu.Unlock()
	w, err := f.src.Open()
	if err != nil {
		return nil, err
	}
	return &flakyWaiter{f: f, w: w}, nil
}

type flakyWaiter struct {
	f *flakyEvents
	w xid.Waiter
}

func (w *flakyWaiter) Wait(timeout time.Duration) (xid.Event, error) {
	w.f.mu.Lock()
	broken := w.f.broken
	if broken {
		w.f.waitFails++
	}
	w.f.mu.Unlock()
	if broken {
		time.Sleep(time.Millisecond) // a broken set answers at once; do not spin
		return xid.Event{}, errEventSetBroken
	}
	return w.w.Wait(timeout)
}

func (w *flakyWaiter) Close() error { return nil }

// faultNode is a simulated node behind faultyNVML, with its fake kubelet, a
// podmap client, an XID reader on a flaky event set and an exporter.
type faultNode struct {
	*testNode
	lib    *faultyNVML
	events *flakyEvents
}

func newFaultNode(t *testing.T, sc *simnode.Scenario) *faultNode {
	t.Helper()
	fn := &faultNode{}
	fn.testNode = newTestExporter(t, withScenario(sc), withKubelet(), withPodMapOnWallClock(),
		withNVML(func(n nvmlsampler.NVML) nvmlsampler.NVML {
			fn.lib = newFaultyNVML(n)
			return fn.lib
		}),
		withNodeXIDSource(func(n *simnode.Node) xid.EventSource {
			fn.events = &flakyEvents{src: n.XIDSource()}
			return fn.events
		}, func(r *xid.Reader) {
			r.WaitTimeout = 10 * time.Millisecond
			r.MinBackoff = 2 * time.Millisecond
			r.MaxBackoff = 10 * time.Millisecond
		}),
		withSamplerConfig(func(c *nvmlsampler.SamplerConfig) { c.DeviceTimeout = 2 * time.Second }),
		withDerived(state.DerivedConfig{Idle: fragmentation.IdleConfig{Threshold: 0.05, Window: fragmentation.MinIdleWindow}}))
	return fn
}

// step moves the clock by d, refreshes the pods, waits (bounded) until the
// XID reader has seen wantEvents events, takes a sample and scrapes it.
func (fn *faultNode) step(t *testing.T, d time.Duration, wantEvents uint64) map[string]*dto.MetricFamily {
	t.Helper()
	fn.clk.Advance(d)
	fn.kube.SetPods(fn.node.KubeletPods())
	fn.kube.SetAllocatable(fn.node.KubeletAllocatable())
	if err := fn.client.Refresh(context.Background()); err != nil {
		t.Fatalf("kubelet refresh: %v", err)
	}
	waitFor(t, describe(func() string {
		return fmt.Sprintf("the XID reader to see %d events: saw %d (up %v, last error %v)",
			wantEvents, fn.reader.Events(), fn.reader.Up(), fn.reader.LastError())
	}), func() bool { return fn.reader.Events() >= wantEvents })
	fn.e.SampleOnce(context.Background())
	rec := httptest.NewRecorder()
	fn.e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape answered %d", rec.Code)
	}
	return fltParse(t, rec.Body.Bytes())
}

// parseExposition parses a text exposition strictly.
func fltParse(t testing.TB, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("exposition does not parse: %v", err)
	}
	return mfs
}

// seriesKey is "name{a="x",b="y"}" with labels sorted.
func fltKey(name string, m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

func fltLabels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// metricValue is a sample's value whatever the family's type.
func fltValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// find returns the series of a family whose labels include want.
func fltFind(mfs map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		l := fltLabels(m)
		for k, v := range want {
			if l[k] != v {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

// fltOne is the one series of a family whose labels include want.
func fltOne(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	s := fltFind(mfs, name, want)
	if len(s) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(s))
	}
	return s[0]
}

// fltMonotonic remembers every counter series and fails when one decreases.
type fltMonotonic struct {
	last map[string]float64
	seen map[string]bool // families seen
}

func newFltMonotonic() *fltMonotonic {
	return &fltMonotonic{last: map[string]float64{}, seen: map[string]bool{}}
}

func (mo *fltMonotonic) check(t *testing.T, step string, mfs map[string]*dto.MetricFamily) {
	t.Helper()
	for name, mf := range mfs {
		if mf.GetType() != dto.MetricType_COUNTER {
			continue
		}
		mo.seen[name] = true
		for _, m := range mf.GetMetric() {
			k := fltKey(name, m)
			v := m.GetCounter().GetValue()
			if prev, ok := mo.last[k]; ok && v < prev {
				t.Errorf("%s: counter %s went down from %v to %v", step, k, prev, v)
			}
			mo.last[k] = v
		}
	}
}

const fltScenario = `
node: {model: H100-SXM5-80GB, count: 4}
gpus:
  - {index: 0, workload: {preset: busy}}
  - {index: 1, workload: {preset: idle-held}}
  - {index: 2, workload: {preset: training}}
  - index: 3
    mig:
      - {profile: 3g.40gb, workload: {preset: training}}
      - {profile: 1g.10gb, workload: {preset: idle-held}}
pods:
  - {namespace: ml, name: trainer, containers: [{name: c, devices: [{gpu: 0}]}]}
  - {namespace: research, name: notebook, containers: [{name: c, devices: [{gpu: 1}]}]}
  - {namespace: ml, name: lost-job, containers: [{name: c, devices: [{gpu: 2}]}]}
  - {namespace: inference, name: small, containers: [{name: c, devices: [{gpu: 3, mig: 1}]}]}
faults:
  - {at: 12s, gpu: 0, xid: 13, count: 2}
  - {at: 112s, gpu: 3, xid: 94, count: 3}
`

// fltXIDEventsBy is how many XID events the scenario raised before elapsed.
func fltXIDEventsBy(elapsed time.Duration) uint64 {
	var n uint64
	if elapsed > 12*time.Second {
		n += 2
	}
	if elapsed > 112*time.Second {
		n += 3
	}
	return n
}

func TestFaultsKeepDevicesAndCounters(t *testing.T) {
	sc, err := simnode.ParseScenario("faults.yaml", []byte(fltScenario))
	if err != nil {
		t.Fatal(err)
	}
	fn := newFaultNode(t, sc)
	mono := newFltMonotonic()
	var elapsed time.Duration
	stepN := 0
	step := func(what string) map[string]*dto.MetricFamily {
		t.Helper()
		stepN++
		elapsed += 5 * time.Second
		mfs := fn.step(t, 5*time.Second, fltXIDEventsBy(elapsed))
		mono.check(t, fmt.Sprintf("step %d (%s)", stepN, what), mfs)
		return mfs
	}
	gpuUp := func(mfs map[string]*dto.MetricFamily, gpu, gi string) float64 {
		t.Helper()
		return fltValue(fltOne(t, mfs, "gpu_up", map[string]string{"gpu": gpu, "gpu_instance": gi}))
	}
	has := func(mfs map[string]*dto.MetricFamily, name, gpu string) bool {
		return len(fltFind(mfs, name, map[string]string{"gpu": gpu, "gpu_instance": ""})) == 1
	}

	first := step("start")
	// Identity of every device: its gpu_info and gpu_up series as first seen.
	infos := map[string]string{}
	for _, m := range first["gpu_info"].GetMetric() {
		infos[fltLabels(m)["gpu"]] = fltKey("gpu_info", m)
	}
	if len(infos) != 4 {
		t.Fatalf("%d gpu_info series, want 4", len(infos))
	}
	upSeries := map[string]bool{}
	for _, m := range first["gpu_up"].GetMetric() {
		upSeries[fltKey("gpu_up", m)] = true
		if fltValue(m) != 1 {
			t.Errorf("before any fault: %s = %v", fltKey("gpu_up", m), fltValue(m))
		}
	}
	if len(upSeries) != 6 { // 4 GPUs and 2 MIG instances
		t.Fatalf("%d gpu_up series, want 6", len(upSeries))
	}
	migInfos := map[string]bool{}
	for _, m := range first["gpu_mig_info"].GetMetric() {
		migInfos[fltKey("gpu_mig_info", m)] = true
	}
	if len(migInfos) != 2 {
		t.Fatalf("%d gpu_mig_info series, want 2", len(migInfos))
	}
	// checkIdentity: every GPU keeps exactly its gpu_info series, and every
	// device its gpu_up series (up or not).
	checkIdentity := func(what string, mfs map[string]*dto.MetricFamily) {
		t.Helper()
		got := map[string]string{}
		for _, m := range mfs["gpu_info"].GetMetric() {
			g := fltLabels(m)["gpu"]
			if _, dup := got[g]; dup {
				t.Errorf("%s: GPU %s has two gpu_info series", what, g)
			}
			got[g] = fltKey("gpu_info", m)
		}
		for g, want := range infos {
			if got[g] != want {
				t.Errorf("%s: GPU %s identity changed:\n  was %s\n  now %q", what, g, want, got[g])
			}
		}
		present := map[string]bool{}
		for _, m := range mfs["gpu_up"].GetMetric() {
			present[fltKey("gpu_up", m)] = true
		}
		for k := range upSeries {
			if !present[k] {
				t.Errorf("%s: %s is gone", what, k)
			}
		}
		migNow := map[string]bool{}
		for _, m := range mfs["gpu_mig_info"].GetMetric() {
			migNow[fltKey("gpu_mig_info", m)] = true
		}
		for k := range migInfos {
			if !migNow[k] {
				t.Errorf("%s: %s is gone", what, k)
			}
		}
	}
	checkIdentity("start", first)
	step("warm up")
	step("warm up")

	// 1. One GetTemperature fails: that field is skipped for that sample only.
	fn.lib.failOnce(0, -1, "GetTemperature", nvml.ERROR_UNKNOWN)
	mfs := step("temperature read fails once")
	if fn.lib.pendingOnce() != 0 {
		t.Fatal("the temperature fault never fired")
	}
	if has(mfs, "gpu_temperature_celsius", "0") {
		t.Error("GPU 0 reports a temperature in the sample whose read failed")
	}
	if gpuUp(mfs, "0", "") != 1 || !has(mfs, "gpu_power_watts", "0") || !has(mfs, "gpu_memory_used_bytes", "0") {
		t.Error("one failed field took GPU 0's other readings down")
	}
	checkIdentity("temperature fault", mfs)
	mfs = step("after temperature fault")
	if !has(mfs, "gpu_temperature_celsius", "0") {
		t.Error("GPU 0's temperature did not come back the next sample")
	}

	// 2. One GetMemoryInfo fails: the device is down for that sample only.
	fn.lib.failOnce(1, -1, "GetMemoryInfo", nvml.ERROR_UNKNOWN)
	mfs = step("memory read fails once")
	if fn.lib.pendingOnce() != 0 {
		t.Fatal("the memory fault never fired")
	}
	if gpuUp(mfs, "1", "") != 0 {
		t.Error("GPU 1 is up in the sample whose memory read failed")
	}
	if gpuUp(mfs, "0", "") != 1 || gpuUp(mfs, "2", "") != 1 {
		t.Error("one GPU's failure took another down")
	}
	checkIdentity("memory fault", mfs)
	mfs = step("after memory fault")
	if gpuUp(mfs, "1", "") != 1 {
		t.Error("GPU 1 did not come back the next sample")
	}

	// 3. One MIG instance's memory read fails: that instance only is down.
	fn.lib.failOnce(3, 1, "GetMemoryInfo", nvml.ERROR_UNKNOWN)
	mfs = step("MIG memory read fails once")
	if fn.lib.pendingOnce() != 0 {
		t.Fatal("the MIG memory fault never fired")
	}
	gi := fltLabels(fltOne(t, first, "gpu_mig_info", map[string]string{"gpu": "3", "mig_profile": "1g.10gb"}))["gpu_instance"]
	if gpuUp(mfs, "3", gi) != 0 {
		t.Errorf("MIG instance %s is up in the sample whose memory read failed", gi)
	}
	if gpuUp(mfs, "3", "") != 1 {
		t.Error("a MIG instance's failure took its GPU down")
	}
	checkIdentity("MIG fault", mfs)
	mfs = step("after MIG fault")
	if gpuUp(mfs, "3", gi) != 1 {
		t.Error("the MIG instance did not come back the next sample")
	}

	// 4. The XID event set breaks: the reader re-creates it, and counts
	// neither restart nor re-open.
	fn.events.breakSet()
	waitFor(t, describe(func() string {
		return fmt.Sprintf("3 failed waits on the broken event set and the reader down: %d failed waits (reader up %v)", fn.events.failedWaits(), fn.reader.Up())
	}), func() bool { return fn.events.failedWaits() >= 3 && !fn.reader.Up() })
	mfs = step("event set broken")
	if v := fltValue(fltOne(t, mfs, "gpu_exporter_collector_up", map[string]string{"collector": "xid"})); v != 0 {
		t.Errorf("xid collector up = %v while its event set fails", v)
	}
	if got := fltSum(mfs, "gpu_xid_errors_total"); got != 2 {
		t.Errorf("%v XID errors counted while the set is broken, want the 2 counted before", got)
	}
	fn.events.repair()
	waitFor(t, describe(func() string {
		return fmt.Sprintf("the XID reader to recover (last error %v)", fn.reader.LastError())
	}), fn.reader.Up)
	if fn.reader.Recreated() < 1 {
		t.Errorf("the event set was re-created %d times", fn.reader.Recreated())
	}

	// 5. GPU 2 is lost in the middle of a sample: four calls answer, the
	// fifth and every one after says GPU_IS_LOST. Nothing read before the
	// loss is reported; GPU 2 keeps its identity, the others keep reporting.
	fn.lib.loseAfter(2, 4)
	for i := 0; i < 5; i++ {
		mfs = step(fmt.Sprintf("GPU 2 lost, sample %d", i+1))
		if gpuUp(mfs, "2", "") != 0 {
			t.Errorf("lost sample %d: GPU 2 up", i+1)
		}
		for _, f := range []string{"gpu_memory_used_bytes", "gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_utilization_ratio"} {
			if has(mfs, f, "2") {
				t.Errorf("lost sample %d: GPU 2 still reports %s", i+1, f)
			}
		}
		for _, g := range []string{"0", "1", "3"} {
			if gpuUp(mfs, g, "") != 1 {
				t.Errorf("lost sample %d: GPU %s down with GPU 2", i+1, g)
			}
		}
		up := fltOne(t, mfs, "gpu_up", map[string]string{"gpu": "2", "gpu_instance": ""})
		if want := fltLabels(fltOne(t, first, "gpu_info", map[string]string{"gpu": "2"}))["uuid"]; fltLabels(up)["uuid"] != want {
			t.Errorf("lost sample %d: the lost GPU's gpu_up changed its uuid to %q", i+1, fltLabels(up)["uuid"])
		}
		checkIdentity(fmt.Sprintf("lost sample %d", i+1), mfs)
	}
	if fn.lib.firedCount() < 5 {
		t.Fatalf("the lost GPU fault fired %d times", fn.lib.firedCount())
	}
	fn.lib.recoverGPU()
	mfs = step("GPU 2 back")
	if gpuUp(mfs, "2", "") != 1 {
		t.Error("GPU 2 did not report up in the first sample after it came back")
	}
	checkIdentity("GPU 2 back", mfs)

	// 6. GPU 3, in MIG mode, is lost in the middle of a sample too: it and
	// both its instances report down under the same labels, and come back.
	fired := fn.lib.firedCount()
	fn.lib.loseAfter(3, 2)
	for i := 0; i < 4; i++ {
		mfs = step(fmt.Sprintf("GPU 3 lost, sample %d", i+1))
		for _, gi := range []string{"", "1", "11"} { // the whole GPU, its 3g.40gb at 0:4 and its 1g.10gb at 4:1
			if s := fltFind(mfs, "gpu_up", map[string]string{"gpu": "3", "gpu_instance": gi}); len(s) != 1 || fltValue(s[0]) != 0 {
				t.Errorf("MIG GPU lost, sample %d: gpu_up{gpu=3,gpu_instance=%q} is %v, want one series at 0", i+1, gi, s)
			}
		}
		if has(mfs, "gpu_memory_used_bytes", "3") {
			t.Errorf("MIG GPU lost, sample %d: GPU 3 still reports memory", i+1)
		}
		checkIdentity(fmt.Sprintf("MIG GPU lost, sample %d", i+1), mfs)
	}
	if fn.lib.firedCount() <= fired {
		t.Fatal("the MIG GPU loss never fired")
	}
	fn.lib.recoverGPU()
	mfs = step("GPU 3 back")
	for _, gi := range []string{"", "1", "11"} { // the whole GPU, its 3g.40gb at 0:4 and its 1g.10gb at 4:1
		if gpuUp(mfs, "3", gi) != 1 {
			t.Errorf("GPU 3 (gpu_instance %q) did not report up in the first sample after it came back", gi)
		}
	}
	checkIdentity("GPU 3 back", mfs)

	// 7. Run on past the last XID: events after the set's recovery are all
	// counted, and every device is up.
	for elapsed < 120*time.Second {
		mfs = step("after the faults")
		checkIdentity(fmt.Sprintf("step %d", stepN), mfs)
	}
	if got := fltSum(mfs, "gpu_xid_errors_total"); got != 5 {
		t.Errorf("%v XID errors counted, want 5 (2 before the set broke, 3 after it recovered)", got)
	}
	if v := fltValue(fltOne(t, mfs, "gpu_xid_errors_total", map[string]string{"gpu": "3", "xid": "94"})); v != 3 {
		t.Errorf("XID 94 on GPU 3 after the recovery = %v, want 3", v)
	}
	for _, m := range mfs["gpu_up"].GetMetric() {
		if fltValue(m) != 1 {
			t.Errorf("at the end %s = %v", fltKey("gpu_up", m), fltValue(m))
		}
		delete(upSeries, fltKey("gpu_up", m))
	}
	for k := range upSeries {
		t.Errorf("at the end %s is gone for good", k)
	}
	for _, f := range []string{"gpu_energy_joules_total", "gpu_xid_errors_total", "gpu_allocation_idle_seconds_total"} {
		if !mono.seen[f] {
			t.Errorf("counter %s never appeared; its monotonicity was not checked", f)
		}
	}
	if v := fltValue(fltOne(t, mfs, "gpu_allocation_idle_seconds_total", map[string]string{"pod": "notebook"})); v <= 0 {
		t.Errorf("the idle notebook accrued %v idle seconds", v)
	}
}

func fltSum(mfs map[string]*dto.MetricFamily, name string) float64 {
	var s float64
	for _, m := range mfs[name].GetMetric() {
		s += fltValue(m)
	}
	return s
}
