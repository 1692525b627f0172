// Command gen writes gpu-pool-exporter's Grafana dashboards (the JSON files
// in dashboards/) with the Grafana Foundation SDK.
//
//	go run ./dashboards/gen            # from the repository root
//	go generate ./dashboards/...       # the same
//
// dashboards/gen's test fails when the committed JSON differs from what this
// writes.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// boards are the dashboards by file name.
var boards = map[string]func() *dashboard.DashboardBuilder{
	"gpu-pool-overview.json": overview,
	"gpu-node.json":          node,
	"gpu-workloads.json":     workloads,
}

// Generate builds every dashboard and renders it as indented JSON.
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

// repoDashboards finds dashboards/ from the working directory: the
// directory holding go.mod, or one of its parents.
func repoDashboards() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "dashboards"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod in the working directory or above it; use -out")
		}
		dir = parent
	}
}

func main() {
	out := flag.String("out", "", "directory to write the dashboards to (default: dashboards/ of the module)")
	flag.Parse()
	dir := *out
	if dir == "" {
		var err error
		if dir, err = repoDashboards(); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
	files, err := Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}
