package main

import (
	"io"
	"net/http"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/cmd/gpu-pool-exporter/internal/servertest"
)

// Tests that only wait on an exporter of their own (its own port and
// simulated node) run at once (t.Parallel); those that count goroutines,
// measure latency, send signals or set the environment run alone.

// The shared helpers of servertest under the names these tests use.
type syncBuffer = servertest.SyncBuffer

const waitTimeout = servertest.WaitTimeout

var (
	pollUntil = servertest.PollUntil
	waitUntil = servertest.WaitUntil
	get       = servertest.Get
)

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
