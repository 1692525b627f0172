package podmap

import (
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultUnmatchedLimit is the number of distinct IDs an UnmatchedLogger
// keeps to tell new IDs from old ones when NewUnmatchedLogger is given a
// limit <= 0. Past it, summaries give counts without new/gone.
const DefaultUnmatchedLimit = 4096

// DefaultUnmatchedGap is the least time between two summaries.
const DefaultUnmatchedGap = time.Minute

// unmatchedExamples is how many IDs a summary names.
const unmatchedExamples = 5

// maxLogField bounds every name from the kubelet in a log line: an answer
// with megabyte device IDs must not make megabyte log lines.
const maxLogField = 128

// clip cuts s to maxLogField bytes (on a rune boundary), saying how long it was.
func clip(s string) string {
	if len(s) <= maxLogField {
		return s
	}
	cut := strings.ToValidUTF8(s[:maxLogField], "")
	return cut + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// UnmatchedLogger logs the device IDs that match no device as one bounded
// summary line (counts and a few examples) when the set of unmatched IDs
// changes, at most once per Gap, never one line per ID: a node with 50,000
// stale IDs logs what one with 5 does. It is safe for concurrent use.
type UnmatchedLogger struct {
	log   zerolog.Logger
	limit int
	// Gap is the least time between two summaries; a change within it is
	// summarised when the gap is over (by the next Log call).
	Gap time.Duration
	// Now replaces time.Now in tests.
	Now func() time.Time

	mu      sync.Mutex
	seed    maphash.Seed
	logged  fingerprint         // the set the last summary described
	prev    map[string]struct{} // that set, if it had at most limit IDs
	lastLog time.Time
}

// fingerprint identifies a multiset of IDs without keeping them: the count
// and two order-independent sums of their hashes.
type fingerprint struct {
	n        int
	sum, xor uint64
}

// NewUnmatchedLogger returns an UnmatchedLogger writing to log that keeps
// up to limit IDs (DefaultUnmatchedLimit if limit <= 0) to count new ones.
func NewUnmatchedLogger(log zerolog.Logger, limit int) *UnmatchedLogger {
	if limit <= 0 {
		limit = DefaultUnmatchedLimit
	}
	return &UnmatchedLogger{log: log, limit: limit, Gap: DefaultUnmatchedGap, Now: time.Now, seed: maphash.MakeSeed()}
}

func unmatchedKey(h *Holding) string { return h.Resource + "\x00" + h.DeviceID }

// Log is given every sample's unmatched holdings. It logs one summary line
// if they differ from those of the last summary and Gap has passed since
// it; it returns the number of lines logged (0 or 1).
func (u *UnmatchedLogger) Log(unmatched []Holding) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	var fp fingerprint
	for i := range unmatched {
		k := unmatchedKey(&unmatched[i])
		h := maphash.String(u.seed, k)
		fp.n++
		fp.sum += h
		fp.xor ^= h
	}
	if fp == u.logged {
		return 0
	}
	now := u.Now()
	if !u.lastLog.IsZero() && now.Sub(u.lastLog) < u.Gap {
		return 0 // summarised once the gap is over, if still different
	}
	var cur map[string]struct{}
	if len(unmatched) <= u.limit {
		cur = make(map[string]struct{}, len(unmatched))
		for i := range unmatched {
			cur[unmatchedKey(&unmatched[i])] = struct{}{}
		}
	}
	u.summarise(unmatched, cur)
	u.logged, u.prev, u.lastLog = fp, cur, now
	return 1
}

// summarise writes the one line.
func (u *UnmatchedLogger) summarise(unmatched []Holding, cur map[string]struct{}) {
	if len(unmatched) == 0 {
		u.log.Info().Msg("every device ID the kubelet reports matches a GPU or MIG instance again")
		return
	}
	ev := u.log.Warn().Int("unmatched", len(unmatched))
	byResource := map[string]int{}
	unparsed := 0
	for i := range unmatched {
		if len(byResource) < unmatchedExamples || byResource[unmatched[i].Resource] > 0 {
			byResource[clip(unmatched[i].Resource)]++
		}
		if unmatched[i].ParseErr != nil {
			unparsed++
		}
	}
	ev = ev.Int("not_understood", unparsed)
	d := zerolog.Dict()
	for r, n := range byResource {
		d = d.Int(r, n)
	}
	ev = ev.Dict("by_resource", d)
	// Examples: new IDs first where the last set is known.
	known := u.prev != nil && cur != nil
	if known {
		added, gone := 0, 0
		for k := range cur {
			if _, ok := u.prev[k]; !ok {
				added++
			}
		}
		for k := range u.prev {
			if _, ok := cur[k]; !ok {
				gone++
			}
		}
		ev = ev.Int("new", added).Int("gone", gone)
	}
	var examples []string
	pick := func(want func(h *Holding) bool) {
		for i := range unmatched {
			if len(examples) == unmatchedExamples {
				return
			}
			if want(&unmatched[i]) {
				examples = append(examples, describeUnmatched(&unmatched[i]))
			}
		}
	}
	if known {
		isOld := func(h *Holding) bool { _, ok := u.prev[unmatchedKey(h)]; return ok }
		pick(func(h *Holding) bool { return !isOld(h) })
		pick(isOld)
	} else {
		pick(func(*Holding) bool { return true })
	}
	ev.Strs("examples", examples).
		Msg("device IDs from the kubelet match no GPU or MIG instance on this node; their holders are not mapped (gpu_kubelet_unmatched_device_ids counts them; logged again when they change)")
}

// describeUnmatched is one example: who holds which ID, and why it matched nothing.
func describeUnmatched(h *Holding) string {
	s := clip(h.Resource) + " " + strconv.Quote(clip(h.DeviceID)) + " held by " + clip(h.Namespace) + "/" + clip(h.Pod) + "/" + clip(h.Container)
	if h.Dynamic != nil {
		s += " (claim " + clip(h.Dynamic.ClaimNamespace) + "/" + clip(h.Dynamic.ClaimName) + ", pool " + clip(h.Dynamic.PoolName) + ")"
	}
	if h.ParseErr != nil {
		return s + ": not understood: " + clip(h.ParseErr.Error())
	}
	return s + ": names no " + h.Ref.Kind.String() + " on this node"
}
