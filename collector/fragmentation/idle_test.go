package fragmentation

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNewIdleTrackerValidation(t *testing.T) {
	tests := []struct {
		cfg     IdleConfig
		wantErr string // "" for valid
	}{
		{IdleConfig{DefaultIdleThreshold, DefaultIdleWindow}, ""},
		{IdleConfig{1, MinIdleWindow}, ""},
		{IdleConfig{0.0001, time.Hour}, ""},
		{IdleConfig{0, time.Minute}, "idle threshold 0 is out of range; want an activity ratio in (0, 1]"},
		{IdleConfig{-0.1, time.Minute}, "idle threshold -0.1 is out of range"},
		{IdleConfig{1.5, time.Minute}, "idle threshold 1.5 is out of range"},
		{IdleConfig{math.NaN(), time.Minute}, "idle threshold NaN is out of range"},
		{IdleConfig{0.05, 9 * time.Second}, "idle window 9s is too short; want at least 10s"},
		{IdleConfig{0.05, 0}, "idle window 0s is too short"},
		{IdleConfig{0.05, -time.Minute}, "idle window -1m0s is too short"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("threshold=%v/window=%v", tc.cfg.Threshold, tc.cfg.Window), func(t *testing.T) {
			tr, err := NewIdleTracker(tc.cfg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("NewIdleTracker(%+v): %v", tc.cfg, err)
			case tc.wantErr == "" && tr == nil:
				t.Errorf("NewIdleTracker(%+v): nil tracker", tc.cfg)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("NewIdleTracker(%+v) error = %v, want it to contain %q", tc.cfg, err, tc.wantErr)
			}
		})
	}
}

var (
	t0   = time.Unix(1_700_000_000, 0)
	keyA = HolderKey{Namespace: "ml", Pod: "train-0", Container: "main", Resource: "nvidia.com/gpu", GPU: 3, GPUInstance: -1}
	keyB = HolderKey{Namespace: "ml", Pod: "infer-0", Container: "main", Resource: "nvidia.com/mig-1g.10gb", GPU: 1, GPUInstance: 7}
)

