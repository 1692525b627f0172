package nvmlsampler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// SamplerConfig configures the NVML sampler.
type SamplerConfig struct {
	// DeviceTimeout bounds how long one sample waits for one GPU. A GPU whose
	// NVML calls take longer is reported down for that sample; its calls go on
	// in the background and the GPU is not asked again until they return.
	DeviceTimeout time.Duration
	// InitTimeout is how long nvmlInit may run before the exporter says, in
	// its log and on its page, that it is waiting for the driver. An NVML
	// call cannot be cancelled: the call goes on, and the exporter serves
	// its page (and /healthz) meanwhile. Zero means DefaultInitTimeout.
	InitTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between nvmlInit attempts
	// that failed (no driver loaded, a driver reload under way); zero means
	// DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// RediscoverEvery re-reads each GPU's static facts and MIG layout every N
	// samples (MIG can be reconfigured while the exporter runs).
	RediscoverEvery int
	// Sysfs is where sysfs is mounted (default /sys), for each GPU's NUMA
	// node: <Sysfs>/bus/pci/devices/<bus id>/numa_node.
	Sysfs string
	Log   zerolog.Logger
	// Now replaces time.Now in tests.
	Now func() time.Time
	// Processes reads every device's process lists and per-process
	// utilization, for per-container use of shared devices.
	Processes bool
}

// Life-cycle defaults.
const (
	DefaultInitTimeout = 10 * time.Second
	DefaultMinBackoff  = time.Second
	DefaultMaxBackoff  = time.Minute
)

// Sampler reads every GPU through NVML. Each GPU is read by its own
// goroutine so that one hanging or lost GPU never delays the others.
//
// NVML is initialised once, in the background, by the first samples (see
// lifecycle.go): the exporter serves before nvmlInit returns. When the
// driver goes away under it (every call answers UNINITIALIZED or
// DRIVER_NOT_LOADED), the sampler releases the library and initialises it
// again with backoff, discovering the GPUs and their MIG layout afresh.
type Sampler struct {
	lib  NVML
	cfg  SamplerConfig
	life lifecycle

	// Touched only by Sample (one at a time) and, under mu, read by
	// Driver and Status.
	mu      sync.Mutex
	driver  sample.DriverInfo
	probes  probes
	workers []*gpuWorker
	// known are the GPUs of the previous discovery, until every GPU of
	// this one has told its UUID: those NVML no longer lists become
	// ghosts.
	known []*gpuWorker
	// ghosts are GPUs NVML listed before a re-initialisation and no longer
	// lists: each stays on the page, down, under the identity it had (a
	// GPU lost to the driver keeps its series, as one lost from the bus).
	ghosts []*gpuWorker
}

// NewSampler returns a sampler of lib. It starts nvmlInit in the background
// and returns at once; the samples say what they are waiting for until it
// returns. It fails only on a configuration it cannot use.
func NewSampler(lib NVML, cfg SamplerConfig) (*Sampler, error) {
	if lib == nil {
		return nil, fmt.Errorf("NVML sampler: no library")
	}
	if cfg.DeviceTimeout <= 0 {
		cfg.DeviceTimeout = 2 * time.Second
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = DefaultInitTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.RediscoverEvery <= 0 {
		cfg.RediscoverEvery = 12
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sysfs == "" {
		cfg.Sysfs = DefaultSysfs
	}
	s := &Sampler{lib: lib, cfg: cfg}
	s.life.init(cfg.Now())
	s.life.startInit(lib, time.Now())
	return s, nil
}

// discover reads the driver stack and the GPUs after a successful
// nvmlInit. Discovery has a deadline: a GPU whose calls hang must not keep
// the others from being read. Such a GPU is reported hung, by index, until
// its discovery returns.
func (s *Sampler) discover() error {
	lib, cfg := s.lib, s.cfg
	p := probe(lib)
	var d sample.DriverInfo
	d.DriverVersion, _ = lib.SystemGetDriverVersion()
	d.NVMLVersion, _ = lib.SystemGetNVMLVersion()
	d.DriverVersion, d.NVMLVersion = validUTF8(d.DriverVersion), validUTF8(d.NVMLVersion)
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		d.CUDADriverVersion = cudaVersionString(v)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML device count: %w", ret)
	}
	done := make(chan struct{}, n)
	workers := make([]*gpuWorker, 0, n)
	for i := 0; i < n; i++ {
		w := &gpuWorker{index: i, lib: lib, probes: p, sysfs: cfg.Sysfs, log: cfg.Log.With().Int("gpu", i).Logger(), rediscoverEvery: cfg.RediscoverEvery, processes: cfg.Processes}
		w.setIdent(sample.DeviceState{GPU: i, GPUInstance: -1, ComputeInstance: -1, Minor: -1}, nil, nil, nil)
		w.busy.Store(true)
		go func() {
			w.discover()
			w.busy.Store(false)
			done <- struct{}{}
		}()
		workers = append(workers, w)
	}
	s.mu.Lock()
	// The GPUs are followed by UUID, not by index: after a re-init that
	// lists fewer or more GPUs the indices move.
	s.known = append(append(s.known, s.workers...), s.ghosts...)
	s.ghosts = nil
	s.driver, s.probes, s.workers = d, p, workers
	s.mu.Unlock()
	timer := time.NewTimer(cfg.DeviceTimeout)
	defer timer.Stop()
	for pending := n; pending > 0; pending-- {
		select {
		case <-done:
		case <-timer.C:
			cfg.Log.Warn().Dur("timeout", cfg.DeviceTimeout).Int("gpus", pending).Msg("GPU discovery did not finish in time; going on, those GPUs are reported down until they answer")
			return nil
		}
	}
	return nil
}

// Driver returns the driver stack read at the latest nvmlInit.
func (s *Sampler) Driver() sample.DriverInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.driver
}

