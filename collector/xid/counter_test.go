package xid

import (
	"sync"
	"testing"
	"time"
)

const uuid0 = "GPU-00000000-0000-0000-0000-000000000000"

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func total(c *Counter, gpu, code int) uint64 {
	var n uint64
	for _, s := range c.Snapshot() {
		if s.GPU == gpu && s.Code == code {
			n += s.Total
		}
	}
	return n
}

func TestEveryRepeatCounts(t *testing.T) {
	var c Counter // the zero value is usable
	c.Add(0, uuid0, 13, t0)
	c.Add(0, uuid0, 13, t0) // same code, same time: still a second event
	if got := total(&c, 0, 13); got != 2 {
		t.Fatalf("13 twice: total %d, want 2", got)
	}
	c.Add(0, uuid0, 13, time.Time{}) // zero time means now
	snap := c.Snapshot()
	if len(snap) != 1 || snap[0].Total != 3 || snap[0].Entry != Lookup(13) {
		t.Fatalf("Snapshot = %+v", snap)
	}
	if !snap[0].Last.After(t0) {
		t.Errorf("Last = %v, want now", snap[0].Last)
	}
}

func TestSnapshotSortedAndLastPerDevice(t *testing.T) {
	c := NewCounter()
	c.Add(1, "GPU-b", 79, t0.Add(5*time.Second))
	c.Add(0, "GPU-a", 48, t0.Add(2*time.Second))
	c.Add(0, "GPU-a", 13, t0.Add(3*time.Second))
	c.Add(0, "GPU-a", 13, t0.Add(1*time.Second)) // older event: Last must not go back
	snap := c.Snapshot()
	want := []struct {
		gpu   int
		code  int
		total uint64
		last  time.Time
	}{
		{0, 13, 2, t0.Add(3 * time.Second)},
		{0, 48, 1, t0.Add(2 * time.Second)},
		{1, 79, 1, t0.Add(5 * time.Second)},
	}
	if len(snap) != len(want) {
		t.Fatalf("Snapshot = %+v", snap)
	}
	for i, w := range want {
		s := snap[i]
		if s.GPU != w.gpu || s.Code != w.code || s.Total != w.total || !s.Last.Equal(w.last) {
			t.Errorf("Snapshot[%d] = %+v, want %+v", i, s, w)
		}
	}
	last := c.LastPerDevice()
	if len(last) != 2 ||
		last[0] != (DeviceLast{GPU: 0, UUID: "GPU-a", Code: 13, At: t0.Add(3 * time.Second)}) ||
		last[1] != (DeviceLast{GPU: 1, UUID: "GPU-b", Code: 79, At: t0.Add(5 * time.Second)}) {
		t.Errorf("LastPerDevice = %+v", last)
	}
}

func TestDedupNVMLThenDCGM(t *testing.T) {
	c := &Counter{}
	c.Add(0, uuid0, 48, t0)
	// DCGM's sample arrives later with the driver's timestamp, slightly off.
	if c.AddFrom(SourceDCGM, 0, uuid0, 48, t0.Add(-300*time.Millisecond)) {
		t.Error("DCGM report of an event NVML already counted was counted again")
	}
	// The next samples read the same last value again.
	for range 3 {
		if c.AddFrom(SourceDCGM, 0, uuid0, 48, t0.Add(-300*time.Millisecond)) {
			t.Error("re-read of DCGM's last value was counted")
		}
	}
	if got := total(c, 0, 48); got != 1 {
		t.Fatalf("total %d, want 1", got)
	}
	if c.Deduplicated() != 1 {
		t.Errorf("Deduplicated = %d, want 1", c.Deduplicated())
	}
}

func TestDedupDCGMThenNVML(t *testing.T) {
	c := &Counter{}
	if !c.AddFrom(SourceDCGM, 2, uuid0, 79, t0) {
		t.Fatal("first DCGM report not counted")
	}
	c.Add(2, uuid0, 79, t0.Add(time.Second)) // the NVML reader lost the race
	if got := total(c, 2, 79); got != 1 {
		t.Fatalf("total %d, want 1", got)
	}
}

