package nvmlsampler

import (
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// procDevice is go-nvml's moq device with the process calls set.
func procDevice(compute, mps, graphics []nvml.ProcessInfo, util []nvml.ProcessUtilizationSample, utilRet nvml.Return) (*mock.Device, *[]uint64) {
	var seen []uint64
	return &mock.Device{
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return compute, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return mps, nvml.SUCCESS },
		GetGraphicsRunningProcessesFunc:   func() ([]nvml.ProcessInfo, nvml.Return) { return graphics, nvml.SUCCESS },
		GetProcessUtilizationFunc: func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			seen = append(seen, last)
			return util, utilRet
		},
	}, &seen
}

func TestReadProcesses(t *testing.T) {
	notAvailable := int64(nvml.VALUE_NOT_AVAILABLE)
	na := uint64(notAvailable) // as NVML writes -1 into an unsigned long long
	d, seen := procDevice(
		[]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 1 << 30}, {Pid: 11, UsedGpuMemory: na}},
		[]nvml.ProcessInfo{{Pid: 12, UsedGpuMemory: 2 << 30}},
		[]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 1 << 30}}, // compute and graphics: one allocation
		[]nvml.ProcessUtilizationSample{{Pid: 10, TimeStamp: 100, SmUtil: 20}, {Pid: 10, TimeStamp: 300, SmUtil: 40}, {Pid: 12, TimeStamp: 200, SmUtil: 7}},
		nvml.SUCCESS)
	last := uint64(50)
	got := readProcesses(d, true, &last)
	want := sample.DeviceProcesses{Known: true, SMKnown: true, Processes: []sample.GPUProcess{
		{PID: 10, MemoryBytes: 1 << 30, MemoryKnown: true, SM: 0.4}, // the latest sample
		{PID: 11, MemoryKnown: false},                               // NVML_VALUE_NOT_AVAILABLE; no sample: 0
		{PID: 12, MemoryBytes: 2 << 30, MemoryKnown: true, SM: 0.07},
	}}
	if len(got.Processes) != 3 || got.Known != want.Known || got.SMKnown != want.SMKnown {
		t.Fatalf("got %+v", got)
	}
	for i := range want.Processes {
		if got.Processes[i] != want.Processes[i] {
			t.Errorf("process %d: got %+v, want %+v", i, got.Processes[i], want.Processes[i])
		}
	}
	if last != 300 || len(*seen) != 1 || (*seen)[0] != 50 {
		t.Errorf("last seen timestamp: passed %v, now %d; want 50 passed, 300 kept", *seen, last)
	}
}

func TestReadProcessesWhatNVMLCannotAnswer(t *testing.T) {
	// No samples since the last read: every process ran no kernels.
	d, _ := procDevice([]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 5}}, nil, nil, nil, nvml.ERROR_NOT_FOUND)
	var last uint64
	if got := readProcesses(d, true, &last); !got.SMKnown || got.Processes[0].SM != 0 {
		t.Errorf("NOT_FOUND: %+v", got)
	}
	// A driver without per-process utilization: activity unknown, memory known.
	d, _ = procDevice([]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 5}}, nil, nil, nil, nvml.ERROR_NOT_SUPPORTED)
	if got := readProcesses(d, true, &last); got.SMKnown || !got.Known {
		t.Errorf("NOT_SUPPORTED: %+v", got)
	}
	// A MIG instance: no graphics list and no utilization call at all.
	d, seen := procDevice([]nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 5, GpuInstanceId: 1}}, nil, nil, nil, nvml.SUCCESS)
	d.GetGraphicsRunningProcessesFunc = nil // moq panics if called
	if got := readProcesses(d, false, &last); got.SMKnown || len(*seen) != 0 || len(got.Processes) != 1 {
		t.Errorf("MIG: %+v, utilization asked %d times", got, len(*seen))
	}
	// The process list itself failing: nothing is known.
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
	if got := readProcesses(d, false, &last); got.Known {
		t.Errorf("list failed: %+v", got)
	}
}
