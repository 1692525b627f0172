package render

import (
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Group is a set of metric families switched on and off together
// (--collector.<name> / --no-collector.<name>). Groups choose what is
// rendered, not what is read: the sampler reads the same fields whatever is
// on, so a switch never changes another family's values (the dcgm-exporter
// compatibility page needs them all).
type Group string

// The metric groups. GroupCore cannot be switched off: every other family
// joins on its identity series.
const (
	GroupCore          Group = "core"
	GroupMemory        Group = "memory"
	GroupMemoryDetail  Group = "memory_detail"
	GroupTemperature   Group = "temperature"
	GroupPower         Group = "power"
	GroupEnergy        Group = "energy"
	GroupClocks        Group = "clocks"
	GroupThrottle      Group = "throttle"
	GroupClockEvents   Group = "clock_events"
	GroupMedia         Group = "media"
	GroupPCIe          Group = "pcie"
	GroupNVLink        Group = "nvlink"
	GroupNVLinkErrors  Group = "nvlink_errors"
	GroupECC           Group = "ecc"
	GroupECCCorrected  Group = "ecc_corrected"
	GroupECCDetail     Group = "ecc_detail"
	GroupRecovery      Group = "recovery"
	GroupDetails       Group = "details"
	GroupDCGMProfiling Group = "dcgm_profiling"
	GroupDCGMDetail    Group = "dcgm_detail"
	GroupDCGMHealth    Group = "dcgm_health"
	GroupXID           Group = "xid"
	GroupAllocation    Group = "allocation"
	GroupContainer     Group = "container"
	GroupIdle          Group = "idle"
	GroupFragmentation Group = "fragmentation"
	// Summary groups fold a detailed group into one series per GPU with
	// the label value "all"; each is served only while its detailed group
	// is off, so sums never count twice.
	GroupThrottleSummary     Group = "throttle_summary"
	GroupNVLinkErrorsSummary Group = "nvlink_errors_summary"
	GroupDCGMHealthSummary   Group = "dcgm_health_summary"
	// GroupNodeSummary serves no family of its own: it folds the per-GPU
	// families no alert reads per GPU into one series per node
	// (nodeSummaryFolds). The full profile leaves it off.
	GroupNodeSummary Group = "node_summary"
	GroupGo          Group = "go"
	GroupProcess     Group = "process"
)

// GroupInfo describes a group for flags and docs/profiles.md.
type GroupInfo struct {
	Name Group
	Help string
	// Default and Lean say whether the default and the lean profile serve
	// the group.
	Default, Lean bool
}

// Groups lists every group in the order of docs/profiles.md.
var Groups = []GroupInfo{
	{GroupCore, "identity, up, memory used/total, NVML busy ratio, driver and exporter self-metrics (cannot be switched off)", true, true},
	{GroupMemory, "memory controller busy ratio (NVML)", true, true},
	{GroupMemoryDetail, "reserved framebuffer and memory (HBM) temperature", true, false},
	{GroupTemperature, "GPU temperature and the slowdown threshold", true, true},
	{GroupPower, "power draw and power limit", true, true},
	{GroupEnergy, "energy counter (joules since the driver loaded)", true, false},
	{GroupClocks, "SM clock", true, true},
	{GroupThrottle, "clock event reasons that slow a busy GPU down: thermal slowdown (hardware, software), power brake, hardware slowdown", true, false},
	{GroupClockEvents, "the other clock event reasons: software power cap, idle, application clocks, sync boost, display clock, board limit, reliability", false, false},
	{GroupMedia, "encoder and decoder utilisation", false, false},
	{GroupPCIe, "PCIe replays and PCIe throughput (DCGM)", true, true},
	{GroupNVLink, "NVLink throughput (DCGM)", true, true},
	{GroupNVLinkErrors, "NVLink error counters by type (replay, recovery, CRC flit, CRC data; on Blackwell NVLink5's recovery, symbol, effective and receive errors), summed over links", true, false},
	{GroupECC, "uncorrected ECC errors since the driver loaded, rows and pages waiting for a reset, failed row remaps, banks with low or no spare rows", true, true},
	{GroupECCCorrected, "corrected ECC errors since the driver loaded", true, true},
	{GroupECCDetail, "lifetime (aggregate) ECC error counters, remapped row and retired page counts, the row remapper's histogram of spare rows per bank, ECC error events from NVML's event set", false, false},
	{GroupRecovery, "the recovery action NVML asks for (XID 154)", true, true},
	{GroupDetails, "facts that rarely change: NUMA node, NVLinks up, PCIe link generation and width, memory clock, shutdown temperature, placeable MIG instances per profile, per-GPU time of the last good read", false, false},
	{GroupDCGMProfiling, "DCGM SM, tensor and DRAM activity", true, true},
	{GroupDCGMDetail, "DCGM graphics engine activity, SM occupancy, FP64/FP32/FP16 pipe activity, and each container's SM activity", false, false},
	{GroupDCGMHealth, "DCGM health watches, one series per subsystem", true, false},
	{GroupXID, "XID error counters, per GPU and per MIG device", true, true},
	{GroupThrottleSummary, "instead of throttle: one series per GPU, reason=\"all\", 1 while any slowdown reason holds", false, true},
	{GroupNVLinkErrorsSummary, "instead of nvlink_errors: one counter per GPU, type=\"all\", every NVLink error type summed", false, true},
	{GroupDCGMHealthSummary, "instead of dcgm_health: one series per GPU, system=\"all\", the worst subsystem's result", false, true},
	{GroupNodeSummary, "one series per node (gpu=\"all\", uuid=\"all\") instead of one per GPU for the families that no alert or recording rule reads per GPU and that attribute nothing to a pod: PCIe and NVLink traffic and errors, corrected ECC errors, power and power limit (sums), slowdown temperature (min), SM clock, tensor, DRAM and memory busy ratios (means over whole GPUs); a folded counter keeps a lost GPU's last value, so it never falls; a folded gauge that misses the value of a GPU on the page carries partial=\"true\"", false, true},
	{GroupAllocation, "who holds which device, device states, kubelet capacity", true, true},
	{GroupContainer, "per-container memory and busy ratio of the devices a container holds, on shared GPUs from per-process accounting; memory outside pods per device", true, true},
	{GroupIdle, "idle allocations, idle seconds, prices", true, true},
	{GroupFragmentation, "stranded VRAM, free GPU groups, MIG placement, fragmentation", true, true},
	{GroupGo, "the exporter's Go runtime metrics (go_*, without the memstats family; process_resident_memory_bytes shows leaks)", false, false},
	{GroupProcess, "the exporter's process metrics (process_*)", true, false},
}

// Profiles name a starting set of groups; --collector.<name> flags change it.
const (
	ProfileDefault = "default"
	ProfileLean    = "lean"
	ProfileFull    = "full"
)

// ProfileNames lists the profiles.
var ProfileNames = []string{ProfileDefault, ProfileLean, ProfileFull}

// GroupSet is the set of groups switched on.
type GroupSet map[Group]bool

// ProfileGroups returns the groups of a profile.
func ProfileGroups(profile string) (GroupSet, error) {
	s := GroupSet{}
	for _, g := range Groups {
		switch profile {
		case ProfileDefault, "":
			s[g.Name] = g.Default
		case ProfileLean:
			s[g.Name] = g.Lean
		case ProfileFull:
			// Everything, per GPU: node_summary only takes series away.
			s[g.Name] = g.Name != GroupNodeSummary
		default:
			return nil, fmt.Errorf("unknown profile %q: want one of %s", profile, strings.Join(ProfileNames, ", "))
		}
	}
	return s, nil
}

// On reports whether the group is served. A nil set serves the default
// profile.
func (s GroupSet) On(g Group) bool {
	if g == GroupCore {
		return true
	}
	if d, ok := summaryOf[g]; ok && s.On(d) {
		return false
	}
	if s == nil {
		return groupDefault[g]
	}
	return s[g]
}

// summaryOf maps each summary group to the detailed group it replaces.
var summaryOf = map[Group]Group{
	GroupThrottleSummary:     GroupThrottle,
	GroupNVLinkErrorsSummary: GroupNVLinkErrors,
	GroupDCGMHealthSummary:   GroupDCGMHealth,
}

// Names lists the groups switched on, sorted.
func (s GroupSet) Names() []string {
	var out []string
	for _, g := range Groups {
		if s.On(g.Name) {
			out = append(out, string(g.Name))
		}
	}
	sort.Strings(out)
	return out
}

var groupDefault = func() map[Group]bool {
	m := map[Group]bool{}
	for _, g := range Groups {
		m[g.Name] = g.Default
	}
	return m
}()

// descGroups maps every Desc of the state collector to its group.
var descGroups = map[*prometheus.Desc]Group{}

// groupDesc is prometheus.NewDesc for a family of group g: every family
// the state collector serves is declared with its group, which decides
// whether it is served.
func groupDesc(g Group, name, help string, labels []string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	descGroups[d] = g
	return d
}

// FamilyGroups maps every metric family the exporter can serve (its own
// naming, not the compatibility names) to its groups (more than one where a
// summary group serves a folded form of the family), for the docs and
// tests.
func FamilyGroups() map[string][]Group {
	out := map[string][]Group{"gpu_exporter_build_info": {GroupCore}}
	add := func(name string, g Group) {
		for _, x := range out[name] {
			if x == g {
				return
			}
		}
		out[name] = append(out[name], g)
	}
	for d, g := range descGroups {
		add(descName(d), g)
	}
	for _, gs := range out {
		sort.Slice(gs, func(i, j int) bool { return gs[i] < gs[j] })
	}
	return out
}

// descName digs the fqName out of a Desc (client_golang does not export it).
func descName(d *prometheus.Desc) string {
	s := d.String()
	const k = `fqName: "`
	i := strings.Index(s, k)
	if i < 0 {
		return ""
	}
	s = s[i+len(k):]
	return s[:strings.IndexByte(s, '"')]
}

// Series budgets per GPU on the simulated 8 x H100 node (sim/simnode's default
// scenario: one GPU in MIG mode with four instances, eleven holders, DCGM
// on), counted over the whole page, the exporter's own go_ and process_
// series included. agent's budget test (TestSeriesBudget) fails when a page
// grows past them.
const (
	// Memory info v2's gpu_memory_reserved_bytes (12 series) fits since
	// the exporter's go_ metrics (14) left the default profile; 62 (from
	// 60) for the per-namespace sums (gpu_namespace_*: three series per
	// namespace that holds devices on the node, 9 on the simulated one),
	// which the rules' namespace figures read instead of joining every
	// holder's series with every device's busy ratio each minute; 64 for
	// each holder's share and activity (gpu_allocation_share_ratio,
	// gpu_allocation_activity_ratio, eleven each on the simulated node),
	// which the rules read instead of counting every device's holders and
	// joining every device's SM activity with every holder's own; 65 for
	// the sparse facts of shared devices (gpu_shared_device_*, three
	// series per device several containers hold) and of GPUs nobody holds
	// (gpu_unallocated_info), which spare the rules every holder's and
	// every device's series.
	DefaultBudgetPerGPU = 65
	// 42 until node_summary folded the per-GPU families no alert reads
	// per GPU into one series per node; 31 (from 30) for
	// gpu_faulted_devices, one series a node, by which the rules tell an
	// exporter that serves gpu_fault_active from one that predates it;
	// 32 for the per-namespace sums; 34 for each holder's share and
	// activity; 35 for the sparse facts of shared and unheld devices.
	LeanBudgetPerGPU = 35
)
