package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/fleet"
)

// fakePrometheus answers /api/v1/query from a table of expression ->
// result (the JSON of data.result); an expression it does not know answers
// an empty vector. It records the Authorization headers it saw.
func fakePrometheus(t *testing.T, prefix string, results map[string]string) (*httptest.Server, *[]string) {
	t.Helper()
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != prefix+"/api/v1/query" {
			http.NotFound(w, r)
			return
		}
		auth = append(auth, r.Header.Get("Authorization"))
		res, ok := results[r.FormValue("query")] // client_golang POSTs the query as a form
		if !ok {
			res = "[]"
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"status":"success","data":{"resultType":"vector","result":%s}}`, res)
	}))
	t.Cleanup(srv.Close)
	return srv, &auth
}

func sample(labels string, v string) string {
	return `{"metric":{` + labels + `},"value":[1700000000,"` + v + `"]}`
}

// fleetResults is a small fleet: one pool in two zones, one idle holder, one
// GPU to replace for two reasons.
var fleetResults = map[string]string{
	fleet.FreeSeries: "[" + sample(`"nodepool":"a100","zone":"z-a","accelerator":"nvidia-tesla-a100"`, "11") + "," +
		sample(`"nodepool":"a100","zone":"z-b","accelerator":"nvidia-tesla-a100"`, "0") + "]",
	fleet.GroupSeries + `{domain="nvlink"}`: "[" + sample(`"nodepool":"a100","zone":"z-a","accelerator":"nvidia-tesla-a100","domain":"nvlink"`, "8") + "]",
	fleet.IdleSeries:                        "[" + sample(`"nodepool":"a100","zone":"z-b","accelerator":"nvidia-tesla-a100"`, "3") + "]",
	fleet.QuarantinedSeries: "[" + sample(`"nodepool":"a100","zone":"z-b","accelerator":"nvidia-tesla-a100","remediator":"gke"`, "8") + "," +
		sample(`"nodepool":"a100","zone":"z-b","accelerator":"nvidia-tesla-a100","remediator":"nvsentinel"`, "4") + "]",
	fleet.FittingSeries: "[" + sample(`"nodepool":"a100","zone":"z-a","accelerator":"nvidia-tesla-a100","shape":"8"`, "1") + "," +
		sample(`"nodepool":"a100","zone":"z-a","accelerator":"nvidia-tesla-a100","shape":"mig-1g.10gb"`, "0") + "," +
		sample(`"nodepool":"a100","zone":"z-a","accelerator":"nvidia-tesla-a100","shape":"2"`, "5") + "]",
	"topk(10, " + fleet.IdleCostSeries + ")": "[" + sample(`"namespace":"research","pod":"nb-0","container":"main","node":"n1","gpu":"2"`, "3.67") + "]",
	fleet.ReplaceSeries: "[" + sample(`"node":"n2","gpu":"5","uuid":"GPU-x","reason":"row_remap_failed"`, "1") + "," +
		sample(`"node":"n2","gpu":"5","uuid":"GPU-x","reason":"banks_low"`, "1") + "]",
}

func TestFleetTableAndJSON(t *testing.T) {
	srv, auth := fakePrometheus(t, "/prom", fleetResults)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"fleet", "--prometheus=" + srv.URL + "/prom/", "--prometheus.bearer-token-file=" + token}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, a := range *auth {
		if a != "Bearer s3cret" {
			t.Errorf("Authorization %q, want the token file's", a)
		}
	}
	text := out.String()
	for _, want := range []string{
		"a100      z-a   nvidia-tesla-a100  11    8              -               0                        2:5 8:1 mig-1g.10gb:0",
		"a100      z-b   nvidia-tesla-a100  0     -              3               12 (gke:8 nvsentinel:4)  -",
		"research   nb-0  main       n1    2    3.67",
		"n2    5    GPU-x  banks_low, row_remap_failed",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if code := run(context.Background(), []string{"fleet", "--prometheus=" + srv.URL + "/prom", "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var f fleet.Snapshot
	if err := json.Unmarshal(out.Bytes(), &f); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(f.Capacity) != 2 || f.Capacity[0].FreeGPUs != 11 || *f.Capacity[0].LargestFreeGroup != 8 || f.Capacity[0].FittingJobs["8"] != 1 ||
		f.Capacity[1].LargestFreeGroup != nil || *f.Capacity[1].IdleAllocated != 3 ||
		len(f.Capacity[0].Quarantined) != 0 || f.Capacity[1].Quarantined["gke"] != 8 || f.Capacity[1].Quarantined["nvsentinel"] != 4 {
		t.Errorf("capacity %+v", f.Capacity)
	}
	if len(f.IdleHolders) != 1 || f.IdleHolders[0].DollarsPerHour != 3.67 || f.IdleHolders[0].Pod != "nb-0" {
		t.Errorf("idle holders %+v", f.IdleHolders)
	}
	if len(f.Replacements) != 1 || strings.Join(f.Replacements[0].Reasons, ",") != "banks_low,row_remap_failed" {
		t.Errorf("replacements %+v", f.Replacements)
	}
}

// Warnings in Prometheus' answers (a partial answer from Thanos) reach
// stderr; the answer is still printed.
func TestFleetPrintsWarnings(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := fleetResults[r.FormValue("query")]
		if !ok {
			res = "[]"
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"status":"success","warnings":["store gateway down: partial answer"],"data":{"resultType":"vector","result":%s}}`, res)
	}))
	t.Cleanup(srv.Close)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"fleet", "--prometheus=" + srv.URL}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "warning: Prometheus at "+srv.URL) || !strings.Contains(errb.String(), "store gateway down: partial answer") {
		t.Errorf("stderr lacks the warning:\n%s", errb.String())
	}
	if !strings.Contains(out.String(), "a100") {
		t.Errorf("no table beside the warning:\n%s", out.String())
	}
}

