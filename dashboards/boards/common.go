package boards

import (
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/bargauge"
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// job selects the exporter's series.
const job = `job="gpu-pool-exporter"`

// tag links the three dashboards to each other.
const tag = "gpu-pool-exporter"

// ds is every panel's and variable's data source: the $datasource variable.
var ds = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// newDashboard starts a dashboard with the settings all three share: tags,
// refresh, time range, links to the other two, and an annotation that
// marks firing GPU alerts.
func newDashboard(uid, title, description string) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags([]string{"gpu", tag}).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Refresh("1m").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		Link(dashboard.NewDashboardLinkBuilder("GPU dashboards").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{tag}).
			AsDropdown(true).
			IncludeVars(true).
			KeepTime(true)).
		Annotation(dashboard.NewAnnotationQueryBuilder().
			Name("GPU alerts").
			Datasource(ds).
			Enable(true).
			IconColor("red").
			Expr(`ALERTS{alertstate="firing", alertname=~"GPU.*", node=~"$node"}`).
			TitleFormat("{{alertname}}").
			TextFormat("{{node}} GPU {{gpu}} {{severity}}").
			TagKeys("severity,node").
			Step("60s"))
}

// Template variables. Every dashboard has datasource, nodepool, node and
// namespace.

func datasourceVar() *dashboard.DatasourceVariableBuilder {
	return dashboard.NewDatasourceVariableBuilder("datasource").
		Label("Data source").
		Type("prometheus")
}

// nodepoolVar lists the node pools as the rules name them: the recording
// rule node:gpu_nodepool:info takes GKE's pool label, else Karpenter's, EKS's
// or AKS's, and "none" for nodes in no known pool, so every pool and every
// node with an exporter can be selected.
func nodepoolVar() *dashboard.QueryVariableBuilder {
	q := `label_values(node:gpu_nodepool:info, nodepool)`
	return queryVar("nodepool", "Node pool", q).
		Description("Node pool of the GPU nodes, as the alert rules name it (recording rule node:gpu_nodepool:info: GKE's, Karpenter's, EKS's or AKS's pool label from kube-state-metrics; \"none\" for nodes without one).").
		Multi(true).
		IncludeAll(true).
		AllValue(".*")
}

// nodeVar lists the nodes with a gpu-pool-exporter in the chosen pools
// (node:gpu_nodepool:info is a recording rule over kube_node_labels and up).
func nodeVar(multi bool) *dashboard.QueryVariableBuilder {
	v := queryVar("node", "Node", `label_values(node:gpu_nodepool:info{nodepool=~"$nodepool"}, node)`).
		Description("GPU nodes with gpu-pool-exporter in the chosen node pools.")
	if multi {
		// No custom all value: All expands to the pool's nodes.
		v = v.Multi(true).IncludeAll(true)
	}
	return v
}

func namespaceVar() *dashboard.QueryVariableBuilder {
	return queryVar("namespace", "Namespace", `label_values(gpu_allocation_info{`+job+`, node=~"$node"}, namespace)`).
		Description("Namespaces of pods holding GPUs on the chosen nodes.").
		Multi(true).
		IncludeAll(true).
		AllValue(".*")
}

func queryVar(name, label, query string) *dashboard.QueryVariableBuilder {
	return dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).
		Definition(query).
		Datasource(ds).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalCaseInsensitiveAsc)
}

// Queries.

// refIDs names a panel's queries A, B, C...
func refID(i int) string { return string(rune('A' + i)) }

// series is a range query drawn as a time series.
func series(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		Expr(strings.TrimSpace(expr)).
		LegendFormat(legend).
		Range()
}

// instant is an instant query returning a table (for tables and stats).
func instant(expr string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		Expr(strings.TrimSpace(expr)).
		Instant().
		Format(prometheus.PromQueryFormatTable)
}

func withRefIDs(qs []*prometheus.DataqueryBuilder) []*prometheus.DataqueryBuilder {
	for i, q := range qs {
		q.RefId(refID(i))
	}
	return qs
}

// Thresholds.

type step struct {
	value float64
	color string
}

// thresholds starts at base and changes color at each step.
func thresholds(base string, steps ...step) *dashboard.ThresholdsConfigBuilder {
	ts := []dashboard.Threshold{{Value: nil, Color: base}}
	for _, s := range steps {
		ts = append(ts, dashboard.Threshold{Value: cog.ToPtr(s.value), Color: s.color})
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(ts)
}

// Panels.

// statPanel is one big number (or a few, one per series).
func statPanel(title, description, unit string, w, h uint32, th *dashboard.ThresholdsConfigBuilder, qs ...*prometheus.DataqueryBuilder) *stat.PanelBuilder {
	p := stat.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Span(w).Height(h).
		Unit(unit).
		GraphMode(common.BigValueGraphModeArea).
		ColorMode(common.BigValueColorModeValue).
		JustifyMode(common.BigValueJustifyModeAuto).
		TextMode(common.BigValueTextModeAuto).
		Orientation(common.VizOrientationAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false))
	if th == nil {
		th = thresholds("green")
	}
	p = p.Thresholds(th)
	for _, q := range withRefIDs(qs) {
		p = p.WithTarget(q)
	}
	return p
}

type tsOpt func(*timeseries.PanelBuilder) *timeseries.PanelBuilder

// stacked stacks the series (for parts of a whole).
func stacked(p *timeseries.PanelBuilder) *timeseries.PanelBuilder {
	return p.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).FillOpacity(35)
}

// ratio fixes the axis to 0-1 shown as percent.
func ratio(p *timeseries.PanelBuilder) *timeseries.PanelBuilder {
	return p.Unit("percentunit").Min(0).Max(1)
}

