package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// gpupool's own command line: its commands listed, an unknown one named
// with the list (exit 2), --help and --version exit 0.
func TestCommands(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, errRe string
	}{
		{nil, exitUsage, "", "usage: gpupool"},
		{[]string{"--help"}, exitOK, "fleet", ""},
		{[]string{"help"}, exitOK, "recommend", ""},
		{[]string{"--version"}, exitOK, "gpupool", ""},
		{[]string{"stauts"}, exitUsage, "", `unknown command "stauts": want one of fleet, recommend, report, status`},
		{[]string{"status", "--help"}, exitOK, "--url", ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errRe) {
				t.Errorf("stdout %q, stderr %q; want %q and %q", out.String(), errb.String(), tc.out, tc.errRe)
			}
		})
	}
}
