package nvmlsampler_test

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// waitTimeout bounds every wait on a state: generous, as the machine is
// shared; a wait that passes returns as soon as the state holds.
const waitTimeout = 10 * time.Second

// waitUntil polls cond until it holds, failing the test after waitTimeout.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// syncBuffer is a log sink safe for the sampler's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
