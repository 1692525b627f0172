package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vectorSample is one series of an instant query's answer.
type vectorSample struct {
	Labels map[string]string
	Value  float64
}

func queryVector(prom, expr string) ([]vectorSample, error) { return queryVectorAt(prom, expr, "") }

// queryVectorAt runs an instant query at time at (now when "").
func queryVectorAt(prom, expr, at string) ([]vectorSample, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	q := prom + "/api/v1/query?query=" + url.QueryEscape(expr)
	if at != "" {
		q += "&time=" + at
	}
	if err := getJSON(q, &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", expr, r.Error)
	}
	out := make([]vectorSample, 0, len(r.Data.Result))
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %v", expr, s.Value[1])
		}
		out = append(out, vectorSample{s.Metric, v})
	}
	return out, nil
}

// settled retries check until it passes: a recorded value lags the raw
// series it reads by up to one evaluation, so one comparison may straddle
// a change of the simulated node.
func settled(t *testing.T, what string, check func() error) {
	t.Helper()
	var err error
	for i := 0; i < 10; i++ {
		if err = check(); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Errorf("%s: %v", what, err)
}

// oneValue is the value of an expression that must return one series.
func oneValue(prom, expr string) (float64, error) {
	v, err := queryVector(prom, expr)
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("%s: %d series, want 1", expr, len(v))
	}
	return v[0].Value, nil
}

// checkZones: each node is its own pool and zone, so every zone recording
// equals that node's exporter series.
func checkZones(t *testing.T, prom string) {
	t.Helper()
	for _, n := range []struct{ node, pool, zone string }{{nodeName, nodePool, nodeZone}, {leanNodeName, leanPool, leanZone}} {
		za := fmt.Sprintf(`zone=%q, accelerator=%q`, n.zone, accelerator)
		pairs := [][2]string{
			{`zone_accelerator:gpu_free_devices:sum{` + za + `}`, fmt.Sprintf(`gpu_devices{node=%q, state="free"}`, n.node)},
			{fmt.Sprintf(`nodepool_zone:gpu_free_devices:sum{nodepool=%q, %s}`, n.pool, za), fmt.Sprintf(`gpu_devices{node=%q, state="free"}`, n.node)},
			{`zone_accelerator:gpu_free_devices_largest_group:max{` + za + `, domain="nvlink"}`, fmt.Sprintf(`gpu_free_devices_largest_group{node=%q, domain="nvlink"}`, n.node)},
			{`zone_accelerator:gpu_idle_allocated_devices:sum{` + za + `}`, fmt.Sprintf(`gpu_idle_allocated_devices{node=%q}`, n.node)},
		}
		shapes, err := queryVector(prom, fmt.Sprintf(`gpu_fitting_jobs{node=%q}`, n.node))
		if err != nil || len(shapes) == 0 {
			t.Errorf("%s serves no gpu_fitting_jobs (%v)", n.node, err)
		}
		for _, s := range shapes {
			sh := s.Labels["shape"]
			pairs = append(pairs, [2]string{fmt.Sprintf(`zone_accelerator:gpu_fitting_jobs:sum{%s, shape=%q}`, za, sh), fmt.Sprintf(`gpu_fitting_jobs{node=%q, shape=%q}`, n.node, sh)})
		}
		for _, p := range pairs {
			settled(t, p[0], func() error {
				rec, err := oneValue(prom, p[0])
				if err != nil {
					return err
				}
				raw, err := oneValue(prom, p[1])
				if err != nil {
					return err
				}
				if rec != raw {
					return fmt.Errorf("recorded %v, the node's %s is %v", rec, p[1], raw)
				}
				return nil
			})
		}
	}
}

// fleetJSON is the part of `fleet -o json` checked here.
type fleetJSON struct {
	Capacity []struct {
		NodePool, Zone, Accelerator string
		FreeGPUs                    float64            `json:"free_gpus"`
		LargestFreeGroup            *float64           `json:"largest_free_group"`
		IdleAllocated               *float64           `json:"idle_allocated"`
		FittingJobs                 map[string]float64 `json:"fitting_jobs"`
	} `json:"capacity"`
	IdleHolders []struct {
		Namespace, Pod, Container, Node, GPU string
		DollarsPerHour                       float64 `json:"dollars_per_hour"`
	} `json:"idle_holders"`
	Replacements []struct {
		Node, GPU, UUID string
		Reasons         []string
	} `json:"replacements"`
}

