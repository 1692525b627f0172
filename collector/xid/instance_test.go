package xid

import "testing"

// NVML marks an event not attributable to a MIG instance with 0xFFFFFFFF.
func TestEventInstance(t *testing.T) {
	if in := eventInstance(noInstance, noInstance); in != nil {
		t.Errorf("whole-GPU event attributed to %+v", in)
	}
	if in := eventInstance(3, 1); in == nil || *in != (Instance{3, 1}) {
		t.Errorf("GI 3 CI 1: %+v", in)
	}
	if in := eventInstance(3, noInstance); in == nil || *in != (Instance{3, -1}) {
		t.Errorf("GI 3 without CI: %+v", in)
	}
}
