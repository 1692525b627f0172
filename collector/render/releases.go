package render

import (
	"embed"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// CompatRelease is a dcgm-exporter release line whose contract the
// compatibility families can follow: its default counters file (the
// families, types and help texts served without -f) and the spelling of its
// host name label. Units follow each family's name (compatFieldOf), and the
// driver label is the label line of the counters file, so a line needs
// nothing more. deploy/dcgm-exporter/releases.csv is the table of each
// line's families, units and labels with the source of every row.
type CompatRelease struct {
	// Name is what --compat.dcgm-exporter.release takes.
	Name string
	// Aliases are the other spellings it takes: dcgm-exporter's versions and
	// tags of the line.
	Aliases []string
	// Versions says which dcgm-exporter releases and DCGM versions the line
	// is.
	Versions string
	// HostnameLabel is its host name label.
	HostnameLabel string
	// Confirmed: public sources confirm the whole contract (its default
	// counters file read at a released commit); otherwise it is rebuilt
	// from release notes, and deploy/dcgm-exporter/releases.csv marks what
	// is not confirmed.
	Confirmed bool
	// source names its default counters file, for log lines.
	source   string
	counters func() *CompatCounters
}

// Host name label spellings: dcgm-exporter's up to 4.8.2 and since 4.8.3.
const (
	HostnameLabelUpper = "Hostname"
	HostnameLabelLower = "hostname"
)

// HostnameLabels are the spellings CompatConfig.HostnameLabel accepts.
var HostnameLabels = []string{HostnameLabelUpper, HostnameLabelLower}

// DefaultCompatCounters are the families served without a counters file:
// the default release line's default list.
func DefaultCompatCounters() *CompatCounters { return defaultRelease().DefaultCounters() }

// DefaultCounters is the line's default counters file, parsed.
func (r *CompatRelease) DefaultCounters() *CompatCounters { return r.counters() }

// defaultCountersFS holds each line's default-counters.csv: `make generate`
// copies them here from deploy/dcgm-exporter/<release>/.
//
//go:embed dcgm-exporter
var defaultCountersFS embed.FS

// DefaultCompatRelease is the line served when none is named: the newest
// whose contract public sources confirm.
const DefaultCompatRelease = "4.8.3"

// CompatReleases are the release lines, oldest first.
var CompatReleases = []*CompatRelease{
	{
		Name:          "4.8.2",
		Aliases:       []string{"4.8", "4.8.0", "4.8.1", "4.5-4.8.2", "4.5.1-4.8.0", "4.5.2-4.8.1", "4.5.3-4.8.2"},
		Versions:      "dcgm-exporter 4.8.0 to 4.8.2 (tags 4.5.1-4.8.0 to 4.5.3-4.8.2, DCGM 4.5)",
		HostnameLabel: HostnameLabelUpper,
		Confirmed:     true,
	},
	{
		Name:          "4.8.3",
		Aliases:       []string{"4.6.0-4.8.3"},
		Versions:      "dcgm-exporter 4.8.3 (tag 4.6.0-4.8.3, DCGM 4.6.0, July 2026)",
		HostnameLabel: HostnameLabelLower,
		Confirmed:     true,
	},
	{
		Name:          "4.9",
		Aliases:       []string{"4.9.0"},
		Versions:      "dcgm-exporter 4.9.0 (DCGM 4.7.0)",
		HostnameLabel: HostnameLabelLower,
	},
	{
		Name:          "4.10",
		Aliases:       []string{"4.10.0"},
		Versions:      "dcgm-exporter 4.10.0 (DCGM 4.8.0)",
		HostnameLabel: HostnameLabelLower,
	},
}

func init() {
	for _, r := range CompatReleases {
		path := "dcgm-exporter/" + r.Name + "/default-counters.csv"
		r.source = fmt.Sprintf("dcgm-exporter %s's etc/default-counters.csv (built in)", r.Name)
		if !r.Confirmed {
			r.source = fmt.Sprintf("dcgm-exporter %s's default counters as its release notes give them (built in)", r.Name)
		}
		r.counters = sync.OnceValue(func() *CompatCounters {
			b, err := defaultCountersFS.ReadFile(path)
			if err != nil {
				panic(err) // the embedded files are checked by the tests
			}
			c, err := ParseCompatCounters(r.source, b)
			if err != nil {
				panic(err)
			}
			return c
		})
	}
}

// CompatReleaseNamed is the release line name names (its name or an
// alias), or an error that lists them.
func CompatReleaseNamed(name string) (*CompatRelease, error) {
	for _, r := range CompatReleases {
		if r.Name == name || slices.Contains(r.Aliases, name) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("dcgm-exporter release line %q: want one of %s", name, strings.Join(CompatReleaseNames(), ", "))
}

// CompatReleaseNames are the names of the release lines.
func CompatReleaseNames() []string {
	var out []string
	for _, r := range CompatReleases {
		out = append(out, r.Name)
	}
	return out
}

func defaultRelease() *CompatRelease {
	r, err := CompatReleaseNamed(DefaultCompatRelease)
	if err != nil {
		panic(err)
	}
	return r
}