func TestDedupRespectsWindowGPUAndCode(t *testing.T) {
	c := &Counter{Window: 2 * time.Second}
	c.Add(0, uuid0, 13, t0)
	// Outside the window: a different event that NVML missed.
	if !c.AddFrom(SourceDCGM, 0, uuid0, 13, t0.Add(5*time.Second)) {
		t.Error("DCGM event 5s after the NVML one was not counted")
	}
	// Other GPU, other code: never merged.
	if !c.AddFrom(SourceDCGM, 1, "GPU-1", 13, t0.Add(6*time.Second)) {
		t.Error("DCGM event on another GPU was not counted")
	}
	c.Add(0, uuid0, 31, t0.Add(7*time.Second))
	if !c.AddFrom(SourceDCGM, 0, uuid0, 13, t0.Add(7*time.Second)) {
		t.Error("DCGM Xid 13 merged with NVML Xid 31")
	}
	if got, want := total(c, 0, 13), uint64(3); got != want {
		t.Errorf("GPU 0 Xid 13 total %d, want %d", got, want)
	}
}

func TestDedupMatchesOnce(t *testing.T) {
	c := &Counter{}
	// NVML sees a burst of three; DCGM's last value collapses them into one.
	c.Add(0, uuid0, 13, t0)
	c.Add(0, uuid0, 13, t0.Add(100*time.Millisecond))
	c.Add(0, uuid0, 13, t0.Add(200*time.Millisecond))
	c.AddFrom(SourceDCGM, 0, uuid0, 13, t0.Add(200*time.Millisecond))
	if got := total(c, 0, 13); got != 3 {
		t.Fatalf("burst: total %d, want 3", got)
	}
	// One NVML event absorbs at most one DCGM observation: a second, distinct
	// DCGM value (new timestamp) is a new event even within the window.
	c2 := &Counter{}
	c2.Add(0, uuid0, 94, t0)
	c2.AddFrom(SourceDCGM, 0, uuid0, 94, t0)
	if !c2.AddFrom(SourceDCGM, 0, uuid0, 94, t0.Add(time.Second)) {
		t.Error("second distinct DCGM event was absorbed by an already matched NVML event")
	}
	if got := total(c2, 0, 94); got != 2 {
		t.Errorf("total %d, want 2", got)
	}
}

func TestDCGMValueFromBeforeStartIgnored(t *testing.T) {
	c := NewCounter()
	if c.AddFrom(SourceDCGM, 0, uuid0, 79, time.Now().Add(-24*time.Hour)) {
		t.Error("DCGM's last Xid from before the process started was counted")
	}
	if !c.AddFrom(SourceDCGM, 0, uuid0, 79, time.Now()) {
		t.Error("new DCGM Xid not counted")
	}
	if len(c.Snapshot()) != 1 {
		t.Errorf("Snapshot = %+v", c.Snapshot())
	}
}

func TestCounterRecentIsBounded(t *testing.T) {
	c := &Counter{}
	for i := range 10 * recentCap {
		c.Add(0, uuid0, 13, t0.Add(time.Duration(i)*time.Millisecond))
	}
	c.mu.Lock()
	n := len(c.recent[matchKey{0, 13}])
	c.mu.Unlock()
	if n > recentCap {
		t.Errorf("kept %d recent observations, cap %d", n, recentCap)
	}
	if got := total(c, 0, 13); got != uint64(10*recentCap) {
		t.Errorf("total %d", got)
	}
}

