package sample

// UnitKey names a schedulable unit: a whole GPU or a MIG device.
type UnitKey struct {
	GPU         int
	GPUInstance int // -1 for a whole GPU
	// ComputeInstance tells apart the MIG devices of one GPU instance that
	// holds several compute instances; -1 for a whole GPU.
	ComputeInstance int
}

// GPUKey is the key of a whole GPU.
func GPUKey(gpu int) UnitKey { return UnitKey{gpu, -1, -1} }

// MIGKey is the key of MIG device m of GPU gpu.
func MIGKey(gpu int, m *DeviceState) UnitKey {
	return UnitKey{gpu, m.GPUInstance, m.ComputeInstance}
}

// Unit is one schedulable unit of a sample.
type Unit struct {
	Key UnitKey
	// Device is the whole GPU's or the MIG device's state; GPU is its board.
	Device *DeviceState
	GPU    *GPUState
	// Healthy: the unit can take new work (GPUState.Healthy, and a MIG
	// device that answers).
	Healthy bool
}

// Units lists the sample's schedulable units in sample order: whole GPUs
// not in MIG mode, and the MIG devices of the others. A GPU in MIG mode
// without instances has none: no pod can get it (device plugins advertise
// MIG devices only) until instances are created.
func (s *NodeSample) Units() []Unit {
	n := 0
	for i := range s.GPUs {
		n += max(1, len(s.GPUs[i].MIG))
	}
	out := make([]Unit, 0, n)
	for i := range s.GPUs {
		g := &s.GPUs[i]
		ok := g.Healthy()
		if len(g.MIG) == 0 {
			if !g.MIGEnabled {
				out = append(out, Unit{Key: GPUKey(g.GPU), Device: &g.DeviceState, GPU: g, Healthy: ok})
			}
			continue
		}
		for j := range g.MIG {
			m := &g.MIG[j]
			out = append(out, Unit{Key: MIGKey(g.GPU, m), Device: m, GPU: g, Healthy: ok && m.Up && !m.Quarantined()})
		}
	}
	return out
}

// GPUByIndex is the GPU with NVML index gpu, nil when the sample has none.
func (s *NodeSample) GPUByIndex(gpu int) *GPUState {
	for i := range s.GPUs {
		if s.GPUs[i].GPU == gpu {
			return &s.GPUs[i]
		}
	}
	return nil
}

// UnitDevice is the device the key names, nil when the sample has none.
func (s *NodeSample) UnitDevice(key UnitKey) *DeviceState {
	g := s.GPUByIndex(key.GPU)
	if g == nil {
		return nil
	}
	if key.GPUInstance < 0 {
		return &g.DeviceState
	}
	for j := range g.MIG {
		if MIGKey(key.GPU, &g.MIG[j]) == key {
			return &g.MIG[j]
		}
	}
	return nil
}

// AnyUp says whether NVML answered for at least one GPU; a node without
// GPUs is a valid, if dull, node.
func (s *NodeSample) AnyUp() bool {
	if len(s.GPUs) == 0 {
		return true
	}
	for i := range s.GPUs {
		if s.GPUs[i].Up {
			return true
		}
	}
	return false
}

// Healthy says whether a GPU can take new work: NVML answers, its memory can
// still be repaired, and no reset is pending. A GPU whose row remapping
// failed (replace it), or that waits for a reset (rows to remap, pages to
// retire, an NVML recovery action) is unhealthy: never free capacity, even
// though NVML answers and pods may still run on it. So is one a DRA driver
// tainted NoSchedule or NoExecute as a whole GPU (its health check's
// verdict): the scheduler places no claim on it.
func (g *GPUState) Healthy() bool {
	h := &g.Health
	switch {
	case !g.Up, g.Quarantined(),
		h.RemapFailed.OK && h.RemapFailed.V,
		h.RemapPending.OK && h.RemapPending.V,
		h.RetiredPending.OK && h.RetiredPending.V,
		h.RecoveryAction.OK && h.RecoveryAction.V != 0:
		return false
	}
	return true
}

// ComputeInstances counts the MIG devices of GPU instance gi on the GPU.
func (g *GPUState) ComputeInstances(gi int) int {
	n := 0
	for i := range g.MIG {
		if g.MIG[i].GPUInstance == gi {
			n++
		}
	}
	return n
}

// UsableMemory is the memory pods can allocate: the total less what the
// driver reserves for itself (known from NVML memory v2).
func (d *DeviceState) UsableMemory() float64 {
	total, _ := d.Values.Get(FieldMemoryTotal)
	reserved, _ := d.Values.Get(FieldMemoryReserved)
	return total - reserved
}
