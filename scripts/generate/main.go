// Command generate writes every generated file and copy of the repository,
// in a fixed order: the GKE Managed Prometheus rules and the shard and
// global rule layers (from alerts/gpu-pool-exporter.rules.yml), the
// promtool tests from the pages the exporter serves on simulated nodes
// (from alerts/pages/testdata), the Grafana dashboards (from
// dashboards/boards), the Helm chart's copies of the rules and dashboards,
// the kustomize rule objects and the exporter's built-in copy of
// dcgm-exporter's default counters file. `make generate` runs it from the repository
// root; a second run changes nothing. With -check it writes nothing and
// fails listing every stale file (the test in this directory does the same
// in `make test`).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the repository root")
	check := flag.Bool("check", false, "write nothing; list the stale files and fail if there are any")
	flag.Parse()
	files, err := Files(*root)
	if err != nil {
		fail(err)
	}
	if *check {
		stale, err := Stale(*root, files)
		if err != nil {
			fail(err)
		}
		if len(stale) > 0 {
			fail(fmt.Errorf("stale generated files (run make generate):\n  %s", strings.Join(stale, "\n  ")))
		}
		return
	}
	changed, err := Write(*root, files)
	for _, c := range changed {
		fmt.Println("generate: wrote", c)
	}
	if err != nil {
		fail(err)
	}
	fmt.Printf("generate: %d files, %d changed\n", len(files), len(changed))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "generate:", err)
	os.Exit(1)
}