func TestCounterConcurrentAdd(t *testing.T) {
	c := NewCounter()
	const workers, each = 8, 500
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() { // scrape-side readers run while events arrive
		defer readers.Done()
		var prev uint64
		for {
			select {
			case <-stop:
				return
			default:
			}
			var sum uint64
			for _, s := range c.Snapshot() {
				sum += s.Total
			}
			if sum < prev {
				t.Errorf("total went down: %d -> %d", prev, sum)
				return
			}
			prev = sum
			c.LastPerDevice()
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if w%2 == 0 {
					c.Add(w%4, "GPU-x", 13, time.Time{})
				} else {
					c.AddFrom(SourceNVML, w%4, "GPU-x", 48+i%2, time.Time{})
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	var sum uint64
	for _, s := range c.Snapshot() {
		sum += s.Total
	}
	if sum != workers*each {
		t.Errorf("total %d, want %d", sum, workers*each)
	}
}

// The alert rules decide "new in the last hour" from First and Last, not from
// the counter's increase: both must follow event time, whatever the order of
// arrival.
func TestFirstAndLastPerSeries(t *testing.T) {
	c := NewCounter()
	c.Add(0, "GPU-a", 13, t0.Add(10*time.Second))
	c.Add(0, "GPU-a", 13, t0.Add(30*time.Second))
	c.Add(0, "GPU-a", 13, t0.Add(5*time.Second)) // arrives late: becomes First
	c.Add(0, "GPU-a", 79, t0.Add(20*time.Second))
	snap := c.Snapshot()
	if len(snap) != 2 {
		t.Fatalf("Snapshot = %+v", snap)
	}
	if s := snap[0]; s.Code != 13 || !s.First.Equal(t0.Add(5*time.Second)) || !s.Last.Equal(t0.Add(30*time.Second)) {
		t.Errorf("XID 13: First %v Last %v, want t0+5s and t0+30s", s.First, s.Last)
	}
	if s := snap[1]; s.Code != 79 || !s.First.Equal(t0.Add(20*time.Second)) || !s.Last.Equal(s.First) {
		t.Errorf("XID 79: First %v Last %v, want both t0+20s", s.First, s.Last)
	}
	// A deduplicated observation (DCGM re-reporting NVML's event) moves neither.
	c.AddFrom(SourceDCGM, 0, "GPU-a", 79, t0.Add(21*time.Second))
	if s := c.Snapshot()[1]; !s.Last.Equal(t0.Add(20*time.Second)) || s.Total != 1 {
		t.Errorf("after a duplicate: %+v", s)
	}
}

// The counter keeps the times of the events counted once asked, for as
// long as asked after each series' newest, in time order whatever order
// they came in; without KeepEvents it keeps none.
func TestCounterKeepsEventTimes(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := NewCounter()
	c.Add(0, "GPU-a", 13, t0)
	if r := c.Recent(); len(r) != 0 {
		t.Fatalf("kept %v without KeepEvents", r)
	}
	c.KeepEvents(5 * time.Minute)
	c.Add(0, "GPU-a", 13, t0.Add(time.Minute))
	c.Add(0, "GPU-a", 13, t0.Add(30*time.Second)) // late
	c.Add(1, "GPU-b", 79, t0.Add(2*time.Minute))
	c.Add(0, "GPU-a", 13, t0.Add(7*time.Minute)) // the first two are 6 and 6.5 minutes older
	got := c.Recent()
	want := []RecentEvent{
		{GPU: 0, UUID: "GPU-a", Code: 13, At: t0.Add(7 * time.Minute)},
		{GPU: 1, UUID: "GPU-b", Code: 79, At: t0.Add(2 * time.Minute)},
	}
	if len(got) != len(want) {
		t.Fatalf("Recent() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Recent()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	c.Add(0, "GPU-a", 13, t0.Add(8*time.Minute))
	c.Add(0, "GPU-a", 13, t0.Add(7*time.Minute+30*time.Second)) // late, within the window
	var at []time.Duration
	for _, e := range c.Recent() {
		if e.GPU == 0 {
			at = append(at, e.At.Sub(t0))
		}
	}
	if len(at) != 3 || at[0] != 7*time.Minute || at[1] != 7*time.Minute+30*time.Second || at[2] != 8*time.Minute {
		t.Errorf("GPU 0's kept times %v, want 7m, 7m30s, 8m in order", at)
	}
}
