// Package servertest holds what the command's tests and its server's tests
// share to drive a running server: a log buffer both sides may use, waits on
// a state that names no deadline of its own, and a GET with basic auth.
package servertest

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer safe for a logger and the test.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitTimeout bounds a wait on a state that names no deadline of its own:
// generous, as the machine is shared; a wait that passes returns as soon as
// the state holds.
const WaitTimeout = 15 * time.Second

// PollUntil polls cond every 20ms until it holds (true) or timeout passes
// (false); the caller says what failed, with what it knows.
func PollUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// WaitUntil waits until cond holds, failing the test after WaitTimeout.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !PollUntil(WaitTimeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", WaitTimeout, what)
	}
}

// Get fetches url with c, with basic auth when user is set, and returns the
// status and body; a request that fails returns -1 and the error's text.
func Get(t testing.TB, c *http.Client, url, user, pass string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := c.Do(req)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
