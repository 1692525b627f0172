// Command gen writes the shard-safe and the global rule files
// (gpu-pool-exporter.shard.rules.yml, gpu-pool-exporter.global.rules.yml,
// and their GKE Managed Prometheus variants gpu-pool-exporter.gmp.*.rules.yml)
// from the one rules file, gpu-pool-exporter.rules.yml, in -dir, into -out;
// with -remediators=FILE, the rules file too, its remediators group read
// from FILE (a list of your own, as alerts/remediators.yml).
// `make generate` writes them into alerts/ with every other generated file;
// this command (like alerts/gmpgen, with the same flags) writes them elsewhere.
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
	remediators := flag.String("remediators", "", "a remediators file (as alerts/"+alerts.RemediatorsFileName+"): the rules files read these remediators' verdicts instead, "+alerts.RulesFileName+" included (written to -out)")
	flag.Parse()
	if *out == "" {
		*out = *dir
	}
	src, err := os.ReadFile(filepath.Join(*dir, alerts.RulesFileName))
	if err != nil {
		fail(fmt.Errorf("%w (run it from the repository root, or give -dir)", err))
	}
	if *remediators != "" {
		b, err := os.ReadFile(*remediators)
		if err != nil {
			usage(fmt.Errorf("-remediators: %w", err))
		}
		r, err := alerts.ParseRemediators(b)
		if err != nil {
			usage(fmt.Errorf("-remediators=%s: %w", *remediators, err))
		}
		if src, err = alerts.WithRemediators(src, r); err != nil {
			fail(err)
		}
		if err := os.WriteFile(filepath.Join(*out, alerts.RulesFileName), src, 0o644); err != nil {
			fail(err)
		}
	}
	shard, global, err := alerts.Split(src)
	if err != nil {
		fail(err)
	}
	gmpShard, gmpGlobal, err := alerts.SplitGMP(src)
	if err != nil {
		fail(err)
	}
	for name, b := range map[string][]byte{
		alerts.ShardRulesFileName: shard, alerts.GlobalRulesFileName: global,
		alerts.GMPShardRulesFileName: gmpShard, alerts.GMPGlobalRulesFileName: gmpGlobal,
	} {
		if err := os.WriteFile(filepath.Join(*out, name), b, 0o644); err != nil {
			fail(err)
		}
	}
}

// usage is the user's mistake: exit 2.
func usage(err error) {
	fmt.Fprintf(os.Stderr, "alerts/gen: %v\n", err)
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "alerts/gen: %v\n", err)
	os.Exit(1)
}
