// Package alerts holds gpu-pool-exporter's Prometheus alert and recording
// rules (gpu-pool-exporter.rules.yml) and their promtool unit tests
// (tests/*.yml).
//
// The Go code here only reads the rules file, for the tests of this
// directory and its subdirectories: rules_test.go runs promtool,
// promqlcheck/ checks every metric name the rules and dashboards use, e2e/
// runs the rules in a real Prometheus against the simulated exporter.
package alerts

import (
	"bytes"
	_ "embed"
	"fmt"
	"sort"

	"go.yaml.in/yaml/v3"
)

// RulesFileName is the rules file's name in this directory.
const RulesFileName = "gpu-pool-exporter.rules.yml"

// RulesYAML is the content of gpu-pool-exporter.rules.yml.
//
//go:embed gpu-pool-exporter.rules.yml
var RulesYAML []byte

// RuleFile is a Prometheus rule file: a list of groups.
type RuleFile struct {
	Groups []Group `yaml:"groups"`
}

// Group is a rule group.
type Group struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval"`
	Rules    []Rule `yaml:"rules"`
}

// Rule is an alerting rule (Alert set) or a recording rule (Record set).
type Rule struct {
	Record        string            `yaml:"record"`
	Alert         string            `yaml:"alert"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

// Name is the rule's alert or record name.
func (r Rule) Name() string {
	if r.Alert != "" {
		return r.Alert
	}
	return r.Record
}

// ParseRules parses a rule file, refusing unknown fields.
func ParseRules(data []byte) (*RuleFile, error) {
	var f RuleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	// A second, strict pass names misspelt fields (yaml.v3 reports them with
	// their line).
	var strict RuleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&strict); err != nil {
		return nil, err
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if (r.Alert == "") == (r.Record == "") {
				return nil, fmt.Errorf("group %s: a rule must have exactly one of alert and record (expr %q)", g.Name, r.Expr)
			}
		}
	}
	return &f, nil
}

// Rules parses the embedded rules file.
func Rules() (*RuleFile, error) {
	return ParseRules(RulesYAML)
}

// Alerts lists the alerting rules, in file order.
func (f *RuleFile) Alerts() []Rule {
	var out []Rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// RecordNames lists the distinct recording rule names, sorted.
func (f *RuleFile) RecordNames() []string {
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				seen[r.Record] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// RecordingFile is a rule file of one group, name, that holds the given
// recording rules (record and expression, as in the file) and is
// evaluated every interval ("" for the server's global interval): the
// recordings a reader needs, without the alerts or the rest of the file.
func RecordingFile(name, interval string, rules []Rule) ([]byte, error) {
	type record struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	group := map[string]any{"name": name}
	if interval != "" {
		group["interval"] = interval
	}
	records := make([]record, 0, len(rules))
	for _, r := range rules {
		if r.Record == "" {
			return nil, fmt.Errorf("%s is an alert, not a recording rule", r.Alert)
		}
		records = append(records, record{r.Record, r.Expr})
	}
	group["rules"] = records
	return yaml.Marshal(map[string]any{"groups": []map[string]any{group}})
}

// Recordings returns the named recording rules in the order named; a name
// the file does not record is an error.
func (f *RuleFile) Recordings(names ...string) ([]Rule, error) {
	byName := map[string]Rule{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				byName[r.Record] = r
			}
		}
	}
	out := make([]Rule, 0, len(names))
	for _, n := range names {
		r, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("the rules file records no %s", n)
		}
		out = append(out, r)
	}
	return out, nil
}

// GroupNames lists the group names in file order.
func (f *RuleFile) GroupNames() []string {
	out := make([]string, 0, len(f.Groups))
	for _, g := range f.Groups {
		out = append(out, g.Name)
	}
	return out
}
