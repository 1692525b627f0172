package xid

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealNVMLEventSet runs against the real NVML library where one loads
// (a GPU node); elsewhere it is skipped. It opens an event set on every
// device, waits briefly (normally a timeout: no Xid), and runs the Reader
// for a moment to check that it comes up and stops on cancel.
func TestRealNVMLEventSet(t *testing.T) {
	lib := nvml.New()
	if !initNVML(lib) {
		t.Skip("NVML library not available")
	}
	defer func() { _ = lib.Shutdown() }()

	src := NewNVMLEventSource(lib, nil)
	src.Logf = t.Logf
	w, err := src.Open()
	if errors.Is(err, ErrNoDevices) {
		t.Skip("no device supports Xid or ECC events here")
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ev, err := w.Wait(200 * time.Millisecond)
	switch {
	case errors.Is(err, ErrTimeout):
	case err == nil:
		t.Logf("event: %+v", ev)
	default:
		t.Errorf("Wait: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	r := NewReader(src, nil)
	r.WaitTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if !pollUntil(r.Up) {
		t.Errorf("Reader not up: %v", r.LastError())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func initNVML(lib nvml.Interface) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return lib.Init() == nvml.SUCCESS
}
