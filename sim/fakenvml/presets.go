package fakenvml

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// FromModel returns a GPU of a model from go-nvml's mock catalogue (name,
// memory, architecture, PCI device ID) with plausible idle telemetry, every
// board feature an SXM data-centre GPU has, and MIG disabled. index numbers
// its UUID, bus ID and minor. MIG profiles, names and placements come from
// the MIG geometry table (miggeometry), not from go-nvml's mock nor from the
// exporter's own naming: a model the table does not list has no MIG. A
// model the table lists has the framebuffer and PCI device ID NVML reports
// on that board.
func FromModel(cfg gpus.Config, index int) GPU {
	geo, mig := miggeometry.ByNVMLName(cfg.Name)
	if mig {
		cfg.MemoryMB, cfg.PciDeviceId = geo.MemoryMiB, geo.PCIDeviceID
	}
	total := cfg.MemoryMB << 20
	reserved := uint64(512 << 20)
	g := GPU{
		Device: Device{
			UUID:        fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", 0xfa4e0000+index, index),
			Name:        cfg.Name,
			Memory:      &Memory{Total: total, Reserved: reserved, Used: 0},
			Utilization: &nvml.Utilization{Gpu: 0, Memory: 0},
			Attributes:  &nvml.DeviceAttributes{MemorySizeMB: cfg.MemoryMB},
			Processes:   &Processes{},
		},
		Serial:            fmt.Sprintf("16520%08d", index),
		Minor:             index,
		PCIBusID:          fmt.Sprintf("00000000:%02X:00.0", 0x18+index*0x10),
		PCIDeviceID:       cfg.PciDeviceId,
		Architecture:      cfg.Architecture,
		ComputeCapability: &[2]int{cfg.CudaMajor, cfg.CudaMinor},
		Clocks:            map[nvml.ClockType]uint32{nvml.CLOCK_SM: 345, nvml.CLOCK_MEM: 1593, nvml.CLOCK_GRAPHICS: 345},
		MaxClocks:         map[nvml.ClockType]uint32{nvml.CLOCK_SM: 1980, nvml.CLOCK_MEM: 2619},
		PowerUsage:        Ptr[uint32](70_000),
		PowerLimit:        Ptr[uint32](700_000),
		EnforcedLimit:     Ptr[uint32](700_000),
		Energy:            Ptr[uint64](6_048_000_000),
		Temperatures:      map[nvml.TemperatureSensors]uint32{nvml.TEMPERATURE_GPU: 31},
		Thresholds: map[nvml.TemperatureThresholds]uint32{
			nvml.TEMPERATURE_THRESHOLD_SHUTDOWN: 92, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN: 89, nvml.TEMPERATURE_THRESHOLD_GPU_MAX: 87,
		},
		PCIe:                       &PCIe{Gen: 5, Width: 16, MaxGen: 5, MaxWidth: 16},
		ECC:                        &ECC{Enabled: true},
		RemappedRows:               &RemappedRows{},
		RemapperHistogram:          &[5]uint32{640, 0, 0, 0, 0},
		ClockEventReasons:          Ptr[uint64](nvml.ClocksEventReasonGpuIdle),
		SupportedClockEventReasons: Ptr[uint64](0x1ff),
		Fields:                     map[uint32]uint64{nvml.FI_DEV_GET_GPU_RECOVERY_ACTION: uint64(nvml.GPU_RECOVERY_ACTION_NONE)},
	}
	for l := 0; l < 18; l++ {
		g.NVLinks = append(g.NVLinks, NVLink{Active: true, Errors: map[nvml.NvLinkErrorCounter]uint64{
			nvml.NVLINK_ERROR_DL_REPLAY: 0, nvml.NVLINK_ERROR_DL_RECOVERY: 0, nvml.NVLINK_ERROR_DL_CRC_FLIT: 0, nvml.NVLINK_ERROR_DL_CRC_DATA: 0,
		}})
	}
	if mig {
		g.MIG = migFromGeometry(geo)
	}
	return g
}

