package podmap

import (
	"fmt"
	"testing"
	"time"
)

// waitTimeout bounds every wait on a state: generous, as the machine is
// shared; a wait that passes returns as soon as the state holds.
const waitTimeout = 10 * time.Second

// waitUntil polls cond until it holds, failing the test after waitTimeout;
// what says what it waits for (a string, or a fmt.Stringer worded on failure).
func waitUntil(t testing.TB, what any, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %v", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// snapshotNote words the client's last snapshot when a wait fails.
type snapshotNote struct {
	what string
	c    *Client
}

func (n snapshotNote) String() string {
	s := n.c.Snapshot()
	return fmt.Sprintf("%s; last snapshot: Up=%v Errors=%d Err=%v holdings=%d", n.what, s.Up, s.Errors, s.Err, len(s.Holdings))
}

// waitFor polls the client's snapshot until cond holds on it.
func waitFor(t testing.TB, what string, cond func(*Snapshot) bool, c *Client) *Snapshot {
	t.Helper()
	var s *Snapshot
	waitUntil(t, snapshotNote{what, c}, func() bool {
		s = c.Snapshot()
		return cond(s)
	})
	return s
}