func runFleetCmd(t *testing.T, gpupool, prom string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, gpupool, append([]string{"fleet", "--prometheus=" + prom}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("gpupool fleet %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// checkFleet runs `gpupool fleet` against the test's Prometheus
// and compares what it prints with direct queries of the recordings.
func checkFleet(t *testing.T, prom, gpupool string) {
	t.Helper()
	settled(t, "fleet -o json", func() error {
		var f fleetJSON
		if err := json.Unmarshal([]byte(runFleetCmd(t, gpupool, prom, "-o", "json")), &f); err != nil {
			return err
		}
		if len(f.Capacity) != 2 {
			return fmt.Errorf("capacity has %d rows, want one per node pool and zone (2): %+v", len(f.Capacity), f.Capacity)
		}
		for _, c := range f.Capacity {
			sel := fmt.Sprintf(`{nodepool=%q, zone=%q, accelerator=%q}`, c.NodePool, c.Zone, c.Accelerator)
			free, err := oneValue(prom, `nodepool_zone:gpu_free_devices:sum`+sel)
			if err != nil {
				return err
			}
			group, err := oneValue(prom, `nodepool_zone:gpu_free_devices_largest_group:max{domain="nvlink", `+sel[1:])
			if err != nil {
				return err
			}
			idle, err := oneValue(prom, `nodepool_zone:gpu_idle_allocated_devices:sum`+sel)
			if err != nil {
				return err
			}
			if c.FreeGPUs != free || c.LargestFreeGroup == nil || *c.LargestFreeGroup != group || c.IdleAllocated == nil || *c.IdleAllocated != idle {
				return fmt.Errorf("%s: fleet says free %v, group %v, idle %v; recorded %v, %v, %v", sel, c.FreeGPUs, c.LargestFreeGroup, c.IdleAllocated, free, group, idle)
			}
			fits, err := queryVector(prom, `nodepool_zone:gpu_fitting_jobs:sum`+sel)
			if err != nil {
				return err
			}
			if len(fits) == 0 || len(fits) != len(c.FittingJobs) {
				return fmt.Errorf("%s: fleet lists shapes %v, recorded %d", sel, c.FittingJobs, len(fits))
			}
			for _, s := range fits {
				if v, ok := c.FittingJobs[s.Labels["shape"]]; !ok || v != s.Value {
					return fmt.Errorf("%s shape %s: fleet says %v, recorded %v", sel, s.Labels["shape"], v, s.Value)
				}
			}
		}
		holders, err := queryVector(prom, `topk(10, allocation:gpu_idle_cost_dollars_per_hour:share)`)
		if err != nil {
			return err
		}
		if len(holders) == 0 {
			return fmt.Errorf("no idle holder with a cost: the scenario's idle notebook should have one")
		}
		if len(f.IdleHolders) != len(holders) {
			return fmt.Errorf("fleet lists %d idle holders, Prometheus has %d", len(f.IdleHolders), len(holders))
		}
		want := map[string]float64{}
		for _, h := range holders {
			l := h.Labels
			want[l["namespace"]+"/"+l["pod"]+"/"+l["container"]+"@"+l["node"]+"/"+l["gpu"]] = h.Value
		}
		for i, h := range f.IdleHolders {
			if v, ok := want[h.Namespace+"/"+h.Pod+"/"+h.Container+"@"+h.Node+"/"+h.GPU]; !ok || v != h.DollarsPerHour {
				return fmt.Errorf("idle holder %+v: recorded %v (present %v)", h, v, ok)
			}
			if i > 0 && h.DollarsPerHour > f.IdleHolders[i-1].DollarsPerHour {
				return fmt.Errorf("idle holders not the most costly first: %+v", f.IdleHolders)
			}
		}
		repl, err := queryVector(prom, `gpu:gpu_replacement_recommended:reason`)
		if err != nil {
			return err
		}
		var wantRepl, gotRepl []string
		for _, r := range repl {
			wantRepl = append(wantRepl, r.Labels["node"]+"/"+r.Labels["gpu"]+"/"+r.Labels["reason"])
		}
		for _, r := range f.Replacements {
			for _, reason := range r.Reasons {
				gotRepl = append(gotRepl, r.Node+"/"+r.GPU+"/"+reason)
			}
		}
		sort.Strings(wantRepl)
		sort.Strings(gotRepl)
		if strings.Join(wantRepl, ",") != strings.Join(gotRepl, ",") {
			return fmt.Errorf("replacements: fleet %v, recorded %v", gotRepl, wantRepl)
		}
		return nil
	})

	// The table names both pools with their zones, and the idle notebook.
	table := runFleetCmd(t, gpupool, prom)
	for _, want := range []string{nodePool, nodeZone, leanPool, leanZone, accelerator, "research", "REPLACEMENT RECOMMENDED"} {
		if !strings.Contains(table, want) {
			t.Errorf("fleet's table lacks %q:\n%s", want, table)
		}
	}
	t.Logf("gpupool fleet:\n%s", table)
}
