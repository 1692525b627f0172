// Command gen writes the shard-safe and the global rule files
// (gpu-pool-exporter.shard.rules.yml, gpu-pool-exporter.global.rules.yml,
// and their GKE Managed Prometheus variants gpu-pool-exporter.gmp.*.rules.yml)
// from the one rules file, gpu-pool-exporter.rules.yml. Run it from the
// repository root (deploy/sync.sh does, before copying the rules into the
// deploy manifests): go run ./alerts/gen
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

func main() {
	dir := "alerts"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	src, err := os.ReadFile(filepath.Join(dir, alerts.RulesFileName))
	if err != nil {
		fail(fmt.Errorf("%w (run from the repository root, or name the alerts directory)", err))
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
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "alerts/gen: %v\n", err)
	os.Exit(1)
}
