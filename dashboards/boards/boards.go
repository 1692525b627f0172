// Package boards builds gpu-pool-exporter's Grafana dashboards (the JSON
// files in dashboards/) with the Grafana Foundation SDK. `make generate`
// writes them; a test in scripts/generate fails while a committed file
// differs from what Generate returns.
package boards

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// boards are the dashboards by file name.
var boards = map[string]func() *dashboard.DashboardBuilder{
	"gpu-pool-overview.json": overview,
	"gpu-node.json":          node,
	"gpu-workloads.json":     workloads,
}

// Generate builds every dashboard and renders it as indented JSON, by file
// name.
func Generate() (map[string][]byte, error) {
	out := map[string][]byte{}
	for name, build := range boards {
		d, err := build().Build()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		numberPanels(&d)
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(d); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = buf.Bytes()
	}
	return out, nil
}

// numberPanels gives every panel and row a stable id in layout order.
func numberPanels(d *dashboard.Dashboard) {
	id := uint32(1)
	for i := range d.Panels {
		p := &d.Panels[i]
		switch {
		case p.Panel != nil:
			v := id
			p.Panel.Id = &v
		case p.RowPanel != nil:
			p.RowPanel.Id = id
			for j := range p.RowPanel.Panels {
				id++
				v := id
				p.RowPanel.Panels[j].Id = &v
			}
		}
		id++
	}
}
