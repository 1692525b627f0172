// Command gmpgen writes alerts/gpu-pool-exporter.gmp.rules.yml, the rules
// for GKE Managed Prometheus, from alerts/gpu-pool-exporter.rules.yml (see
// alerts.GMPRules). Run it from the repository root; deploy/sync.sh does.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

func main() {
	dir := flag.String("dir", "alerts", "the directory holding "+alerts.RulesFileName)
	flag.Parse()
	src, err := os.ReadFile(filepath.Join(*dir, alerts.RulesFileName))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gmpgen: %v (run it from the repository root, or give -dir)\n", err)
		os.Exit(1)
	}
	if _, err := alerts.ParseRules(src); err != nil {
		fmt.Fprintf(os.Stderr, "gmpgen: %s: %v\n", alerts.RulesFileName, err)
		os.Exit(1)
	}
	out := filepath.Join(*dir, alerts.GMPRulesFileName)
	if err := os.WriteFile(out, alerts.GMPRules(src), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "gmpgen: %v\n", err)
		os.Exit(1)
	}
}