// Close shuts NVML down, unless a call still hangs in it: shutting the
// library down under a call in flight is asking for a crash at exit. Calls
// that hang are abandoned, and the log says so, naming their GPUs.
func (s *Sampler) Close() {
	s.mu.Lock()
	var hung []int
	for _, w := range s.workers {
		if w.busy.Load() {
			hung = append(hung, w.index)
		}
	}
	s.mu.Unlock()
	if len(hung) > 0 {
		s.cfg.Log.Warn().Ints("gpus", hung).
			Msg("NVML calls on these GPUs are still blocked in the driver (a GPU hung in it): they are abandoned at exit and NVML is not shut down under them")
		return
	}
	if why := s.life.release(s.lib, false); why != "" {
		s.cfg.Log.Warn().Str("reason", why).Msg("a call still blocked in the driver is abandoned at exit; NVML is not shut down under it")
	}
}

// Sample reads every GPU, waiting at most DeviceTimeout for each. While
// NVML is not usable it reports every GPU it knew down and says why.
func (s *Sampler) Sample(ctx context.Context) *sample.NodeSample {
	start := time.Now()
	if !s.life.usable() && !s.ensureInit(ctx) {
		out := s.downSample()
		out.Duration = time.Since(start)
		return out
	}
	s.settleKnown()
	s.mu.Lock()
	workers, ghosts := s.workers, s.ghosts
	out := &sample.NodeSample{Time: s.cfg.Now(), Driver: s.driver, GPUs: make([]sample.GPUState, len(workers), len(workers)+len(ghosts))}
	s.mu.Unlock()
	done := make(chan struct{}, len(workers))
	pending := 0
	filled := make([]bool, len(workers))
	for i, w := range workers {
		if !w.busy.CompareAndSwap(false, true) {
			// Still stuck in an earlier sample: report it down, ask nothing.
			out.GPUs[i], filled[i] = w.hungState(), true
			continue
		}
		pending++
		go func() {
			w.result = w.read()
			w.busy.Store(false)
			done <- struct{}{}
		}()
	}
	timer := time.NewTimer(s.cfg.DeviceTimeout)
	defer timer.Stop()
wait:
	for pending > 0 {
		select {
		case <-done:
			pending--
		case <-timer.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	var gone error
	for i, w := range workers {
		if filled[i] {
			continue
		}
		if w.busy.Load() {
			w.log.Warn().Dur("timeout", s.cfg.DeviceTimeout).Msg("NVML calls on this GPU did not return in time; reporting it down")
			out.GPUs[i] = w.hungState()
			continue
		}
		out.GPUs[i] = w.result
		if w.gone != nil {
			gone = w.gone
		}
	}
	for _, g := range ghosts {
		out.GPUs = append(out.GPUs, g.staleState())
	}
	if gone != nil {
		s.lost(gone)
	}
	out.NVML = s.life.status()
	out.Duration = time.Since(start)
	return out
}

// settleKnown matches the GPUs of the previous discovery with this one's
// by UUID, once every GPU of this one has told it (or its discovery
// returned without): a GPU NVML no longer lists becomes a ghost, reported
// lost until a later discovery lists it again.
func (s *Sampler) settleKnown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.known) == 0 {
		return
	}
	listed := map[string]bool{}
	for _, w := range s.workers {
		uuid := w.uuid()
		if uuid == "" && w.busy.Load() {
			return // still discovering: it may be one of them
		}
		listed[uuid] = true
	}
	seen := map[string]bool{}
	for _, k := range s.known {
		uuid := k.uuid()
		if uuid == "" || listed[uuid] || seen[uuid] {
			continue
		}
		seen[uuid] = true
		if !k.ghost {
			k.ghost = true
			k.log.Warn().Str("uuid", uuid).Int("last_index", k.index).
				Msg("NVML no longer lists this GPU after nvmlInit: it stays on the page lost (gpu_up 0) under its last index until NVML lists it again or the exporter restarts")
		}
		s.ghosts = append(s.ghosts, k)
	}
	s.known = nil
}