// Without idle prices or replacement series the sections say none.
func TestFleetNoneWhenOptionalSeriesAbsent(t *testing.T) {
	results := map[string]string{}
	for _, k := range []string{fleet.FreeSeries, fleet.FittingSeries} {
		results[k] = fleetResults[k]
	}
	srv, _ := fakePrometheus(t, "", results)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"fleet", "--prometheus=" + srv.URL}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "REPLACEMENT RECOMMENDED\nnone\n") || !strings.Contains(out.String(), "IDLE HOLDERS (the most costly first)\nnone") {
		t.Errorf("want none in both sections:\n%s", out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"fleet", "--prometheus=" + srv.URL, "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"idle_holders": []`) || !strings.Contains(out.String(), `"replacements": []`) {
		t.Errorf("want empty lists, not null:\n%s", out.String())
	}
}

func TestFleetErrors(t *testing.T) {
	missing, _ := fakePrometheus(t, "", map[string]string{})
	noFitting, _ := fakePrometheus(t, "", map[string]string{fleet.FreeSeries: fleetResults[fleet.FreeSeries]})
	rejecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"status":"error","errorType":"bad_data","error":"parse error"}`)
	}))
	t.Cleanup(rejecting.Close)
	unauthorized := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
	}))
	t.Cleanup(unauthorized.Close)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)
	notProm := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notProm.Close)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); slow.Close() })
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no --prometheus", nil, exitUsage, "--prometheus"},
		{"not a URL", []string{"--prometheus=prometheus:9090"}, exitUsage, "want a URL such as http://prometheus:9090"},
		{"bad output", []string{"--prometheus=" + missing.URL, "-o", "yaml"}, exitUsage, "--output"},
		{"bad top", []string{"--prometheus=" + missing.URL, "--top=0"}, exitUsage, "--top=0"},
		{"token file missing", []string{"--prometheus=" + missing.URL, "--prometheus.bearer-token-file=/nonexistent/token"}, exitUsage, "--prometheus.bearer-token-file"},
		{"token file empty", []string{"--prometheus=" + missing.URL, "--prometheus.bearer-token-file=" + empty}, exitUsage, "is empty"},
		{"unreachable", []string{"--prometheus=" + closedURL}, exitError, "cannot reach Prometheus at " + closedURL},
		{"timeout", []string{"--prometheus=" + slow.URL, "--timeout=200ms"}, exitError, "within --timeout"},
		{"rules not loaded", []string{"--prometheus=" + missing.URL}, exitError, "no series " + fleet.FreeSeries + " in Prometheus: the recording rules are not loaded"},
		{"fitting missing", []string{"--prometheus=" + noFitting.URL}, exitError, "but no " + fleet.FittingSeries},
		{"query rejected", []string{"--prometheus=" + rejecting.URL}, exitError, "rejected by Prometheus: bad_data: parse error"},
		{"unauthorized", []string{"--prometheus=" + unauthorized.URL}, exitError, "--prometheus.bearer-token-file"},
		{"not the query API", []string{"--prometheus=" + notProm.URL}, exitError, "not Prometheus' query API"},
		{"server failing", []string{"--prometheus=" + failing.URL}, exitError, "failed (503 Service Unavailable): overloaded"},
		{"bad timeout", []string{"--prometheus=" + missing.URL, "--timeout=0s"}, exitUsage, "--timeout=0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), append([]string{"fleet"}, tc.args...), &out, &errb)
			if code != tc.code || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}