func newTracker(t *testing.T, window time.Duration) *IdleTracker {
	t.Helper()
	tr, err := NewIdleTracker(IdleConfig{Threshold: 0.05, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// step is one sample of one holder and what the tracker must report.
type step struct {
	sec      int     // sample time, seconds after t0
	activity float64 // device activity
	known    bool
	uid      string
	idle     bool
	seconds  float64
}

func runSteps(t *testing.T, tr *IdleTracker, key HolderKey, steps []step) {
	t.Helper()
	for _, s := range steps {
		got := tr.Observe(at(s.sec), []Observation{{Key: key, Activity: s.activity, Known: s.known, PodUID: s.uid}})
		if len(got) != 1 || got[0].Key != key {
			t.Fatalf("t=%d: statuses %+v, want one for %+v", s.sec, got, key)
		}
		if got[0].Idle != s.idle || got[0].IdleSeconds != s.seconds {
			t.Errorf("t=%d activity=%v known=%v uid=%q: idle=%v seconds=%v, want idle=%v seconds=%v",
				s.sec, s.activity, s.known, s.uid, got[0].Idle, got[0].IdleSeconds, s.idle, s.seconds)
		}
	}
}

func TestIdleFlipShortWindow(t *testing.T) {
	// Window 30 s, threshold 0.05, a sample every 10 s.
	runSteps(t, newTracker(t, 30*time.Second), keyA, []step{
		{0, 0.01, true, "u1", false, 0},          // window starts at 0
		{10, 0.00, true, "u1", false, 0},         // 10 s below
		{20, 0.04, true, "u1", false, 0},         // 20 s below
		{30, 0.01, true, "u1", true, 0},          // 30 s >= window: idle; counting starts now
		{40, 0.02, true, "u1", true, 10},         // idle at 30 and 40: +10
		{50, 0.01, true, "u1", true, 20},         // +10
		{60, 0.05, true, "u1", false, 20},        // at the threshold is busy; the 50-60 gap is not counted
		{70, 0.01, true, "u1", false, 20},        // new window from 70
		{90, 0.01, true, "u1", false, 20},        // 20 s
		{100, 0.01, true, "u1", true, 20},        // 30 s: idle again
		{130, 0.01, true, "u1", true, 50},        // +30 (uneven sampling)
		{140, 0, false, "u1", false, 50},         // unknown: not idle, window reset
		{150, 0.01, true, "u1", false, 50},       // window restarts at 150
		{170, 0.01, true, "u1", false, 50},       // 20 s
		{180, 0.01, true, "u1", true, 50},        // 30 s: idle
		{190, math.NaN(), true, "u1", false, 50}, // NaN counts as unknown
		{200, -1, true, "u1", false, 50},         // negative counts as unknown
		{210, 0.9, true, "u1", false, 50},        // busy
	})
}

func TestIdleWindowNotMetByGap(t *testing.T) {
	// Two samples 29 s apart below threshold are not enough for a 30 s
	// window; the third, 30 s after the first, is.
	runSteps(t, newTracker(t, 30*time.Second), keyA, []step{
		{0, 0, true, "", false, 0},
		{29, 0, true, "", false, 0},
		{30, 0, true, "", true, 0},
		{90, 0, true, "", true, 60},
	})
}

func TestIdlePodReplacedOnSameDevice(t *testing.T) {
	tr := newTracker(t, 10*time.Second)
	runSteps(t, tr, keyA, []step{
		{0, 0, true, "uid-1", false, 0},
		{10, 0, true, "uid-1", true, 0},
		{20, 0, true, "uid-1", true, 10},
		// Same namespace/pod/container/device, new pod UID (a StatefulSet
		// pod recreated): a fresh holder, fresh window, counter from 0.
		{30, 0, true, "uid-2", false, 0},
		{40, 0, true, "uid-2", true, 0},
		{50, 0, true, "uid-2", true, 10},
	})
	// A different pod on the same device has a different key: its own
	// window, and the old holder, missing from the sample, is forgotten.
	other := keyA
	other.Pod = "train-1"
	got := tr.Observe(at(60), []Observation{{Key: other, Activity: 0, Known: true, PodUID: "uid-3"}})
	if len(got) != 1 || got[0].Idle || got[0].IdleSeconds != 0 {
		t.Errorf("new pod on the device: %+v, want not idle, 0 s", got)
	}
	if tr.Len() != 1 {
		t.Errorf("tracker follows %d holders, want 1 (the replaced one forgotten)", tr.Len())
	}
}

func TestIdleHolderDisappearsAndReturns(t *testing.T) {
	tr := newTracker(t, 10*time.Second)
	both := func(sec int) []IdleStatus {
		return tr.Observe(at(sec), []Observation{
			{Key: keyA, Activity: 0, Known: true, PodUID: "a"},
			{Key: keyB, Activity: 0.5, Known: true, PodUID: "b"},
		})
	}
	both(0)
	both(10)
	got := both(20)
	// A idle since 10 (window 0-10), +10 at 20. B busy. Order as in obs.
	if len(got) != 2 || got[0].Key != keyA || got[1].Key != keyB ||
		!got[0].Idle || got[0].IdleSeconds != 10 || got[1].Idle {
		t.Fatalf("statuses %+v", got)
	}
	if n := IdleDevices(got); n != 1 {
		t.Errorf("IdleDevices = %d, want 1", n)
	}
	// A missing from one sample: forgotten.
	tr.Observe(at(30), []Observation{{Key: keyB, Activity: 0.5, Known: true, PodUID: "b"}})
	if tr.Len() != 1 {
		t.Errorf("Len = %d, want 1", tr.Len())
	}
	got = both(40)
	if got[0].Idle || got[0].IdleSeconds != 0 {
		t.Errorf("returning holder %+v, want a fresh one (not idle, 0 s)", got[0])
	}
	// Empty sample: everything forgotten, nothing reported.
	if got := tr.Observe(at(50), nil); len(got) != 0 || tr.Len() != 0 {
		t.Errorf("empty sample: %+v, Len %d", got, tr.Len())
	}
}

func TestIdleDuplicateKeyInOneSample(t *testing.T) {
	tr := newTracker(t, 10*time.Second)
	obs := func(sec int, acts ...float64) []IdleStatus {
		var o []Observation
		for _, a := range acts {
			o = append(o, Observation{Key: keyA, Activity: a, Known: true})
		}
		return tr.Observe(at(sec), o)
	}
	obs(0, 0, 0)
	obs(10, 0, 0) // idle from 10
	got := obs(20, 0, 0)
	if len(got) != 1 || !got[0].Idle || got[0].IdleSeconds != 10 {
		t.Fatalf("duplicates folded: %+v, want one idle status with 10 s", got)
	}
	// One busy duplicate: not idle, and the 20-30 interval is not counted.
	got = obs(30, 0, 0.9)
	if len(got) != 1 || got[0].Idle || got[0].IdleSeconds != 10 {
		t.Fatalf("busy duplicate: %+v, want not idle with 10 s", got)
	}
	got = obs(40, 0)
	if got[0].Idle || got[0].IdleSeconds != 10 {
		t.Fatalf("after busy duplicate: %+v, want a new window (not idle, 10 s)", got)
	}
}

func TestIdleClockStepsBack(t *testing.T) {
	runSteps(t, newTracker(t, 10*time.Second), keyA, []step{
		{100, 0, true, "", false, 0},
		{110, 0, true, "", true, 0},
		{120, 0, true, "", true, 10},
		{50, 0, true, "", false, 10}, // back in time: window restarts at 50
		{55, 0, true, "", false, 10},
		{60, 0, true, "", true, 10},
		{70, 0, true, "", true, 20},
		{70, 0, true, "", true, 20}, // same instant again: nothing accrues
	})
}

func TestIdleDevices(t *testing.T) {
	s := func(gpu, gi int, pod string, idle bool) IdleStatus {
		return IdleStatus{Key: HolderKey{Pod: pod, GPU: gpu, GPUInstance: gi}, Idle: idle}
	}
	tests := []struct {
		name string
		in   []IdleStatus
		want int
	}{
		{"none", nil, 0},
		// GPU 0 idle; GPU 1 busy.
		{"whole GPUs", []IdleStatus{s(0, -1, "a", true), s(1, -1, "b", false)}, 1},
		// GPU 2 time-sliced by two idle holders: one device.
		{"time-sliced all idle", []IdleStatus{s(2, -1, "a", true), s(2, -1, "b", true)}, 1},
		// One of two holders busy (listed second or first): not counted.
		{"time-sliced one busy", []IdleStatus{s(2, -1, "a", true), s(2, -1, "b", false)}, 0},
		{"time-sliced busy first", []IdleStatus{s(2, -1, "a", false), s(2, -1, "b", true)}, 0},
		// MIG instances 1 and 2 of GPU 0 and the whole GPU 0 entry are
		// distinct devices.
		{"MIG", []IdleStatus{s(0, 1, "a", true), s(0, 2, "b", true), s(0, -1, "c", true), s(0, 2, "d", true)}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IdleDevices(tc.in); got != tc.want {
				t.Errorf("%s: IdleDevices = %d, want %d", tc.name, got, tc.want)
			}
		})
	}
}

func TestIdleCounterMonotonic(t *testing.T) {
	// Random activity, unknowns, jitter, holders coming and going and pods
	// being replaced: for a holder that stays (same key and UID, present in
	// every sample) the counter never decreases and never grows by more than
	// the time since its previous sample.
	rng := rand.New(rand.NewPCG(1, 2))
	tr := newTracker(t, 10*time.Second)
	keys := []HolderKey{keyA, keyB, {Pod: "c", GPU: 2, GPUInstance: -1}}
	type prev struct {
		uid     string
		seconds float64
		at      time.Time
	}
	last := map[HolderKey]prev{}
	now := t0
	for i := 0; i < 5000; i++ {
		now = now.Add(time.Duration(1+rng.IntN(15)) * time.Second)
		var obs []Observation
		for _, k := range keys {
			if rng.IntN(20) == 0 {
				continue // holder gone this sample
			}
			uid := "u"
			if rng.IntN(50) == 0 {
				uid = "replaced"
			}
			obs = append(obs, Observation{Key: k, Activity: rng.Float64() * 0.06, Known: rng.IntN(30) != 0, PodUID: uid})
		}
		seen := map[HolderKey]bool{}
		for j, st := range tr.Observe(now, obs) {
			seen[st.Key] = true
			p, ok := last[st.Key]
			if ok && p.uid == obs[j].PodUID {
				if st.IdleSeconds < p.seconds {
					t.Fatalf("sample %d: %v counter went down %v -> %v", i, st.Key, p.seconds, st.IdleSeconds)
				}
				if d := st.IdleSeconds - p.seconds; d > now.Sub(p.at).Seconds() {
					t.Fatalf("sample %d: %v counter grew %v in %v", i, st.Key, d, now.Sub(p.at))
				}
			} else if st.IdleSeconds != 0 {
				t.Fatalf("sample %d: new holder %v starts at %v", i, st.Key, st.IdleSeconds)
			}
			last[st.Key] = prev{obs[j].PodUID, st.IdleSeconds, now}
		}
		for k := range last {
			if !seen[k] {
				delete(last, k)
			}
		}
	}
}

func TestIdleTrackerConcurrent(t *testing.T) {
	// Run with -race: Observe and Len from several goroutines.
	tr := newTracker(t, 10*time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				tr.Observe(at(i), []Observation{{Key: keyA, Known: true}})
				tr.Len()
			}
		}()
	}
	wg.Wait()
}

