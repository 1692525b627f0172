// Command gmpgen writes gpu-pool-exporter.gmp.rules.yml, the rules for GKE
// Managed Prometheus, from gpu-pool-exporter.rules.yml (see alerts.GMPRules)
// in -dir, into -out. `make generate` writes it into alerts/ with every other
// generated file; this command (like alerts/gen, with the same flags) writes
// it elsewhere.
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
	out := flag.String("out", "", "the directory to write to (default: -dir)")
	flag.Parse()
	if *out == "" {
		*out = *dir
	}
	src, err := os.ReadFile(filepath.Join(*dir, alerts.RulesFileName))
	if err != nil {
		fail(fmt.Errorf("%w (run it from the repository root, or give -dir)", err))
	}
	if _, err := alerts.ParseRules(src); err != nil {
		fail(fmt.Errorf("%s: %w", alerts.RulesFileName, err))
	}
	if err := os.WriteFile(filepath.Join(*out, alerts.GMPRulesFileName), alerts.GMPRules(src), 0o644); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "alerts/gmpgen: %v\n", err)
	os.Exit(1)
}
