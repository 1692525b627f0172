package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server/servertest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simagent"
)

var pollUntil = servertest.PollUntil

// freeAddr returns a free local TCP address.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// exporterRun is the simulated node's exporter running in this process.
type exporterRun struct {
	addr string
	logs *servertest.SyncBuffer
}

// startExporter runs gpu-pool-exporter-sim in process with args on a free
// address until the test ends, and waits until /readyz answers 200.
func startExporter(t *testing.T, args ...string) *exporterRun {
	t.Helper()
	r := &exporterRun{addr: freeAddr(t), logs: &servertest.SyncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- agent.Run(ctx, append(args, "--web.listen-address="+r.addr), io.Discard, r.logs, simagent.New())
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "http://"+r.addr+"/readyz", 200)
	return r
}

// waitFor waits until url answers status and returns the body.
func waitFor(t *testing.T, url string, status int) string {
	t.Helper()
	var body string
	var err error
	if !pollUntil(servertest.WaitTimeout, func() bool {
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
