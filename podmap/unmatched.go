package podmap

import (
	"sync"

	"github.com/rs/zerolog"
)

// DefaultUnmatchedLimit is the number of distinct IDs an UnmatchedLogger
// remembers when NewUnmatchedLogger is given a limit <= 0.
const DefaultUnmatchedLimit = 4096

// UnmatchedLogger logs each unmatched device ID once, not on every sample.
// It remembers at most limit IDs; past that the oldest is forgotten (and
// would be logged again if it came back), so it cannot grow without bound.
// It is safe for concurrent use.
type UnmatchedLogger struct {
	log   zerolog.Logger
	mu    sync.Mutex
	seen  map[string]struct{}
	ring  []string // insertion order, for eviction
	next  int      // next ring slot to overwrite once full
	limit int
}

// NewUnmatchedLogger returns an UnmatchedLogger writing to log and
// remembering up to limit IDs (DefaultUnmatchedLimit if limit <= 0).
func NewUnmatchedLogger(log zerolog.Logger, limit int) *UnmatchedLogger {
	if limit <= 0 {
		limit = DefaultUnmatchedLimit
	}
	return &UnmatchedLogger{log: log, seen: make(map[string]struct{}), limit: limit}
}

// First reports whether key has not been seen before (among the remembered
// ones), and remembers it.
func (u *UnmatchedLogger) First(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.seen[key]; ok {
		return false
	}
	if len(u.ring) < u.limit {
		u.ring = append(u.ring, key)
	} else {
		delete(u.seen, u.ring[u.next])
		u.ring[u.next] = key
		u.next = (u.next + 1) % u.limit
	}
	u.seen[key] = struct{}{}
	return true
}

// Len returns the number of IDs remembered.
func (u *UnmatchedLogger) Len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

// Log logs, at warning level, every holding whose (resource, device ID) has
// not been logged before, with the reason: the parse error, or that the
// node's inventory has no such device. It returns the number logged.
func (u *UnmatchedLogger) Log(unmatched []Holding) int {
	n := 0
	for _, h := range unmatched {
		if !u.First(h.Resource + "\x00" + h.DeviceID) {
			continue
		}
		n++
		ev := u.log.Warn().Str("resource", h.Resource).Str("device_id", h.DeviceID).
			Str("namespace", h.Namespace).Str("pod", h.Pod).Str("container", h.Container)
		if h.Dynamic != nil {
			ev = ev.Str("claim", h.Dynamic.ClaimNamespace+"/"+h.Dynamic.ClaimName).Str("pool", h.Dynamic.PoolName)
		}
		if h.ParseErr != nil {
			ev.Err(h.ParseErr).Msg("device ID not understood; its holder is not mapped to a GPU (logged once)")
		} else {
			ev.Str("kind", h.Ref.Kind.String()).
				Msg("device ID names no GPU or MIG instance on this node; its holder is not mapped (logged once)")
		}
	}
	return n
}