// timeseriesPanel draws range queries over time, legend as a table.
func timeseriesPanel(title, description, unit string, w, h uint32, qs []*prometheus.DataqueryBuilder, opts ...tsOpt) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Span(w).Height(h).
		Unit(unit).
		LineWidth(1).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever).
		SpanNulls(common.BoolOrFloat64{Bool: cog.ToPtr(false)}).
		Legend(common.NewVizLegendOptionsBuilder().
			DisplayMode(common.LegendDisplayModeTable).
			Placement(common.LegendPlacementBottom).
			ShowLegend(true).
			Calcs([]string{"lastNotNull", "max"}).
			SortBy("Last *").SortDesc(true)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Thresholds(thresholds("green"))
	for _, q := range withRefIDs(qs) {
		p = p.WithTarget(q)
	}
	for _, o := range opts {
		p = o(p)
	}
	return p
}

// column describes a table column: the query giving its value (instant,
// one series per row; rows are merged on their labels), its header and
// unit.
type column struct {
	header string
	unit   string
	expr   string
}

// tablePanel merges instant queries into one table: the label columns in
// keep (in that order), then one column per query. Other labels are hidden.
func tablePanel(title, description string, w, h uint32, keep []string, sortBy string, cols ...column) *table.PanelBuilder {
	p := table.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Span(w).Height(h).
		CellHeight(common.TableCellHeightSm).
		ShowHeader(true).
		Filterable(true).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"}).CountRows(false)).
		Thresholds(thresholds("green"))
	rename := map[string]string{}
	order := map[string]int{}
	for i, k := range keep {
		order[k] = i
		rename[k] = labelHeader(k)
	}
	for i, c := range cols {
		q := instant(c.expr).RefId(refID(i))
		p = p.WithTarget(q)
		value := "Value #" + refID(i)
		if len(cols) == 1 {
			value = "Value"
		}
		rename[value] = c.header
		order[value] = len(keep) + i
		if c.unit != "" {
			p = p.OverrideByName(c.header, []dashboard.DynamicConfigValue{{Id: "unit", Value: c.unit}})
		}
	}
	if sortBy != "" {
		p = p.SortBy([]cog.Builder[common.TableSortByFieldState]{common.NewTableSortByFieldStateBuilder().DisplayName(sortBy).Desc(true)})
	}
	if len(cols) > 1 {
		p = p.WithTransformation(dashboard.DataTransformerConfig{Id: "merge", Options: map[string]any{}})
	}
	// Hide every field that is not a kept label or a value: Time, __name__,
	// job, instance and the rest.
	p = p.WithTransformation(dashboard.DataTransformerConfig{Id: "filterFieldsByName", Options: map[string]any{
		"include": map[string]any{"names": keys(order)},
	}})
	p = p.WithTransformation(dashboard.DataTransformerConfig{Id: "organize", Options: map[string]any{
		"indexByName":  order,
		"renameByName": rename,
	}})
	return p
}

func keys(m map[string]int) []string {
	out := make([]string, len(m))
	for k, i := range m {
		out[i] = k
	}
	return out
}

var headers = map[string]string{
	"nodepool":            "Node pool",
	"node":                "Node",
	"gpu":                 "GPU",
	"uuid":                "UUID",
	"gpu_instance":        "MIG instance",
	"mig_profile":         "MIG profile",
	"namespace":           "Namespace",
	"pod":                 "Pod",
	"container":           "Container",
	"resource":            "Resource",
	"xid":                 "XID",
	"category":            "Category",
	"action":              "Recommended action",
	"alertname":           "Alert",
	"severity":            "Severity",
	"driver_version":      "Driver",
	"cuda_driver_version": "CUDA",
	"model":               "Model",
	"domain":              "Domain",
}

func labelHeader(l string) string {
	if h, ok := headers[l]; ok {
		return h
	}
	return l
}

// barGaugePanel shows one bar per series.
func barGaugePanel(title, description, unit string, w, h uint32, qs ...*prometheus.DataqueryBuilder) *bargauge.PanelBuilder {
	p := bargauge.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Span(w).Height(h).
		Unit(unit).
		Min(0).
		DisplayMode(common.BarGaugeDisplayModeGradient).
		Orientation(common.VizOrientationHorizontal).
		ShowUnfilled(true).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		Thresholds(thresholds("green"))
	for _, q := range withRefIDs(qs) {
		p = p.WithTarget(q)
	}
	return p
}

// stateTimelinePanel shows 0/1 states over time.
func stateTimelinePanel(title, description string, w, h uint32, mappings []dashboard.ValueMapping, qs ...*prometheus.DataqueryBuilder) *statetimeline.PanelBuilder {
	p := statetimeline.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(ds).
		Span(w).Height(h).
		ShowValue(common.VisibilityModeNever).
		MergeValues(true).
		RowHeight(0.9).
		FillOpacity(70).
		Mappings(mappings).
		Thresholds(thresholds("green")).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom).ShowLegend(true))
	for _, q := range withRefIDs(qs) {
		p = p.WithTarget(q)
	}
	return p
}

// valueText maps values to texts and colors, e.g. 0 -> "down" red.
func valueText(pairs ...string) []dashboard.ValueMapping {
	if len(pairs)%3 != 0 {
		panic(fmt.Sprintf("valueText wants value, text, color triples, got %d strings", len(pairs)))
	}
	opts := map[string]dashboard.ValueMappingResult{}
	for i := 0; i+2 < len(pairs); i += 3 {
		opts[pairs[i]] = dashboard.ValueMappingResult{Text: cog.ToPtr(pairs[i+1]), Color: cog.ToPtr(pairs[i+2]), Index: cog.ToPtr(int32(i / 3))}
	}
	return []dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}
}
