package xid

import (
	"cmp"
	"slices"
	"time"
)

// Instance is a MIG device: a GPU instance and, when NVML names it, a
// compute instance (-1 when it does not).
type Instance struct{ GPUInstance, ComputeInstance int }

// noInstance is NVML's "not attributable to an instance" (0xFFFFFFFF).
const noInstance = ^uint32(0)

// eventInstance reads the instance IDs of an NVML event.
func eventInstance(gi, ci uint32) *Instance {
	if gi == noInstance {
		return nil
	}
	in := &Instance{GPUInstance: int(gi), ComputeInstance: -1}
	if ci != noInstance {
		in.ComputeInstance = int(ci)
	}
	return in
}

// MIGDevice is one MIG device (one compute instance), by its identity.
type MIGDevice struct {
	UUID            string
	ComputeInstance int
}

// InstanceResolver names the MIG devices behind an XID's instance IDs.
// NVML's event carries a GPU instance and a compute instance ID only, and
// the driver hands those IDs to the next instance created in their place
// (another profile, another tenant): counted by the device's UUID, a
// tenant's XIDs stay with its device and leave with it.
type InstanceResolver interface {
	// MIGDevices returns the MIG devices of the GPU with that uuid (at NVML
	// index gpu when uuid is "") in GPU instance in.GPUInstance with
	// compute instance in.ComputeInstance, or every compute instance of it
	// when that is -1, as they were when the XID was received (received,
	// by this process's clock, time.Now). known is false while the GPU's
	// MIG devices have not been read since: a device destroyed and another
	// created with its IDs just before the XID must not take the new
	// device's XID with it.
	MIGDevices(gpu int, uuid string, in Instance, received time.Time) (devices []MIGDevice, known bool)
}

// InstanceCount is the Xid events of one code on one MIG device; they are
// also counted on the GPU. An XID NVML attributes to a GPU instance but to
// none of its compute instances hits every holder of the GPU instance and
// is counted on each of its compute instances.
type InstanceCount struct {
	GPU  int
	UUID string
	// Instance is the device's GPU and compute instance IDs when the XID
	// came.
	Instance Instance
	// MIGUUID is the MIG device's UUID; "" where no device could be named
	// (no resolver, or none had the IDs when the XID came): the count then
	// stays with the IDs, ComputeInstance -1 where NVML named none.
	MIGUUID string
	Code    int
	Entry   Entry
	Total   uint64
	Last    time.Time
}

type instanceKey struct {
	gpu      int
	uuid     string
	instance Instance
	migUUID  string
	code     int
}

// instanceXID is one XID event NVML attributed to a MIG instance.
type instanceXID struct {
	gpu  int
	uuid string
	in   Instance
	code int
	at   time.Time
	// received is when the Reader got it, by time.Now: the event's own
	// time may come from another clock (a simulated node's).
	received time.Time
}

// Events waiting for their GPU's MIG devices to be read are kept at most
// this long and this many; past that they are counted by their IDs.
const (
	pendingFor = time.Minute
	maxPending = 4096
)

// instanceCounts counts the Xid events of MIG devices, by device. The
// Reader serialises its use.
type instanceCounts struct {
	series  map[instanceKey]*series
	pending []instanceXID
}

// add counts x on the devices res names for it; one whose GPU's MIG
// devices have not been read waits for resolvePending.
func (c *instanceCounts) add(res InstanceResolver, x instanceXID) {
	if res == nil {
		c.count(x, MIGDevice{ComputeInstance: x.in.ComputeInstance})
		return
	}
	devs, known := res.MIGDevices(x.gpu, x.uuid, x.in, x.received)
	if !known && len(c.pending) < maxPending {
		c.pending = append(c.pending, x)
		return
	}
	c.place(x, devs)
}

// resolvePending counts the waiting events whose GPU res can name now, and
// those that waited too long by their IDs.
func (c *instanceCounts) resolvePending(res InstanceResolver, now time.Time) {
	kept := c.pending[:0]
	for _, x := range c.pending {
		var devs []MIGDevice
		known := false
		if res != nil {
			devs, known = res.MIGDevices(x.gpu, x.uuid, x.in, x.received)
		}
		if !known && now.Sub(x.at) < pendingFor {
			kept = append(kept, x)
			continue
		}
		c.place(x, devs)
	}
	c.pending = kept
}

// place counts x on each of devs, or by its IDs when there are none.
func (c *instanceCounts) place(x instanceXID, devs []MIGDevice) {
	if len(devs) == 0 {
		c.count(x, MIGDevice{ComputeInstance: x.in.ComputeInstance})
		return
	}
	for _, d := range devs {
		c.count(x, d)
	}
}

func (c *instanceCounts) count(x instanceXID, d MIGDevice) {
	if c.series == nil {
		c.series = map[instanceKey]*series{}
	}
	k := instanceKey{x.gpu, x.uuid, Instance{x.in.GPUInstance, d.ComputeInstance}, d.UUID, x.code}
	s := c.series[k]
	if s == nil {
		s = &series{}
		c.series[k] = s
	}
	s.total++
	if x.at.After(s.last) {
		s.last = x.at
	}
}

// snapshot lists the counts ordered by GPU, GPU instance, compute
// instance, MIG device and code.
func (c *instanceCounts) snapshot() []InstanceCount {
	out := make([]InstanceCount, 0, len(c.series))
	for k, s := range c.series {
		out = append(out, InstanceCount{GPU: k.gpu, UUID: k.uuid, Instance: k.instance, MIGUUID: k.migUUID,
			Code: k.code, Entry: Lookup(k.code), Total: s.total, Last: s.last})
	}
	slices.SortFunc(out, func(a, b InstanceCount) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.UUID, b.UUID),
			cmp.Compare(a.Instance.GPUInstance, b.Instance.GPUInstance),
			cmp.Compare(a.Instance.ComputeInstance, b.Instance.ComputeInstance),
			cmp.Compare(a.MIGUUID, b.MIGUUID), cmp.Compare(a.Code, b.Code))
	})
	return out
}
