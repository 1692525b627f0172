package dcgm_test

import (
	"testing"
	"time"
)

// minWaitTimeout is the shortest deadline of any wait on a state: the
// machine is shared, and a wait that passes returns as soon as the state
// holds, so only a failing wait pays for it.
const minWaitTimeout = 10 * time.Second

// waitFor polls cond until it holds, failing the test after timeout or
// minWaitTimeout, whichever is longer.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout = max(timeout, minWaitTimeout)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
