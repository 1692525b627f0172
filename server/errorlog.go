package server

import (
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"
)

// serverErrorLog takes net/http's own error lines (TLS handshakes that
// fail, connections closed mid-request: any client can cause them at will)
// to the debug level, rate-limited, with the number of lines left out since
// the last one written. (A zerolog.Logger used as the writer itself writes
// at no level, which every log level lets through.)
type serverErrorLog struct {
	log     zerolog.Logger
	limit   *rate.Limiter
	dropped atomic.Int64
}

func newServerErrorLog(log zerolog.Logger) *serverErrorLog {
	return &serverErrorLog{log: log, limit: rate.NewLimiter(serverErrorRate, serverErrorBurst)}
}

func (l *serverErrorLog) Write(p []byte) (int, error) {
	if l.log.GetLevel() > zerolog.DebugLevel {
		return len(p), nil
	}
	if !l.limit.Allow() {
		l.dropped.Add(1)
		return len(p), nil
	}
	line := strings.TrimSpace(string(p[:min(len(p), maxLogLine)]))
	e := l.log.Debug()
	if n := l.dropped.Swap(0); n > 0 {
		e = e.Int64("lines_left_out", n)
	}
	e.Msg(line)
	return len(p), nil
}
