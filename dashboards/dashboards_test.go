package dashboards

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

var wantDashboards = []string{"gpu-node.json", "gpu-pool-overview.json", "gpu-workloads.json"}

func TestNames(t *testing.T) {
	if got := Names(); !slices.Equal(got, wantDashboards) {
		t.Fatalf("dashboards: %v, want %v", got, wantDashboards)
	}
}

type layoutPanel struct {
	ID         *int   `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []layoutPanel `json:"panels"`
}

type board struct {
	UID        string        `json:"uid"`
	Title      string        `json:"title"`
	Panels     []layoutPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

// TestLayout checks what Grafana needs to show the dashboards well: unique
// panel ids and titles, every panel on the 24-column grid, every panel and
// variable on the $datasource variable, refIds on every query.
func TestLayout(t *testing.T) {
	uids := map[string]bool{}
	for _, n := range Names() {
		data, err := File(n)
		if err != nil {
			t.Fatal(err)
		}
		var b board
		if err := json.Unmarshal(data, &b); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if b.UID == "" || uids[b.UID] {
			t.Errorf("%s: uid %q missing or used twice", n, b.UID)
		}
		uids[b.UID] = true
		ids, titles := map[int]bool{}, map[string]bool{}
		var all []layoutPanel
		for _, p := range b.Panels {
			all = append(all, p)
			all = append(all, p.Panels...)
		}
		for _, p := range all {
			if p.ID == nil || ids[*p.ID] {
				t.Errorf("%s: panel %q: id missing or not unique", n, p.Title)
			} else {
				ids[*p.ID] = true
			}
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("%s: panel %q: gridPos %+v is off the 24-column grid", n, p.Title, p.GridPos)
			}
			if p.Type == "row" {
				continue
			}
			if p.Title == "" || titles[p.Title] {
				t.Errorf("%s: panel title %q empty or used twice", n, p.Title)
			}
			titles[p.Title] = true
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: panel %q: datasource should be the prometheus ${datasource} variable", n, p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", n, p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("%s: panel %q: refId %q empty or used twice", n, p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("%s: panel %q: query %s is empty", n, p.Title, tg.RefID)
				}
			}
		}
	}
}

// TestVariables checks the template variables every dashboard must have.
func TestVariables(t *testing.T) {
	for _, n := range Names() {
		data, err := File(n)
		if err != nil {
			t.Fatal(err)
		}
		var b board
		if err := json.Unmarshal(data, &b); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		vars := map[string]string{}
		queries := map[string]string{}
		for _, v := range b.Templating.List {
			vars[v.Name] = v.Type
			var q string
			_ = json.Unmarshal(v.Query, &q)
			queries[v.Name] = q
			if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
				t.Errorf("%s: variable %s should query the ${datasource} variable", n, v.Name)
			}
		}
		if vars["datasource"] != "datasource" || queries["datasource"] != "prometheus" {
			t.Errorf("%s: want a datasource variable of type prometheus", n)
		}
		for _, name := range []string{"nodepool", "node", "namespace"} {
			if vars[name] != "query" {
				t.Errorf("%s: want a query variable %s", n, name)
			}
		}
		// The rules' pool label (GKE, Karpenter, EKS, AKS, "none"), not
		// GKE's label alone.
		if queries["nodepool"] != "label_values(node:gpu_nodepool:info, nodepool)" {
			t.Errorf("%s: nodepool should list node:gpu_nodepool:info's nodepool, as the rules do; is %q", n, queries["nodepool"])
		}
	}
}

func TestQueriesAndSubstitute(t *testing.T) {
	qs, err := AllQueries()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, q := range qs {
		kinds[q.Kind]++
		if q.Kind == KindVariable {
			if _, _, ok := VariablePromQL(q.Expr); !ok {
				t.Errorf("%s: variable query %q has no PromQL in it", q, q.Expr)
			}
		}
		_, unknown := Substitute(q.Expr, map[string]string{"nodepool": ".*", "node": ".*", "namespace": ".*", "gpu": ".*"})
		if len(unknown) > 0 {
			t.Errorf("%s: unknown variables %v in %q", q, unknown, q.Expr)
		}
	}
	for _, k := range []string{KindTarget, KindVariable, KindAnnotation} {
		if kinds[k] == 0 {
			t.Errorf("no %s queries found", k)
		}
	}

	got, unknown := Substitute(`rate(x{node=~"$node", a="${ns}", b="[[pool]]"}[$__rate_interval]) $nope`, map[string]string{"node": "n1|n2", "ns": "default", "pool": "p"})
	want := `rate(x{node=~"n1|n2", a="default", b="p"}[1m]) $nope`
	if got != want || !slices.Equal(unknown, []string{"nope"}) {
		t.Errorf("Substitute: got %q %v, want %q [nope]", got, unknown, want)
	}
	if e, l, ok := VariablePromQL(`label_values(up{job="x"}, node)`); !ok || e != `up{job="x"}` || l != "node" {
		t.Errorf("VariablePromQL(label_values) = %q %q %v", e, l, ok)
	}
	if _, _, ok := VariablePromQL(`label_values(node)`); ok {
		t.Error("VariablePromQL(label_values(node)) should have no PromQL")
	}
}
