package alerts

import (
	"regexp"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// renameLabel renames a label wherever an expression names one: matchers,
// aggregation and matching label lists, label_replace/label_join arguments.
// It works on the parsed expression, independently of GMPRules' textual
// rewrite, which the test below holds against it.
func renameLabel(e parser.Expr, from, to string) {
	ren := func(ls []string) {
		for i := range ls {
			if ls[i] == from {
				ls[i] = to
			}
		}
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			for _, m := range n.LabelMatchers {
				if m.Name == from {
					m.Name = to
				}
			}
		case *parser.AggregateExpr:
			ren(n.Grouping)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				ren(n.VectorMatching.MatchingLabels)
				ren(n.VectorMatching.Include)
			}
		case *parser.Call:
			var at []int
			switch n.Func.Name {
			case "label_replace":
				at = []int{1, 3}
			case "label_join":
				at = []int{1}
				for i := 3; i < len(n.Args); i++ {
					at = append(at, i)
				}
			}
			for _, i := range at {
				if s, ok := n.Args[i].(*parser.StringLiteral); ok && s.Val == from {
					s.Val = to
				}
			}
		}
		return nil
	})
}

// labelNames lists every label name an expression refers to.
func labelNames(e parser.Expr) map[string]bool {
	out := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			for _, m := range n.LabelMatchers {
				out[m.Name] = true
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				out[l] = true
			}
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				for _, l := range append(append([]string{}, n.VectorMatching.MatchingLabels...), n.VectorMatching.Include...) {
					out[l] = true
				}
			}
		}
		return nil
	})
	return out
}

// TestGMPRulesRenameEveryNamespaceLabel holds the textual rewrite against a
// rewrite of the parsed expressions: same rules, same expressions but for
// namespace -> exported_namespace, and no namespace label left (in the
// expressions, and in the templates' $labels and queries).
func TestGMPRulesRenameEveryNamespaceLabel(t *testing.T) {
	src, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	gmp, err := ParseRules(GMPRules(RulesYAML))
	if err != nil {
		t.Fatalf("the GMP rules do not parse: %v", err)
	}
	if len(gmp.Groups) != len(src.Groups) {
		t.Fatalf("GMP rules have %d groups, source %d", len(gmp.Groups), len(src.Groups))
	}
	p := parser.NewParser(parser.Options{})
	renamed := 0
	for gi, g := range src.Groups {
		if len(gmp.Groups[gi].Rules) != len(g.Rules) || gmp.Groups[gi].Name != g.Name {
			t.Fatalf("group %s differs in shape", g.Name)
		}
		for ri, r := range g.Rules {
			gr := gmp.Groups[gi].Rules[ri]
			if gr.Name() != r.Name() || gr.For != r.For {
				t.Errorf("rule %s became %s (for %s/%s)", r.Name(), gr.Name(), r.For, gr.For)
			}
			want, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Name(), err)
			}
			if labelNames(want)["namespace"] {
				renamed++
			}
			renameLabel(want, "namespace", GMPNamespaceLabel)
			got, err := p.ParseExpr(gr.Expr)
			if err != nil {
				t.Fatalf("%s: GMP expression does not parse: %v", r.Name(), err)
			}
			if got.String() != want.String() {
				t.Errorf("%s: GMP expression\n  %s\nwant\n  %s", r.Name(), got, want)
			}
			if labelNames(got)["namespace"] {
				t.Errorf("%s: GMP expression still names label namespace", r.Name())
			}
			for k, v := range gr.Annotations {
				if m := namespaceRefRE.FindString(v); m != "" {
					t.Errorf("%s: GMP annotation %s still refers to the label namespace: %q", r.Name(), k, m)
				}
			}
		}
	}
	if renamed < 5 {
		t.Errorf("only %d rules name the namespace label; the check lost them", renamed)
	}
}

// namespaceRefRE finds the label namespace in a template: $labels.namespace,
// $x.Labels.namespace, a matcher namespace="..." in a query, "namespace" as
// an argument (sortByLabel).
var namespaceRefRE = regexp.MustCompile(`[Ll]abels\.namespace\b|(^|[^a-zA-Z0-9_])namespace\s*(=|!=|=~|!~)\s*"|"namespace"`)