// healthEvery: NVLink error counters (up to 18 links x 4 counters) are read
// every healthEvery samples and carried in between.
const healthEvery = 6

// gpuWorker owns one physical GPU's handle and static facts.
type gpuWorker struct {
	index           int
	lib             NVML
	probes          probes
	sysfs           string
	numa            sample.Opt[int] // from sysfs, read at discovery
	log             zerolog.Logger
	rediscoverEvery int

	busy atomic.Bool
	// Fields below are touched only by the goroutine holding busy, and read
	// by Sample after that goroutine has released busy.
	handle     Device
	ident      sample.DeviceState
	migHandles []Device
	migIdent   []sample.DeviceState
	samples    int
	layout     *sample.MIGLayout
	prevHealth *sample.Health
	nvlinkSeen map[nvlinkKey]uint64 // last value of every NVLink error counter seen
	failures   int
	lostLogged bool
	processes  bool
	lastSeen   uint64 // newest per-process utilization sample read, in µs
	// gone is the answer of a call that says the driver went away
	// (UNINITIALIZED, DRIVER_NOT_LOADED) in the latest read, else nil.
	gone   error
	result sample.GPUState
	// migProfiles are the GPU instance profiles as NVML described them at
	// discovery, to list the GPU instances again each sample.
	migProfiles []nvml.GpuInstanceProfileInfo
	// ghost: NVML no longer lists the GPU (settleKnown); never read again.
	ghost   bool
	identMu sync.Mutex // guards ident, migPending and migChecked for staleState and MIGDevices while a read runs
	// migPending is sample.GPUState.MIGPending.
	migPending string
	// migChecked is when the latest sample found the MIG devices to be
	// those migIdent holds (zero: never): an XID that came later may be
	// on a device created since (MIGDevices).
	migChecked time.Time
}

func (w *gpuWorker) uuid() string {
	w.identMu.Lock()
	defer w.identMu.Unlock()
	return w.ident.UUID
}

// staleState is the GPU's identity with Up=false and no values.
func (w *gpuWorker) staleState() sample.GPUState {
	w.identMu.Lock()
	defer w.identMu.Unlock()
	g := sample.GPUState{DeviceState: w.ident, MIGLayout: w.layout, MIGPending: w.migPending}
	g.Up = false
	g.Values = sample.Values{}
	for _, m := range w.migIdent {
		m.Up = false
		m.Values = sample.Values{}
		g.MIG = append(g.MIG, m)
	}
	return g
}

// hungState is staleState for a GPU whose NVML calls have not returned.
func (w *gpuWorker) hungState() sample.GPUState {
	g := w.staleState()
	g.Hung = true
	return g
}

// discover (re)reads the handle, the static facts and the MIG layout. What
// a lost GPU cannot tell (its UUID, name, bus ID) is kept from before, so a
// GPU never loses its identity, and with it its series, while it is down.
func (w *gpuWorker) discover() {
	prev := w.ident
	h, ret := w.lib.DeviceGetHandleByIndex(w.index)
	if ret != nvml.SUCCESS {
		if driverGone(ret) {
			w.gone = ret
		}
		w.handle = nil
		if prev.UUID == "" {
			w.setIdent(sample.DeviceState{GPU: w.index, GPUInstance: -1, ComputeInstance: -1, Minor: -1}, nil, nil, nil)
		}
		w.log.Warn().Str("error", ret.Error()).Msg("cannot get NVML handle for GPU")
		return
	}
	w.handle = h
	id := sample.DeviceState{GPU: w.index, GPUInstance: -1, ComputeInstance: -1, Minor: -1}
	keep := func(v *string, got string, ret nvml.Return, old string) {
		if ret == nvml.SUCCESS && got != "" {
			*v = validUTF8(got)
		} else {
			*v = old
		}
	}
	uuid, ret := h.GetUUID()
	keep(&id.UUID, uuid, ret, prev.UUID)
	name, ret := h.GetName()
	keep(&id.Model, name, ret, prev.Model)
	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		id.PCIBusID = validUTF8(pciBusID(pci))
	} else {
		id.PCIBusID = prev.PCIBusID
	}
	if m, ret := h.GetMinorNumber(); ret == nvml.SUCCESS {
		id.Minor = m
	} else {
		id.Minor = prev.Minor
	}
	var migHandles []Device
	var migIdent []sample.DeviceState
	var layout *sample.MIGLayout
	profiles := w.migProfiles
	mode, pending, ret := h.GetMigMode()
	switch {
	case ret == nvml.SUCCESS && mode == nvml.DEVICE_MIG_ENABLE:
		id.MIGEnabled = true
		migHandles, migIdent = discoverMIG(h, id)
		layout, profiles = readMIGLayout(h, w.probes)
	case ret != nvml.SUCCESS && !unsupported(ret) && prev.MIGEnabled:
		// The GPU does not answer: keep its MIG instances' identities.
		id.MIGEnabled = true
		migIdent, layout = w.migIdent, w.layout
		migHandles = w.migHandles
	}
	w.migProfiles = profiles
	if ret == nvml.SUCCESS {
		w.notePendingMode(id.UUID, mode, pending)
	} else if unsupported(ret) {
		w.notePendingMode(id.UUID, 0, 0)
	}
	if n, ok := sysfsNUMANode(w.sysfs, id.PCIBusID); ok {
		w.numa = sample.Some(n)
	}
	w.setIdent(id, migHandles, migIdent, layout)
}

