package main

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Tests that only wait on an exporter of their own (its own port and
// simulated node) run at once (t.Parallel); those that count goroutines,
// measure latency, send signals or set the environment run alone.

// waitTimeout bounds a wait on a state that names no deadline of its own:
// generous, as the machine is shared; a wait that passes returns as soon as
// the state holds.
const waitTimeout = 15 * time.Second

// pollUntil polls cond every 20ms until it holds (true) or timeout passes
// (false); the caller says what failed, with what it knows.
func pollUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// waitUntil waits until cond holds, failing the test after waitTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(waitTimeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
	}
}

// waitFor waits until url answers status and returns the body.
func waitFor(t *testing.T, url string, status int) string {
	t.Helper()
	var body string
	var err error
	if !pollUntil(waitTimeout, func() bool {
		var resp *http.Response
		if resp, err = http.Get(url); err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == status
	}) {
		t.Fatalf("%s did not answer %d in time (last error %v)", url, status, err)
	}
	return body
}