// migFromGeometry is a model's MIG profiles as the table lists them, MIG
// disabled.
func migFromGeometry(geo *miggeometry.Model) *MIG {
	m := &MIG{Profiles: map[int]GPUInstanceProfile{}, MaxDevices: geo.MaxInstances, geo: geo}
	for _, p := range geo.Profiles {
		info := nvml.GpuInstanceProfileInfo{Id: uint32(p.ID), SliceCount: uint32(p.Compute), InstanceCount: uint32(p.Count),
			MultiprocessorCount: uint32(p.Compute * 16), CopyEngineCount: uint32(p.Compute), MemorySizeMB: p.MemoryMiB}
		gp := GPUInstanceProfile{Info: info, Name: p.Name}
		for _, pl := range p.Placements() {
			gp.Placements = append(gp.Placements, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
		}
		m.Profiles[p.Index] = gp
	}
	return m
}

// AddGPUInstance enables MIG and creates a GPU instance of the profile at
// its first free placement, with computeInstances compute instances of
// equal size (slices/computeInstances each, e.g. two 1c.3g.40gb in a
// 3g.40gb; one MIG device each). With computeInstances 0 the GPU instance
// stands alone (nvidia-smi mig -cgi without -C): it holds its placement,
// and with no compute instance there is no MIG device to list. It fails as
// the driver does when no placement is free or the profile's instance
// limit is reached.
func (g *GPU) AddGPUInstance(profileIndex, computeInstances int) (*GPUInstance, error) {
	if g.MIG == nil {
		return nil, fmt.Errorf("%s does not support MIG", g.Name)
	}
	p, ok := g.MIG.Profiles[profileIndex]
	if !ok {
		return nil, fmt.Errorf("%s has no MIG profile index %d", g.Name, profileIndex)
	}
	if computeInstances < 0 || computeInstances > int(p.Info.SliceCount) {
		return nil, fmt.Errorf("%d compute instances do not fit %d slices", computeInstances, p.Info.SliceCount)
	}
	g.MIG.Enabled = true
	var used uint64
	same := 0
	for _, gi := range g.MIG.GPUInstances {
		for s := gi.Placement.Start; s < gi.Placement.Start+gi.Placement.Size; s++ {
			used |= 1 << s
		}
		if gi.ProfileID == p.Info.Id {
			same++
		}
	}
	if same >= int(p.Info.InstanceCount) {
		return nil, fmt.Errorf("%s: profile %s allows %d instance(s) per GPU", g.Name, p.Name, p.Info.InstanceCount)
	}
	var place *nvml.GpuInstancePlacement
	for _, pl := range p.Placements {
		var m uint64
		for s := pl.Start; s < pl.Start+pl.Size; s++ {
			m |= 1 << s
		}
		if used&m == 0 {
			place = &pl
			break
		}
	}
	if place == nil {
		return nil, fmt.Errorf("%s: no free placement for %s", g.Name, p.Name)
	}
	id := g.MIG.instanceID(*place)
	g.MIG.GPUInstances = append(g.MIG.GPUInstances, GPUInstance{ID: id, ProfileID: p.Info.Id, Placement: *place})
	sort.Slice(g.MIG.GPUInstances, func(i, j int) bool { return g.MIG.GPUInstances[i].ID < g.MIG.GPUInstances[j].ID })
	if err := g.createComputeInstances(id, computeInstances, g.MIG.created<<16); err != nil {
		return nil, err
	}
	g.MIG.created++
	// Real MIG GPUs answer no utilisation on the parent.
	g.Utilization = nil
	return g.MIG.instance(id), nil
}

func (m *MIG) instance(id int) *GPUInstance {
	for i := range m.GPUInstances {
		if m.GPUInstances[i].ID == id {
			return &m.GPUInstances[i]
		}
	}
	return nil
}

// CreateComputeInstances creates n compute instances of equal size
// (slices/n each) in a GPU instance that has none (nvidia-smi mig -cci
// after -cgi without -C), one MIG device each, with UUIDs no earlier
// device had.
func (g *GPU) CreateComputeInstances(giID, n int) error {
	if g.MIG == nil {
		return fmt.Errorf("%s does not support MIG", g.Name)
	}
	g.MIG.ciCreated++
	return g.createComputeInstances(giID, n, g.MIG.created<<16|g.MIG.ciCreated<<8)
}

// createComputeInstances makes the compute instances; serial|c is the last
// field of the UUID of compute instance c.
func (g *GPU) createComputeInstances(giID, n, serial int) error {
	if g.MIG == nil {
		return fmt.Errorf("%s does not support MIG", g.Name)
	}
	gi := g.MIG.instance(giID)
	if gi == nil {
		return fmt.Errorf("%s has no GPU instance %d", g.Name, giID)
	}
	if len(gi.ComputeInstances) > 0 {
		return fmt.Errorf("GPU instance %d already has %d compute instances", giID, len(gi.ComputeInstances))
	}
	var p GPUInstanceProfile
	for _, x := range g.MIG.Profiles {
		if x.Info.Id == gi.ProfileID {
			p = x
		}
	}
	if n < 0 || n > int(p.Info.SliceCount) {
		return fmt.Errorf("%d compute instances do not fit %d slices", n, p.Info.SliceCount)
	}
	per := p.Info.SliceCount / uint32(max(1, n))
	ciIndex := map[uint32]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[per]
	ciName := fmt.Sprintf("%dc.%s", per, p.Name)
	if per == p.Info.SliceCount {
		ciName = p.Name
	}
	gi.ComputeProfiles = map[int]ComputeInstanceProfile{ciIndex: {Name: ciName, Info: nvml.ComputeInstanceProfileInfo{
		Id: uint32(ciIndex), SliceCount: per, InstanceCount: uint32(max(1, n)),
		MultiprocessorCount: p.Info.MultiprocessorCount / uint32(max(1, n)), SharedCopyEngineCount: p.Info.CopyEngineCount,
	}}}
	memTotal := p.Info.MemorySizeMB << 20
	for c := 0; c < n; c++ {
		gi.ComputeInstances = append(gi.ComputeInstances, ComputeInstance{ID: c, ProfileID: uint32(ciIndex),
			Placement: nvml.ComputeInstancePlacement{Start: uint32(c) * per, Size: per}})
		g.MIG.Devices = append(g.MIG.Devices, MIGDevice{
			Device: Device{
				UUID:   fmt.Sprintf("MIG-%08x-%04x-4000-8000-%012x", 0xfa4e0000+g.Minor, giID, serial|c),
				Name:   fmt.Sprintf("%s MIG %s", g.Name, ciName),
				Memory: &Memory{Total: memTotal, Used: 0},
				Attributes: &nvml.DeviceAttributes{MultiprocessorCount: p.Info.MultiprocessorCount / uint32(n),
					SharedCopyEngineCount: p.Info.CopyEngineCount, GpuInstanceSliceCount: p.Info.SliceCount,
					ComputeInstanceSliceCount: per, MemorySizeMB: p.Info.MemorySizeMB},
				Processes: &Processes{},
			},
			GPUInstance: giID, ComputeInstance: c,
		})
	}
	return nil
}

// RemoveComputeInstances destroys every compute instance of a GPU
// instance and their MIG devices (nvidia-smi mig -dci): the GPU instance
// stays, holding its slices, with no MIG device to list.
func (g *GPU) RemoveComputeInstances(giID int) error {
	if g.MIG == nil {
		return fmt.Errorf("%s does not support MIG", g.Name)
	}
	gi := g.MIG.instance(giID)
	if gi == nil {
		return fmt.Errorf("%s has no GPU instance %d", g.Name, giID)
	}
	gi.ComputeInstances, gi.ComputeProfiles = nil, nil
	devs := g.MIG.Devices[:0]
	for _, d := range g.MIG.Devices {
		if d.GPUInstance != giID {
			devs = append(devs, d)
		}
	}
	g.MIG.Devices = devs
	return nil
}

// instanceID is the ID of a new GPU instance at place: the driver's, from
// the placement, on a board of the geometry table; otherwise the lowest
// free ID from 1.
func (m *MIG) instanceID(place nvml.GpuInstancePlacement) int {
	if m.geo != nil {
		return m.geo.GPUInstanceID(miggeometry.Placement{Start: int(place.Start), Size: int(place.Size)})
	}
	ids := map[int]bool{}
	for _, gi := range m.GPUInstances {
		ids[gi.ID] = true
	}
	id := 1
	for ids[id] {
		id++
	}
	return id
}

// RemoveGPUInstance destroys a GPU instance, its compute instances and
// their MIG devices (nvidia-smi mig -dci, then -dgi). MIG stays enabled.
// The MIG devices left keep their order; a later AddGPUInstance may reuse
// the instance ID, with new UUIDs.
func (g *GPU) RemoveGPUInstance(id int) error {
	if g.MIG == nil {
		return fmt.Errorf("%s does not support MIG", g.Name)
	}
	kept := g.MIG.GPUInstances[:0]
	found := false
	for _, gi := range g.MIG.GPUInstances {
		if gi.ID == id {
			found = true
			continue
		}
		kept = append(kept, gi)
	}
	if !found {
		return fmt.Errorf("%s has no GPU instance %d", g.Name, id)
	}
	g.MIG.GPUInstances = kept
	devs := g.MIG.Devices[:0]
	for _, d := range g.MIG.Devices {
		if d.GPUInstance != id {
			devs = append(devs, d)
		}
	}
	g.MIG.Devices = devs
	return nil
}

// NewNode returns a node of count GPUs of one model, on a driver of branch
// (one of Branches, or Full for the newest).
func NewNode(cfg gpus.Config, count int, branch string) *Node {
	n := &Node{DriverVersion: "580.65.06", NVMLVersion: "13.580.65.06", CUDADriverVersion: 13000}
	switch branch {
	case "r470":
		n.DriverVersion, n.NVMLVersion, n.CUDADriverVersion = "470.256.02", "11.470.256.02", 11040
	case "r535":
		n.DriverVersion, n.NVMLVersion, n.CUDADriverVersion = "535.247.01", "12.535.247.01", 12020
	case "r550":
		n.DriverVersion, n.NVMLVersion, n.CUDADriverVersion = "550.163.01", "12.550.163.01", 12040
	case "r570":
		n.DriverVersion, n.NVMLVersion, n.CUDADriverVersion = "570.172.08", "12.570.172.08", 12080
	}
	n.FieldMax = FieldMax[branch]
	for i := 0; i < count; i++ {
		n.GPUs = append(n.GPUs, FromModel(cfg, i))
	}
	return n
}

// L4 is an inference board of the L4 class (Ada, GDDR6, PCIe only), as the
// simulator's L4-24GB model describes it.
var L4 = gpus.Config{Name: "NVIDIA L4", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
	MemoryMB: 23034, CudaMajor: 8, CudaMinor: 9, PciDeviceId: 0x27B810DE}

// L4Class returns an L4-class GPU: no NVLink (every NVLink call answers
// NOT_SUPPORTED), no memory temperature sensor on its GDDR memory
// (NVML_FI_DEV_MEMORY_TEMP answers NOT_SUPPORTED), no MIG, a 72 W board on
// PCIe Gen4; ECC and row remapping as a data-centre board.
func L4Class(index int) GPU {
	g := FromModel(L4, index)
	g.NVLinks = nil
	g.FieldReturns = map[uint32]nvml.Return{nvml.FI_DEV_MEMORY_TEMP: nvml.ERROR_NOT_SUPPORTED}
	g.PowerUsage, g.PowerLimit, g.EnforcedLimit = Ptr[uint32](16_000), Ptr[uint32](72_000), Ptr[uint32](72_000)
	g.PCIe = &PCIe{Gen: 4, Width: 16, MaxGen: 4, MaxWidth: 16}
	g.Clocks = map[nvml.ClockType]uint32{nvml.CLOCK_SM: 210, nvml.CLOCK_MEM: 6251, nvml.CLOCK_GRAPHICS: 210}
	g.MaxClocks = map[nvml.ClockType]uint32{nvml.CLOCK_SM: 2040, nvml.CLOCK_MEM: 6251}
	g.Thresholds = map[nvml.TemperatureThresholds]uint32{nvml.TEMPERATURE_THRESHOLD_SHUTDOWN: 95, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN: 92}
	return g
}

// WithoutECCPowerEvents makes g a board that answers NOT_SUPPORTED for ECC
// (counters, row remapping), power (usage, energy, limits) and NVML events
// (it supports no event type, so registering it fails), as consumer boards
// and some vGPU guests do. A driver that cannot create event sets at all is
// Node.Returns["nvmlEventSetCreate"] = nvml.ERROR_NOT_SUPPORTED.
func WithoutECCPowerEvents(g GPU) GPU {
	g.ECC, g.RemappedRows, g.RemapperHistogram = nil, nil, nil
	g.PowerUsage, g.PowerLimit, g.EnforcedLimit, g.Energy = nil, nil, nil, nil
	g.SupportedEvents = Ptr[uint64](0)
	return g
}