// migModeName names a MIG mode as gpu_info's mig_mode label does.
func migModeName(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}
	return "disabled"
}

// pendingMode is the MIG mode the next reset applies, "" when it is the
// current one.
func pendingMode(current, pending int) string {
	if (current == nvml.DEVICE_MIG_ENABLE) == (pending == nvml.DEVICE_MIG_ENABLE) {
		return ""
	}
	return migModeName(pending)
}

// notePendingMode records the pending MIG mode and logs when one appears
// and when it goes (applied by a reset, or withdrawn): once each, however
// many samples see it.
func (w *gpuWorker) notePendingMode(uuid string, current, pending int) {
	next := pendingMode(current, pending)
	w.identMu.Lock()
	prev := w.migPending
	w.migPending = next
	w.identMu.Unlock()
	switch {
	case next != "" && next != prev:
		w.log.Warn().Str("uuid", uuid).Str("mig_mode", migModeName(current)).Str("pending_mig_mode", next).
			Msg("MIG mode change is pending: it takes effect at the GPU's next reset (nvidia-smi -r) or a reboot; gpu_mig_mode_pending says so until then")
	case next == "" && prev != "" && migModeName(current) == prev:
		w.log.Info().Str("uuid", uuid).Str("mig_mode", prev).Msg("MIG mode change applied: the GPU was reset")
	case next == "" && prev != "":
		w.log.Info().Str("uuid", uuid).Str("mig_mode", migModeName(current)).Msg("pending MIG mode change withdrawn: the GPU keeps its mode")
	}
}

func (w *gpuWorker) setIdent(id sample.DeviceState, mh []Device, mi []sample.DeviceState, layout *sample.MIGLayout) {
	w.identMu.Lock()
	w.ident, w.migHandles, w.migIdent, w.layout = id, mh, mi, layout
	w.identMu.Unlock()
}

func discoverMIG(h Device, parent sample.DeviceState) ([]Device, []sample.DeviceState) {
	slots, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nil
	}
	var handles []Device
	var idents []sample.DeviceState
	for i := 0; i < slots; i++ {
		m, ret := h.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue // ERROR_NOT_FOUND: no instance in this slot
		}
		id := parent
		id.MIGEnabled = true
		id.GPUInstance, _ = m.GetGpuInstanceId()
		id.ComputeInstance, _ = m.GetComputeInstanceId()
		id.MIGUUID, _ = m.GetUUID()
		id.MIGUUID = validUTF8(id.MIGUUID)
		name, _ := m.GetName()
		attr, _ := m.GetAttributes()
		id.MIGProfile = validUTF8(migProfileName(name, attr))
		handles = append(handles, m)
		idents = append(idents, id)
	}
	return handles, idents
}

// migProfileName prefers the profile NVML puts in a MIG device's name
// ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") and falls back to the attributes.
func migProfileName(name string, a nvml.DeviceAttributes) string {
	if i := strings.LastIndex(name, "MIG "); i >= 0 {
		return strings.TrimSpace(name[i+4:])
	}
	if a.GpuInstanceSliceCount == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, (a.MemorySizeMB+1023)/1024)
}

