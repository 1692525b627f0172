package podmap

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// A kubelet answer with huge names (megabyte device IDs, resource and pod
// names) makes a log line of bounded size, not one as long as the answer.
func TestUnmatchedLogLineIsBounded(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	var unmatched []Holding
	for i := 0; i < 10; i++ {
		unmatched = append(unmatched, Holding{Resource: "nvidia.com/gpu" + huge + string(rune('a'+i)), DeviceID: huge + string(rune('a'+i)),
			Namespace: huge, Pod: huge, Container: huge})
	}
	var buf bytes.Buffer
	l := NewUnmatchedLogger(zerolog.New(&buf), 0)
	if n := l.Log(unmatched); n != 1 {
		t.Fatalf("%d lines logged, want 1", n)
	}
	if buf.Len() > 16<<10 {
		t.Errorf("one log line of %d bytes for 10 device IDs of 1 MiB, want at most 16 KiB", buf.Len())
	}
	if !strings.Contains(buf.String(), "(1048577 bytes)") {
		t.Errorf("the cut names do not say how long they were: %.300s", buf.String())
	}
}
