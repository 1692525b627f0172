package render

import (
	"reflect"
	"testing"
)

// Pod labels are named as dcgm-exporter names them (every character outside
// [a-zA-Z0-9_] becomes '_'), each name once, and never an invalid or
// reserved name.
func TestPodLabels(t *testing.T) {
	got := podLabels(map[string]string{
		"app.kubernetes.io/name": "train",
		"app-kubernetes-io/name": "other", // the same name: the first by key wins
		"team":                   "research",
		"3rd-party":              "yes",
		"__meta":                 "x",
	})
	want := []labelPair{
		{"_3rd_party", "yes"},
		{"app_kubernetes_io_name", "other"},
		{"team", "research"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("podLabels = %v, want %v", got, want)
	}
}