func pciBusID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) > 0 {
		return strings.ToLower(string(b))
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

// migChanged reports whether the GPU's MIG mode (current or pending), MIG
// devices or GPU instances differ from what discovery saw, so that a
// reconfiguration (nvidia-smi mig, the MIG manager) shows in the very next
// sample: compute instances by their MIG devices' UUIDs, GPU instances by
// listing them (one without compute instances has no MIG device). It costs
// one call for a GPU without MIG; with it two per MIG device slot, one per
// GPU instance profile and one per GPU instance.
func (w *gpuWorker) migChanged() bool {
	if w.handle == nil {
		return false
	}
	mode, pending, ret := w.handle.GetMigMode()
	if ret != nvml.SUCCESS {
		return false // unsupported, or failing: the read says which
	}
	enabled := mode == nvml.DEVICE_MIG_ENABLE
	w.identMu.Lock()
	was := w.migPending
	w.identMu.Unlock()
	if enabled != w.ident.MIGEnabled || pendingMode(mode, pending) != was {
		return true
	}
	if !enabled {
		return false
	}
	slots, ret := w.handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return false
	}
	seen := 0
	for i := 0; i < slots; i++ {
		m, ret := w.handle.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, _ := m.GetUUID() // "" on error, as discoverMIG records it
		if seen >= len(w.migIdent) || w.migIdent[seen].MIGUUID != validUTF8(uuid) {
			return true
		}
		seen++
	}
	return seen != len(w.migIdent) || gpuInstancesChanged(w.handle, w.layout, w.migProfiles)
}

// read samples the GPU and its MIG instances. It runs in its own goroutine.
func (w *gpuWorker) read() sample.GPUState {
	w.samples++
	w.gone = nil
	checked := time.Now()
	if w.handle == nil || w.failures >= 3 || w.samples%w.rediscoverEvery == 0 || w.migChanged() {
		w.discover()
	}
	g := sample.GPUState{DeviceState: w.ident, MIGLayout: w.layout, MIGPending: w.migPending}
	if w.handle == nil {
		w.failures++
		return w.staleState()
	}
	full := w.samples%healthEvery == 1 || w.prevHealth == nil
	if w.nvlinkSeen == nil {
		w.nvlinkSeen = map[nvlinkKey]uint64{}
	}
	up, err := readDevice(w.handle, w.probes, &g.DeviceState, &g.Health, w.prevHealth, full, w.nvlinkSeen)
	g.Up = up
	if !up {
		var ret nvml.Return
		if errors.As(err, &ret) && driverGone(ret) {
			w.gone = ret
		}
		w.failures++
		if !w.lostLogged {
			w.log.Error().Err(err).Str("uuid", g.UUID).Msg("GPU does not answer NVML; reporting gpu_up 0 until it does")
			w.lostLogged = true
		}
		return w.staleState()
	}
	if w.lostLogged {
		w.log.Info().Str("uuid", g.UUID).Msg("GPU answers NVML again")
		w.lostLogged = false
	}
	w.failures = 0
	if w.numa.OK {
		g.Health.NUMANode = w.numa
	}
	w.prevHealth = &g.Health
	if w.processes && len(w.migHandles) == 0 {
		g.Processes = readProcesses(w.handle, true, &w.lastSeen)
	}
	var destroyed bool
	if g.MIG, destroyed = w.readMIG(); destroyed {
		// MIG was reconfigured between the layout check and the read:
		// read the layout and the new handles, then the devices again.
		w.discover()
		g.MIGEnabled, g.MIGLayout = w.ident.MIGEnabled, w.layout
		g.MIG, _ = w.readMIG()
	}
	w.identMu.Lock()
	w.migChecked = checked
	w.identMu.Unlock()
	return g
}

// readMIG reads the GPU's MIG devices. destroyed says that a handle
// answered as the driver does for a compute instance destroyed since it was
// issued: INVALID_ARGUMENT (nvml.h, nvmlDeviceGetMigDeviceHandleByIndex:
// the handle "would remain invalid and must be requested again"), or
// NOT_FOUND.
func (w *gpuWorker) readMIG() (out []sample.DeviceState, destroyed bool) {
	for i, m := range w.migHandles {
		ms := w.migIdent[i]
		var err error
		ms.Up, err = readDevice(m, w.probes, &ms, nil, nil, false, nil)
		var ret nvml.Return
		if !ms.Up && errors.As(err, &ret) && (ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_FOUND) {
			destroyed = true
		}
		if w.processes && ms.Up {
			var none uint64
			ms.Processes = readProcesses(m, false, &none)
		}
		out = append(out, ms)
	}
	return out, destroyed
}