// Unknown activity is neither idle nor busy: the status says so, and a
// holder seen twice in one sample is known only if both observations are.
func TestIdleStatusKnown(t *testing.T) {
	tr, err := NewIdleTracker(IdleConfig{Threshold: 0.05, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a := HolderKey{Namespace: "ns", Pod: "a", GPU: 0, GPUInstance: 1}
	b := HolderKey{Namespace: "ns", Pod: "b", GPU: 0, GPUInstance: 2}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := tr.Observe(now, []Observation{
		{Key: a, Activity: 0, Known: false},
		{Key: b, Activity: 0, Known: true},
		{Key: b, Activity: 0.5, Known: false},
	})
	if len(st) != 2 || st[0].Known || st[0].Idle || st[1].Known {
		t.Fatalf("statuses %+v: want a and b unknown, not idle", st)
	}
	st = tr.Observe(now.Add(2*time.Minute), []Observation{{Key: b, Activity: 0, Known: true}})
	if len(st) != 1 || !st[0].Known {
		t.Fatalf("statuses %+v: want b known", st)
	}
}

// QuietSince is the start of the current below-threshold run (the landing
// page's "idle for"), zero while busy or unknown.
func TestIdleQuietSince(t *testing.T) {
	tr := newTracker(t, 30*time.Second)
	for _, s := range []struct {
		sec      int
		activity float64
		known    bool
		since    int // -1: zero
	}{
		{0, 0.5, true, -1},
		{10, 0.01, true, 10},
		{20, 0.0, true, 10},
		{50, 0.0, true, 10}, // idle now, still quiet since 10
		{60, 0.9, true, -1},
		{70, 0.0, false, -1}, // unknown is not quiet
		{80, 0.0, true, 80},
	} {
		got := tr.Observe(at(s.sec), []Observation{{Key: keyA, Activity: s.activity, Known: s.known}})
		want := time.Time{}
		if s.since >= 0 {
			want = at(s.since)
		}
		if !got[0].QuietSince.Equal(want) {
			t.Errorf("t=%d: QuietSince %v, want %v", s.sec, got[0].QuietSince, want)
		}
	}
}
