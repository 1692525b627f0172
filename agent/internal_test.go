package agent

import (
	"net"
	"runtime/debug"
	"testing"
)

func TestServedURL(t *testing.T) {
	for addr, want := range map[string]string{
		"[::]:9947":      "http://localhost:9947/",
		"0.0.0.0:9947":   "http://localhost:9947/",
		"127.0.0.1:9950": "http://127.0.0.1:9950/",
		"[::1]:9947":     "http://[::1]:9947/",
	} {
		t.Run(addr, func(t *testing.T) {
			a, err := net.ResolveTCPAddr("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			if got := servedURL("http", a); got != want {
				t.Errorf("%s: %s, want %s", addr, got, want)
			}
		})
	}
}

func TestBuildVersion(t *testing.T) {
	for _, tc := range []struct {
		main     string
		settings map[string]string
		want     string
	}{
		{"v1.4.0", nil, "v1.4.0"},
		{"v0.0.0-20261203091500-fbbfe069609a+dirty", map[string]string{"vcs.revision": "fbbfe069609af8cf"}, "v0.0.0-20261203091500-fbbfe069609a+dirty"},
		{"(devel)", map[string]string{"vcs.revision": "fbbfe069609af8cf58b3", "vcs.modified": "true"}, "devel-fbbfe069609a+dirty"},
		{"(devel)", map[string]string{"vcs.revision": "fbbfe069609af8cf58b3", "vcs.modified": "false"}, "devel-fbbfe069609a"},
		{"(devel)", nil, "devel"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/gpu-pool-exporter/gpu-pool-exporter", Version: tc.main}}
			for k, v := range tc.settings {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: k, Value: v})
			}
			if got := buildVersion(bi); got != tc.want {
				t.Errorf("%s %v: %q, want %q", tc.main, tc.settings, got, tc.want)
			}
		})
	}
}
