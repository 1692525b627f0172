// Command gen writes gpu-pool-exporter's Grafana dashboards (package
// dashboards/boards) as JSON files into -out. `make generate` writes them
// into dashboards/ together with every other generated file and copy; this
// command is for writing them elsewhere.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/dashboards/boards"
)

func main() {
	out := flag.String("out", "dashboards", "directory to write the dashboards to")
	flag.Parse()
	files, err := boards.Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(*out, name)
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "dashboards/gen:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}
