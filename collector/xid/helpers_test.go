package xid

import (
	"testing"
	"time"
)

// waitTimeout bounds every wait on a state: generous, as the machine is
// shared; a wait that passes returns as soon as the state holds.
const waitTimeout = 10 * time.Second

// pollUntil polls cond until it holds (true) or waitTimeout passes (false).
func pollUntil(cond func() bool) bool {
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// eventually waits until cond holds, failing the test after waitTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(cond) {
		t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
	}
}