// readDevice reads one device's fields. Memory is the field every device
// has: an error reading it marks the device down, unless NVML says the
// device answered but will not tell (NOT_SUPPORTED on integrated GPUs,
// NO_PERMISSION on a MIG parent from a container). Other fields are skipped
// when NVML says they are not supported, and on any other error; GPU_IS_LOST
// on any of them marks the device down.
func readDevice(d Device, p probes, s *sample.DeviceState, health, prevHealth *sample.Health, fullHealth bool, nvlinkSeen map[nvlinkKey]uint64) (bool, error) {
	whole := health != nil
	v := &s.Values
	if ret := readMemory(d, p, v); ret != nvml.SUCCESS && !memoryWithheld(ret) {
		*v = sample.Values{}
		return false, fmt.Errorf("memory info: %w", ret)
	}
	lost := false
	ok := func(ret nvml.Return) bool {
		if ret == nvml.ERROR_GPU_IS_LOST {
			lost = true
		}
		return ret == nvml.SUCCESS
	}
	defer func() {
		if lost {
			*v = sample.Values{}
		}
	}()
	if u, ret := d.GetUtilizationRates(); ok(ret) {
		v.Set(sample.FieldUtilization, float64(u.Gpu)/100)
		v.Set(sample.FieldMemoryUtilization, float64(u.Memory)/100)
	}
	if !whole {
		if lost {
			return false, nvml.ERROR_GPU_IS_LOST
		}
		return true, nil // the rest is per board, read on the parent GPU
	}
	if t, ret := readTemperature(d, p); ok(ret) {
		v.Set(sample.FieldTemperature, t)
	}
	if p, ret := d.GetPowerUsage(); ok(ret) {
		v.Set(sample.FieldPower, float64(p)/1000)
	}
	if e, ret := d.GetTotalEnergyConsumption(); ok(ret) {
		v.Set(sample.FieldEnergy, float64(e)/1000)
	}
	if c, ret := d.GetClockInfo(nvml.CLOCK_SM); ok(ret) {
		v.Set(sample.FieldSMClock, float64(c)*1e6)
	}
	if c, ret := d.GetClockInfo(nvml.CLOCK_MEM); ok(ret) {
		v.Set(sample.FieldMemoryClock, float64(c)*1e6)
	}
	if g, ret := d.GetCurrPcieLinkGeneration(); ok(ret) {
		v.Set(sample.FieldPCIeLinkGeneration, float64(g))
	}
	if wd, ret := d.GetCurrPcieLinkWidth(); ok(ret) {
		v.Set(sample.FieldPCIeLinkWidth, float64(wd))
	}
	if pl, ret := d.GetPowerManagementLimit(); ok(ret) {
		v.Set(sample.FieldPowerLimit, float64(pl)/1000)
	}
	if t, ret := d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); ok(ret) {
		v.Set(sample.FieldSlowdownTemperature, float64(t))
	}
	if t, ret := d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SHUTDOWN); ok(ret) {
		v.Set(sample.FieldShutdownTemperature, float64(t))
	}
	if u, _, ret := d.GetEncoderUtilization(); ok(ret) {
		v.Set(sample.FieldEncoderUtilization, float64(u)/100)
	}
	if u, _, ret := d.GetDecoderUtilization(); ok(ret) {
		v.Set(sample.FieldDecoderUtilization, float64(u)/100)
	}
	// Memory (HBM) temperature is a field value: GPUs without a memory
	// sensor (GDDR boards) answer NOT_SUPPORTED for the field alone.
	mt := []nvml.FieldValue{{FieldId: nvml.FI_DEV_MEMORY_TEMP}}
	if ret := d.GetFieldValues(mt); ok(ret) && nvml.Return(mt[0].NvmlReturn) == nvml.SUCCESS {
		if t, known := fieldValue(mt[0]); known {
			v.Set(sample.FieldMemoryTemperature, t)
		}
	}
	if health != nil {
		readHealth(d, p, health, prevHealth, fullHealth, nvlinkSeen, ok)
	}
	if lost {
		return false, nvml.ERROR_GPU_IS_LOST
	}
	return true, nil
}

// readMemory reads memory with v2 where the driver has it (R510+): v1
// counts the driver's reserved memory as used, so idle GPUs would show
// hundreds of MiB used, unlike nvidia-smi and DCGM. Reserved is its own field.
func readMemory(d Device, p probes, v *sample.Values) nvml.Return {
	if p.memoryInfoV2 {
		m, ret := d.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			v.Set(sample.FieldMemoryUsed, float64(m.Used))
			v.Set(sample.FieldMemoryTotal, float64(m.Total))
			v.Set(sample.FieldMemoryReserved, float64(m.Reserved))
			return ret
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.ERROR_FUNCTION_NOT_FOUND:
			// fall back to v1
		default:
			return ret
		}
	}
	m, ret := d.GetMemoryInfo()
	if ret == nvml.SUCCESS {
		v.Set(sample.FieldMemoryUsed, float64(m.Used))
		v.Set(sample.FieldMemoryTotal, float64(m.Total))
	}
	return ret
}

