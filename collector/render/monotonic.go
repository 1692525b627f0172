package render

import (
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// counterRetention is how long a counter series that left the page is
// remembered: a GPU that is reset or falls off the bus comes back within
// it, and its counters go on from where they were.
const counterRetention = time.Hour

// monotonic keeps every counter the exporter serves (all but notCounts)
// from falling for the life of the process. NVML's and DCGM's counters
// restart at a GPU reset, a driver reload or a host engine restart (ECC
// volatile counts, energy), and
// a series can vanish and come back; Prometheus would read a fall as a
// reset and rate() would lose or invent increases. Each series serves its
// raw value plus an offset: when the raw value falls, the source was reset,
// so the offset grows by the last raw value and the new raw value counts
// from zero (the delta since the reset).
type monotonic struct {
	series map[string]*counterSeries
	resets map[string]uint64 // metric name -> resets seen
	key    strings.Builder
}

type counterSeries struct {
	raw, offset float64
	seen        time.Time
}

func newMonotonic() *monotonic {
	return &monotonic{series: map[string]*counterSeries{}, resets: map[string]uint64{}}
}

// apply rewrites the counters of mfs in place and returns the names of the
// metrics that were reset in this render.
func (m *monotonic) apply(mfs []*dto.MetricFamily, now time.Time) (reset []string) {
	for _, mf := range mfs {
		if mf.GetType() != dto.MetricType_COUNTER {
			continue
		}
		name := mf.GetName()
		if !CounterProtected(name) {
			continue
		}
		wasReset := false
		for _, mt := range mf.Metric {
			c := mt.GetCounter()
			if c == nil {
				continue
			}
			raw := c.GetValue()
			k := m.seriesKey(name, mt.Label)
			s := m.series[k]
			switch {
			case s == nil:
				s = &counterSeries{raw: raw}
				m.series[k] = s
			case raw < s.raw: // reset (NaN never compares below)
				s.offset += s.raw
				m.resets[name]++
				wasReset = true
			}
			s.raw, s.seen = raw, now
			if s.offset != 0 {
				v := raw + s.offset
				c.Value = &v
			}
		}
		if wasReset {
			reset = append(reset, name)
		}
	}
	for k, s := range m.series {
		if now.Sub(s.seen) > counterRetention {
			delete(m.series, k)
		}
	}
	return reset
}

func (m *monotonic) seriesKey(name string, labels []*dto.LabelPair) string {
	m.key.Reset()
	m.key.WriteString(name)
	for _, l := range labels {
		m.key.WriteByte(0xff)
		m.key.WriteString(l.GetName())
		m.key.WriteByte(0xfe)
		m.key.WriteString(l.GetValue())
	}
	return m.key.String()
}

// CounterProtected says whether the counter family name is kept from
// falling: every counter family but a DCGM field's (named as a counters
// file may name it) whose value is not a count: a counters file may type
// it counter (dcgm-exporter's types DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL so),
// but its value goes up and down, and protected it would ratchet up by
// every fall.
func CounterProtected(name string) bool {
	if _, ok := dcgmFieldNames()[name]; !ok {
		return true
	}
	f, _, ok := compatFieldOf(name)
	return ok && f.count
}
