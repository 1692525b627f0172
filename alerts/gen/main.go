// Command gen writes the shard-safe and the global rule files
// (gpu-pool-exporter.shard.rules.yml, gpu-pool-exporter.global.rules.yml,
// and their GKE Managed Prometheus variants gpu-pool-exporter.gmp.*.rules.yml)
// from the one rules file, gpu-pool-exporter.rules.yml, in -dir, into -out.
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
	flag.Parse()
	if *out == "" {
		*out = *dir
	}
	src, err := os.ReadFile(filepath.Join(*dir, alerts.RulesFileName))
	if err != nil {
		fail(fmt.Errorf("%w (run it from the repository root, or give -dir)", err))
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

func fail(err error) {
	fmt.Fprintf(os.Stderr, "alerts/gen: %v\n", err)
	os.Exit(1)
}
