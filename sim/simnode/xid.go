package simnode

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// XIDSource is the node's NVML event set: it delivers the scenario's XID
// faults as events when their time comes. Like a real event set, one that is
// re-created sees only events raised after it.
func (n *Node) XIDSource() xid.EventSource { return &xidSource{n: n} }

type xidSource struct {
	n      *Node
	mu     sync.Mutex
	cursor time.Duration // events before this were delivered
	queue  []XIDEvent
}

func (s *xidSource) Open() (xid.Waiter, error) {
	if s.n.unsupported("events") {
		return nil, fmt.Errorf("creating an NVML event set: %w", xid.ErrEventsNotSupported)
	}
	return s, nil
}

// unsupported reports whether the scenario's node answers NOT_SUPPORTED for
// a feature (node.unsupported: ecc, power, events).
func (n *Node) unsupported(feature string) bool {
	for _, f := range n.Scenario.Node.Unsupported {
		if f == feature {
			return true
		}
	}
	return false
}

func (s *xidSource) Close() error { return nil }

// Wait returns the next event, or xid.ErrTimeout after timeout.
func (s *xidSource) Wait(timeout time.Duration) (xid.Event, error) {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		now := s.n.elapsed()
		if now > s.cursor {
			s.queue = append(s.queue, s.n.XIDsBetween(s.cursor, now)...)
			s.cursor = now
		}
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			s.n.count()
			ev := xid.Event{GPU: e.GPU, UUID: e.UUID, Type: nvml.EventTypeXidCriticalError, Data: uint64(e.Code), Time: s.n.start.Add(e.At)}
			if e.GPUInstance >= 0 {
				ev.Instance = &xid.Instance{GPUInstance: e.GPUInstance, ComputeInstance: e.ComputeInstance}
			}
			return ev, nil
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			return xid.Event{}, xid.ErrTimeout
		}
		select {
		case <-s.n.closed:
			return xid.Event{}, xid.ErrTimeout
		case <-time.After(min(100*time.Millisecond, time.Until(deadline)+time.Millisecond)):
		}
	}
}

// Covered reports every simulated GPU registered: the simulated set never
// leaves a GPU out. A board without ECC registers for XIDs only, as NVML
// delivers ECC events only on ECC-enabled devices.
func (s *xidSource) Covered() []xid.Coverage {
	types := uint64(nvml.EventTypeXidCriticalError)
	if !s.n.unsupported("ecc") {
		types |= nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError
	}
	out := make([]xid.Coverage, 0, len(s.n.devices))
	for _, d := range s.n.devices {
		out = append(out, xid.Coverage{GPU: d.index, UUID: d.mock.UUID, Registered: true, Types: types})
	}
	return out
}
