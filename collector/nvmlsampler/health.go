package nvmlsampler

import (
	"encoding/binary"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// nvlinkKey is one error counter of one link.
type nvlinkKey struct{ link, typ int }

var (
	// nvlinkReads say how each NVLink error count (sample.NVLinkErrorNames,
	// the order of Health.NVLinkErrors) is read: the data-link counters of
	// nvmlDeviceGetNvLinkErrorCounter (Ampere, Hopper), and on Blackwell,
	// where those answer NOT_SUPPORTED, NVLink5's per-link field values
	// (R570+). Field 0: no NVLink5 field; Counter -1: no per-link counter.
	nvlinkReads = [sample.NumNVLinkErrorTypes]struct {
		Counter nvml.NvLinkErrorCounter
		Field   uint32
	}{
		{nvml.NVLINK_ERROR_DL_REPLAY, 0},
		{nvml.NVLINK_ERROR_DL_RECOVERY, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS},
		{nvml.NVLINK_ERROR_DL_CRC_FLIT, 0},
		{nvml.NVLINK_ERROR_DL_CRC_DATA, 0},
		{-1, nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS},
		{-1, nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS},
		{-1, nvml.FI_DEV_NVLINK_COUNT_RCV_ERRORS},
		{-1, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS},
	}
)

// readHealth reads the board's health; slow-moving counters (NVLink errors)
// only when full is set, otherwise they are carried from prev.
func readHealth(d Device, p probes, h *sample.Health, prev *sample.Health, full bool, seen map[nvlinkKey]uint64, ok func(nvml.Return) bool) {
	for e := 0; e < 2; e++ {
		for sc := 0; sc < 2; sc++ {
			if v, ret := d.GetTotalEccErrors(nvml.MemoryErrorType(e), nvml.EccCounterType(sc)); ok(ret) {
				h.ECC[e][sc] = sample.Some(v)
			}
		}
	}
	for c := 0; c < 2; c++ {
		if pages, ret := d.GetRetiredPages(nvml.PageRetirementCause(c)); ok(ret) {
			h.RetiredPages[c] = sample.Some(len(pages))
		}
	}
	if p, ret := d.GetRetiredPagesPendingStatus(); ok(ret) {
		h.RetiredPending = sample.Some(p == nvml.FEATURE_ENABLED)
	}
	if corr, unc, pending, failed, ret := d.GetRemappedRows(); ok(ret) {
		h.RemapCorr, h.RemapUncorr, h.RemapPending, h.RemapFailed = sample.Some(corr), sample.Some(unc), sample.Some(pending), sample.Some(failed)
	}
	if hv, ret := d.GetRowRemapperHistogram(); ok(ret) {
		h.RemapBanks = sample.Some([sample.NumRemapAvailability]int{int(hv.Max), int(hv.High), int(hv.Partial), int(hv.Low), int(hv.None)})
	}
	if r, ret := clockReasons(d, p); ok(ret) {
		h.ClockReasons = sample.Some(r)
	}
	if n, ret := d.GetPcieReplayCounter(); ok(ret) {
		h.PCIeReplay = sample.Some(n)
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := d.GetFieldValues(fv); ok(ret) && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		h.RecoveryAction = sample.Some(int(binary.LittleEndian.Uint32(fv[0].Value[:4])))
	}
	carry := func() {
		if prev != nil {
			h.NVLinkErrors, h.NVLinkErrorSeen, h.HasNVLink, h.NVLinkActive, h.NUMANode = prev.NVLinkErrors, prev.NVLinkErrorSeen, prev.HasNVLink, prev.NVLinkActive, prev.NUMANode
		}
	}
	if !full {
		carry()
		return
	}
	if !p.numaNodeID { //nolint:revive // empty-block: the comment is why nothing is read
		// R470-R545 lack nvmlDeviceGetNumaNodeId: calling it would kill
		// the process. The sampler reads sysfs first anyway.
	} else if n, ret := d.GetNumaNodeId(); ok(ret) {
		h.NUMANode = sample.Some(n)
	} else if prev != nil {
		h.NUMANode = prev.NUMANode
	}
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		st, ret := d.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if link == 0 && !unsupported(ret) && ret != nvml.ERROR_INVALID_ARGUMENT {
				carry() // a failed read says nothing about the links
				return
			}
			break // no NVLink, or past the last link
		}
		if !h.NVLinkActive.OK {
			h.NVLinkActive = sample.Some(0) // the GPU has NVLink: count its links up
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		h.NVLinkActive.V++
		perLink := false
		for t, et := range nvlinkReads {
			if et.Counter < 0 {
				continue
			}
			if v, ret := d.GetNvLinkErrorCounter(link, et.Counter); ok(ret) {
				seen[nvlinkKey{link, t}] = v
				perLink = true
			}
		}
		if !perLink {
			readNVLink5Errors(d, link, seen, ok)
		}
	}
	for k, v := range seen {
		h.NVLinkErrors[k.typ] += v
		h.NVLinkErrorSeen[k.typ] = true
		h.HasNVLink = true
	}
}

// clockReasons reads the clock event reasons under the name the driver
// exports: R535 renamed nvmlDeviceGetCurrentClocksThrottleReasons, which
// older drivers have alone (same bits), and 13.0 deprecates the old name.
func clockReasons(d Device, p probes) (uint64, nvml.Return) {
	switch {
	case p.clocksEventReasons:
		return d.GetCurrentClocksEventReasons()
	case p.clocksThrottleReasons:
		return d.GetCurrentClocksThrottleReasons()
	}
	return 0, nvml.ERROR_FUNCTION_NOT_FOUND
}

// readNVLink5Errors reads one link's error counts from NVLink5's field
// values: Blackwell answers NOT_SUPPORTED to the per-link counters.
func readNVLink5Errors(d Device, link int, seen map[nvlinkKey]uint64, ok func(nvml.Return) bool) {
	var fv []nvml.FieldValue
	var types []int
	for t, et := range nvlinkReads {
		if et.Field != 0 {
			fv = append(fv, nvml.FieldValue{FieldId: et.Field, ScopeId: uint32(link)})
			types = append(types, t)
		}
	}
	if !ok(d.GetFieldValues(fv)) {
		return
	}
	for i, v := range fv {
		if nvml.Return(v.NvmlReturn) == nvml.SUCCESS {
			seen[nvlinkKey{link, types[i]}] = binary.LittleEndian.Uint64(v.Value[:])
		}
	}
}
