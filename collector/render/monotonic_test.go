package render

import (
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func counterFamily(name string, values map[string]float64) *dto.MetricFamily {
	mf := &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_COUNTER.Enum()}
	for gpu, v := range values {
		mf.Metric = append(mf.Metric, &dto.Metric{
			Label:   []*dto.LabelPair{{Name: proto.String("gpu"), Value: proto.String(gpu)}},
			Counter: &dto.Counter{Value: proto.Float64(v)},
		})
	}
	return mf
}

func TestMonotonicCounters(t *testing.T) {
	m := newMonotonic()
	t0 := time.Unix(1e9, 0)
	step := func(at time.Duration, raw map[string]float64) map[string]float64 {
		mf := counterFamily("x_total", raw)
		gauge := &dto.MetricFamily{Name: proto.String("g"), Type: dto.MetricType_GAUGE.Enum(),
			Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(1)}}}}
		m.apply([]*dto.MetricFamily{mf, gauge}, t0.Add(at))
		out := map[string]float64{}
		for _, mt := range mf.Metric {
			out[mt.Label[0].GetValue()] = mt.Counter.GetValue()
		}
		return out
	}
	step(0, map[string]float64{"0": 1.8e19, "1": 5})
	if got := step(time.Second, map[string]float64{"0": 4, "1": 7}); got["0"] != 1.8e19+4 || got["1"] != 7 {
		t.Errorf("after a reset of GPU 0: %v; want 1.8e19+4 and 7", got)
	}
	if m.resets["x_total"] != 1 {
		t.Errorf("resets = %v, want one", m.resets)
	}
	// GPU 1 vanishes (lost) and comes back reset within the retention: it
	// goes on from 7.
	step(2*time.Second, map[string]float64{"0": 5})
	if got := step(time.Minute, map[string]float64{"0": 6, "1": 2}); got["1"] != 9 || got["0"] != 1.8e19+6 {
		t.Errorf("after GPU 1 came back: %v; want 9 and 1.8e19+6", got)
	}
	// Gone past the retention, a series is forgotten (memory stays bounded
	// under pod churn) and starts afresh.
	step(2*counterRetention, map[string]float64{"0": 6})
	if len(m.series) != 1 {
		t.Errorf("%d series remembered, want 1", len(m.series))
	}
}

// A family typed counter whose value is a rate serves its current value:
// it goes down as it goes up, and no reset is counted.
func TestMonotonicLeavesRatesAlone(t *testing.T) {
	m := newMonotonic()
	t0 := time.Unix(1e9, 0)
	var got []float64
	for i, raw := range []float64{113e3, 15e3, 16e3, 9e3} {
		mf := counterFamily("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", map[string]float64{"0": raw})
		if reset := m.apply([]*dto.MetricFamily{mf}, t0.Add(time.Duration(i)*time.Second)); len(reset) != 0 {
			t.Errorf("sample %d: resets reported for %v", i, reset)
		}
		got = append(got, mf.Metric[0].Counter.GetValue())
	}
	if want := []float64{113e3, 15e3, 16e3, 9e3}; !slices.Equal(got, want) {
		t.Errorf("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL served %v, want the current values %v", got, want)
	}
}
