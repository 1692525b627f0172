package agent

import (
	"runtime/debug"

	"github.com/prometheus/common/version"
)

// stampVersion fills version.Version from the module and VCS data Go embeds
// (go build, go install) when the Makefile's -ldflags did not set it, so that
// every build says what it is; the revision (vcs.revision, "-modified" when
// vcs.modified) prometheus/common reads itself.
func stampVersion() {
	if bi, ok := debug.ReadBuildInfo(); ok && version.Version == "" {
		version.Version = buildVersion(bi)
	}
}

// buildVersion is the main module's version ("v1.2.0", or Go's pseudo-version
// "v0.0.0-20261203091500-fbbfe06a1b2c+dirty" for an untagged build); a build
// without any (go run) is "devel" plus the revision where Go recorded one.
func buildVersion(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified {
		rev += "+dirty"
	}
	return "devel-" + rev
}
