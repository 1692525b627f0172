package render

import (
	"fmt"
	"math"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

type row struct {
	gpu, uuid, gi, typ string
	v                  float64
}

func family(name string, typ dto.MetricType, rows ...row) *dto.MetricFamily {
	mf := &dto.MetricFamily{Name: proto.String(name), Help: proto.String("h"), Type: typ.Enum()}
	for _, r := range rows {
		m := &dto.Metric{}
		ls := [][2]string{{"gpu", r.gpu}, {"gpu_instance", r.gi}, {"uuid", r.uuid}}
		if r.typ != "" {
			ls = [][2]string{{"gpu", r.gpu}, {"type", r.typ}, {"uuid", r.uuid}}
		}
		for _, l := range ls {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l[0]), Value: proto.String(l[1])})
		}
		if typ == dto.MetricType_COUNTER {
			m.Counter = &dto.Counter{Value: proto.Float64(r.v)}
		} else {
			m.Gauge = &dto.Gauge{Value: proto.Float64(r.v)}
		}
		mf.Metric = append(mf.Metric, m)
	}
	return mf
}

func folded(t *testing.T, mfs []*dto.MetricFamily) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			k := mf.GetName()
			for _, l := range m.Label {
				k += "," + l.GetName() + "=" + l.GetValue()
			}
			out[k] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

func TestNodeSummaryFoldEdges(t *testing.T) {
	n := newNodeSummary()
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	got := folded(t, n.fold([]*dto.MetricFamily{
		// MIG rows are left out of the mean; NaN (no reading) too.
		family("gpu_tensor_active_ratio", gauge, row{"0", "a", "", "", 0.2}, row{"1", "b", "", "", 0.4},
			row{"1", "b", "3", "", 0.9}, row{"2", "c", "", "", math.NaN()}),
		family("gpu_slowdown_temperature_celsius", gauge, row{"0", "a", "", "", 87}, row{"1", "b", "", "", 85}),
		// Only MIG rows: no series, and no empty family on the page.
		family("gpu_dram_active_ratio", gauge, row{"1", "b", "3", "", 0.5}),
		// Folded per type.
		family("gpu_nvlink_errors_total", counter, row{"0", "a", "", "replay", 1}, row{"1", "b", "", "replay", 2}, row{"0", "a", "", "crc_flit", 4}),
		// Not folded.
		family("gpu_temperature_celsius", gauge, row{"0", "a", "", "", 50}, row{"1", "b", "", "", 60}),
	}))
	want := map[string]float64{
		"gpu_tensor_active_ratio,gpu=all,gpu_instance=,uuid=all":          0.30000000000000004,
		"gpu_slowdown_temperature_celsius,gpu=all,gpu_instance=,uuid=all": 85,
		"gpu_nvlink_errors_total,gpu=all,type=replay,uuid=all":            3,
		"gpu_nvlink_errors_total,gpu=all,type=crc_flit,uuid=all":          4,
		"gpu_temperature_celsius,gpu=0,gpu_instance=,uuid=a":              50,
		"gpu_temperature_celsius,gpu=1,gpu_instance=,uuid=b":              60,
	}
	if len(got) != len(want) {
		t.Errorf("folded page %v, want %v", got, want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || math.Abs(g-w) > 1e-12 {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
		}
	}
	// Only the corrected ECC errors fold; the uncorrected stay per GPU.
	ecc := &dto.MetricFamily{Name: proto.String("gpu_ecc_errors_total"), Help: proto.String("h"), Type: counter.Enum()}
	for _, r := range [][4]string{{"0", "a", "corrected", "3"}, {"1", "b", "corrected", "4"}, {"0", "a", "uncorrected", "1"}, {"1", "b", "uncorrected", "0"}} {
		m := &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(map[string]float64{"0": 0, "1": 1, "3": 3, "4": 4}[r[3]])}}
		for _, l := range [][2]string{{"error", r[2]}, {"gpu", r[0]}, {"scope", "volatile"}, {"uuid", r[1]}} {
			m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(l[0]), Value: proto.String(l[1])})
		}
		ecc.Metric = append(ecc.Metric, m)
	}
	gotECC := folded(t, n.fold([]*dto.MetricFamily{ecc}))
	wantECC := map[string]float64{
		"gpu_ecc_errors_total,error=corrected,gpu=all,scope=volatile,uuid=all": 7,
		"gpu_ecc_errors_total,error=uncorrected,gpu=0,scope=volatile,uuid=a":   1,
		"gpu_ecc_errors_total,error=uncorrected,gpu=1,scope=volatile,uuid=b":   0,
	}
	if fmt.Sprint(gotECC) != fmt.Sprint(wantECC) {
		t.Errorf("ECC errors folded to %v, want %v", gotECC, wantECC)
	}
	// A GPU first seen later adds its whole count; one that is gone keeps
	// its last; one whose count fell counts on from zero.
	steps := []struct {
		rows []row
		want float64
	}{
		{[]row{{"0", "a", "", "", 10}}, 10},
		{[]row{{"0", "a", "", "", 12}, {"1", "b", "", "", 100}}, 112},
		{[]row{{"1", "b", "", "", 101}}, 113},
		{[]row{{"0", "a", "", "", 3}, {"1", "b", "", "", 101}}, 116},
		{nil, -1}, // nothing to fold: no series
		{[]row{{"0", "a", "", "", 4}}, 117},
	}
	for i, s := range steps {
		out := n.fold([]*dto.MetricFamily{family("gpu_pcie_replay_errors_total", counter, s.rows...)})
		if s.want < 0 {
			if len(out) != 0 {
				t.Errorf("step %d: %v, want no family", i, folded(t, out))
			}
			continue
		}
		if v := folded(t, out)["gpu_pcie_replay_errors_total,gpu=all,gpu_instance=,uuid=all"]; v != s.want {
			t.Errorf("step %d: folded counter %v, want %v (%v)", i, v, s.want, folded(t, out))
		}
	}
}