// readTemperature reads the GPU's die temperature with the versioned call
// where the driver has it (R570+): 13.0 deprecates nvmlDeviceGetTemperature,
// and a driver that drops it would end the process at the call.
func readTemperature(d Device, p probes) (float64, nvml.Return) {
	if p.temperatureV {
		t, ret := d.GetTemperatureV1()
		switch ret {
		case nvml.SUCCESS:
			return float64(t.Temperature), ret
		case nvml.ERROR_ARGUMENT_VERSION_MISMATCH, nvml.ERROR_FUNCTION_NOT_FOUND:
			// fall back to the older call
		default:
			return 0, ret
		}
	}
	if !p.temperature {
		return 0, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU)
	return float64(t), ret
}

// memoryWithheld: the device answered, it just does not report memory.
func memoryWithheld(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_NO_PERMISSION
}

// cudaVersionString turns NVML's integer CUDA driver version (12040) into "12.4".
func cudaVersionString(v int) string {
	if v <= 0 {
		return ""
	}
	return strconv.Itoa(v/1000) + "." + strconv.Itoa((v%1000)/10)
}

// ensureInit waits up to DeviceTimeout for the nvmlInit in flight (starting
// one when none runs and the backoff has passed) and, when it succeeds,
// discovers the GPUs. It reports whether NVML is usable.
func (s *Sampler) ensureInit(ctx interface{ Done() <-chan struct{} }) bool {
	l := &s.life
	now := time.Now()
	l.mu.Lock()
	waiting := l.initCh == nil && now.Before(l.nextTry)
	l.mu.Unlock()
	if waiting {
		return false
	}
	l.startInit(s.lib, now)
	l.mu.Lock()
	ch, started := l.initCh, l.initStart
	l.mu.Unlock()

	t := time.NewTimer(s.cfg.DeviceTimeout)
	defer t.Stop()
	var ret nvml.Return
	select {
	case ret = <-ch:
	case <-t.C:
		running := time.Since(started)
		if running < s.cfg.InitTimeout {
			l.setDown(fmt.Sprintf("waiting for nvmlInit (running for %s)", running.Round(time.Second)))
			return false
		}
		l.setDown(fmt.Sprintf("nvmlInit has not returned for %s (deadline %s): the driver does not answer (still loading, or a GPU hung in it)",
			running.Round(time.Second), s.cfg.InitTimeout))
		l.mu.Lock()
		warn := !l.warned
		l.warned = true
		l.mu.Unlock()
		if warn {
			s.cfg.Log.Warn().Dur("running", running.Round(time.Millisecond)).Dur("deadline", s.cfg.InitTimeout).
				Msg("nvmlInit has not returned: waiting for the NVIDIA driver; /healthz and the page are served meanwhile, /readyz stays not ready")
		}
		return false
	case <-ctx.Done():
		return false
	}
	took := time.Since(started)
	l.mu.Lock()
	l.initCh = nil
	if ret == nvml.SUCCESS {
		l.inits++ // each one takes a reference on the library until its nvmlShutdown
		l.holding = true
	}
	l.mu.Unlock()
	if ret != nvml.SUCCESS {
		b := l.retryLater(s.cfg.MinBackoff, s.cfg.MaxBackoff, func(b time.Duration) string {
			return fmt.Sprintf("nvmlInit failed: %v; next try in %s", ret.Error(), b)
		})
		s.cfg.Log.Warn().Str("error", ret.Error()).Dur("retry_in", b).Msg("nvmlInit failed; trying again with backoff")
		return false
	}
	if err := s.discover(); err != nil {
		var r nvml.Return
		if errors.As(err, &r) && driverGone(r) {
			l.mu.Lock()
			l.ready = true // so that lost() releases what this nvmlInit took
			l.mu.Unlock()
			s.lost(err)
			return false
		}
		// The driver answers but cannot list the GPUs. NVML counts its
		// initialisations and keeps the library (and with it the driver)
		// until as many shutdowns: release this one before trying again.
		l.release(s.lib, s.anyBusy())
		b := l.retryLater(s.cfg.MinBackoff, s.cfg.MaxBackoff, func(b time.Duration) string {
			return fmt.Sprintf("NVML cannot list the GPUs (%v); next try in %s", err, b)
		})
		l.mu.Lock()
		first := !l.listWarned
		l.listWarned = true
		l.mu.Unlock()
		if first {
			s.cfg.Log.Warn().Err(err).Dur("retry_in", b).Msg("nvmlInit succeeded but NVML cannot list the GPUs: releasing NVML (nvmlShutdown) and initialising it again with backoff; logged once until it can")
		}
		return false
	}
	l.mu.Lock()
	l.ready = true
	l.gen++
	l.listWarned = false
	l.downReason, l.downSince, l.backoff, l.nextTry = "", time.Time{}, 0, time.Time{}
	gen, inits := l.gen, l.inits
	l.mu.Unlock()
	d := s.Driver()
	s.mu.Lock()
	n := len(s.workers)
	s.mu.Unlock()
	ev := s.cfg.Log.Info().Str("driver", d.DriverVersion).Str("cuda", d.CUDADriverVersion).Int("gpus", n).Dur("took", took.Round(time.Millisecond))
	if gen > 1 {
		ev.Int("inits", inits).Msg("NVML initialised again after the driver went away")
	} else {
		ev.Msg("NVML initialised")
	}
	return true
}

