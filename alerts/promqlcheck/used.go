package promqlcheck

import (
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/dashboards"
)

// templateQueryRE finds the PromQL inside annotation templates: the
// backquoted strings given to query (directly or through printf).
var templateQueryRE = regexp.MustCompile("`([^`]*)`")

// looksLikePromQL tells a query from the shell commands quoted in the same
// annotations.
func looksLikePromQL(s string) bool {
	return regexp.MustCompile(`^[a-zA-Z_:]+[a-zA-Z0-9_:]*(\{|\()`).MatchString(strings.TrimSpace(s))
}

// dashboardValues are the values the dashboards' variables take for parsing.
var dashboardValues = map[string]string{
	"nodepool":  ".*",
	"node":      "gpu-node-a|gpu-node-b",
	"namespace": ".*",
	"gpu":       ".*",
}

// UsedMetrics parses every alert and recording rule (with the queries in
// their annotations) and every dashboard query, and returns each metric name
// they select with where it is used. Recording rules' own names are
// included; tell them apart with alerts.Rules().RecordNames().
func UsedMetrics() (map[string][]string, error) {
	used := map[string][]string{}
	p := parser.NewParser(parser.Options{})
	add := func(where, expr string) error {
		e, err := p.ParseExpr(expr)
		if err != nil {
			return err
		}
		parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if name == "" && m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			if name != "" {
				used[name] = append(used[name], where)
			}
			return nil
		})
		return nil
	}
	rf, err := alerts.Rules()
	if err != nil {
		return nil, err
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			where := alerts.RulesFileName + ": " + r.Name()
			if err := add(where, r.Expr); err != nil {
				return nil, err
			}
			keys := make([]string, 0, len(r.Annotations))
			for k := range r.Annotations {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				for _, m := range templateQueryRE.FindAllStringSubmatch(r.Annotations[k], -1) {
					if q := m[1]; looksLikePromQL(q) && strings.Contains(r.Annotations[k], "query") {
						if err := add(where+" ("+k+")", fillPrintfVerbs(q)); err != nil {
							return nil, err
						}
					}
				}
			}
		}
	}
	qs, err := dashboards.AllQueries()
	if err != nil {
		return nil, err
	}
	for _, q := range qs {
		expr, _, ok := q.PromQL(dashboardValues)
		if !ok {
			continue
		}
		if err := add(q.String(), expr); err != nil {
			return nil, err
		}
	}
	return used, nil
}

// fillPrintfVerbs replaces the %s of a printf format with a value that
// parses: a label value inside quotes, a number outside (a threshold).
func fillPrintfVerbs(q string) string {
	var b strings.Builder
	inQuote := false
	for i := 0; i < len(q); i++ {
		switch {
		case q[i] == '"':
			inQuote = !inQuote
		case strings.HasPrefix(q[i:], "%s"):
			if inQuote {
				b.WriteString("x")
			} else {
				b.WriteString("1")
			}
			i++
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}