// A folded gauge that misses the value of a GPU on the page that gave one
// before says so with partial="true"; a GPU that never gave one (the board
// lacks the field) or that left the page does not make it partial, and a
// folded counter (which keeps a GPU's last count) is never marked.
func TestNodeSummaryMarksPartialGauges(t *testing.T) {
	n := newNodeSummary()
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	up := func(uuids ...string) *dto.MetricFamily {
		var rows []row
		for i, u := range uuids {
			rows = append(rows, row{fmt.Sprint(i), u, "", "", 1})
		}
		return family("gpu_up", gauge, rows...)
	}
	render := func(onPage []string, power []row, replays []row) map[string]float64 {
		out := folded(t, n.fold([]*dto.MetricFamily{up(onPage...),
			family("gpu_power_watts", gauge, power...), family("gpu_pcie_replay_errors_total", counter, replays...)}))
		for k := range out {
			if strings.HasPrefix(k, "gpu_up,") {
				delete(out, k)
			}
		}
		return out
	}
	steps := []struct {
		name        string
		onPage      []string
		power, reps []row
		want        map[string]float64
	}{
		{"a and b give power, c never does", []string{"a", "b", "c"},
			[]row{{"0", "a", "", "", 70}, {"1", "b", "", "", 80}}, []row{{"0", "a", "", "", 1}, {"1", "b", "", "", 1}},
			map[string]float64{"gpu_power_watts,gpu=all,gpu_instance=,uuid=all": 150, "gpu_pcie_replay_errors_total,gpu=all,gpu_instance=,uuid=all": 2}},
		{"b's read fails", []string{"a", "b", "c"},
			[]row{{"0", "a", "", "", 70}}, []row{{"0", "a", "", "", 1}},
			map[string]float64{"gpu_power_watts,gpu=all,gpu_instance=,partial=true,uuid=all": 70, "gpu_pcie_replay_errors_total,gpu=all,gpu_instance=,uuid=all": 2}},
		{"b answers again", []string{"a", "b", "c"},
			[]row{{"0", "a", "", "", 70}, {"1", "b", "", "", 90}}, []row{{"0", "a", "", "", 1}, {"1", "b", "", "", 1}},
			map[string]float64{"gpu_power_watts,gpu=all,gpu_instance=,uuid=all": 160, "gpu_pcie_replay_errors_total,gpu=all,gpu_instance=,uuid=all": 2}},
		{"b leaves the page", []string{"a", "c"},
			[]row{{"0", "a", "", "", 70}}, []row{{"0", "a", "", "", 1}},
			map[string]float64{"gpu_power_watts,gpu=all,gpu_instance=,uuid=all": 70, "gpu_pcie_replay_errors_total,gpu=all,gpu_instance=,uuid=all": 2}},
	}
	for _, s := range steps {
		got := render(s.onPage, s.power, s.reps)
		if fmt.Sprint(got) != fmt.Sprint(s.want) {
			t.Errorf("%s: folded %v, want %v", s.name, got, s.want)
		}
	}
}