// anyBusy says whether a GPU's NVML calls have not returned.
func (s *Sampler) anyBusy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.workers {
		if w.busy.Load() {
			return true
		}
	}
	return false
}

// lost marks NVML unusable after a call said the driver went away, and
// releases the library (nvmlShutdown) so that this process holds nothing
// of the old driver: the next nvmlInit, with backoff, opens the new one.
func (s *Sampler) lost(err error) {
	l := &s.life
	l.mu.Lock()
	if !l.ready {
		l.mu.Unlock()
		return
	}
	l.ready = false
	l.downSince = s.cfg.Now()
	l.downReason = fmt.Sprintf("the driver went away (%v): initialising NVML again", err)
	l.backoff, l.nextTry = 0, time.Time{}
	l.mu.Unlock()
	s.cfg.Log.Error().Err(err).Msg("NVML answers that the driver went away (reloaded, upgraded or unloaded): releasing NVML, then initialising it again with backoff")
	l.release(s.lib, s.anyBusy())
}

// MIGDevices names the MIG devices the sampler read last in a GPU instance
// of a GPU (xid.InstanceResolver): the compute instance in.ComputeInstance,
// or every one when it is -1. The GPU is the one with that uuid, or at that
// index when uuid is "". known is false until a sample that began after the
// XID was received found the GPU's MIG devices: an XID may come from a
// device created (in place of one destroyed, with its IDs) since the
// previous sample.
func (s *Sampler) MIGDevices(gpu int, uuid string, in xid.Instance, received time.Time) (devices []xid.MIGDevice, known bool) {
	s.mu.Lock()
	workers := s.workers
	s.mu.Unlock()
	for _, w := range workers {
		w.identMu.Lock()
		if (uuid == "" && w.index != gpu) || (uuid != "" && uuid != w.ident.UUID) {
			w.identMu.Unlock()
			continue
		}
		defer w.identMu.Unlock()
		if w.ident.UUID == "" || w.migChecked.Before(received) {
			return nil, false
		}
		for _, m := range w.migIdent {
			if m.GPUInstance == in.GPUInstance && (in.ComputeInstance < 0 || m.ComputeInstance == in.ComputeInstance) {
				devices = append(devices, xid.MIGDevice{UUID: m.MIGUUID, ComputeInstance: m.ComputeInstance})
			}
		}
		return devices, true
	}
	return nil, false
}

// Status says whether NVML is usable now, and if not why and since when.
func (s *Sampler) Status() sample.NVMLStatus { return s.life.status() }

// downSample is the sample while NVML is unusable: every GPU known from
// before is down (so its series stay, at gpu_up 0), and the sample says why.
func (s *Sampler) downSample() *sample.NodeSample {
	s.mu.Lock()
	out := &sample.NodeSample{Time: s.cfg.Now(), Driver: s.driver}
	for _, w := range append(append([]*gpuWorker(nil), s.workers...), s.ghosts...) {
		out.GPUs = append(out.GPUs, w.staleState())
	}
	s.mu.Unlock()
	out.NVML = s.life.status()
	return out
}

// XIDSource returns the NVML event source of the sampler's library, gated
// by its life cycle: no set is opened before nvmlInit returned, a set is
// dropped when the driver goes away, and the library is never released
// under a wait in flight. The second result is false when the library
// provides no events.
func (s *Sampler) XIDSource() (xid.EventSource, bool) {
	src, ok := XIDSource(s.lib)
	if !ok {
		return nil, false
	}
	if _, isReal := s.lib.(*realNVML); !isReal {
		return src, true // a simulated library has no life cycle
	}
	if n, ok := src.(*xid.NVMLEventSource); ok {
		s.life.mu.Lock()
		s.life.registering = n.Registering
		s.life.mu.Unlock()
	}
	return &gatedSource{src: src, life: &s.life}, true
}
