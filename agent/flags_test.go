package agent_test

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simagent"
)

// kingpinBuiltins are the flags kingpin adds itself: they print and end
// parsing, and fill no configuration.
var kingpinBuiltins = []string{"help", "help-long", "help-man", "version",
	"completion-bash", "completion-script-bash", "completion-script-zsh"}

// TestNoFlagIsIgnored walks every flag of the exporter, exporter-toolkit's
// and the simulated node's included: given a value other than its default, each changes the parsed
// configuration. A flag accepted and then ignored (parsed into a variable
// nothing copies into the config) fails here; a new flag without a value
// below fails until it gets one.
func TestNoFlagIsIgnored(t *testing.T) {
	dir := t.TempDir()
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("http_server_config:\n  headers:\n    X-Frame-Options: deny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	if err := os.WriteFile(lib, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// values: the arguments that give each flag a value other than its
	// default, after the arguments of both parses (with) where the flag
	// only counts beside another. Bool flags not listed are tried both
	// ways (--x and --no-x): one of them must change the configuration.
	type value struct{ with, args []string }
	values := map[string]value{
		"web.listen-address":                           {args: []string{"--web.listen-address=127.0.0.1:19947"}},
		"web.config.file":                              {args: []string{"--web.config.file=" + webConfig}},
		"collect-interval":                             {args: []string{"--collect-interval=10s"}},
		"nvml.device-timeout":                          {args: []string{"--nvml.device-timeout=1s"}},
		"nvml.init-timeout":                            {args: []string{"--nvml.init-timeout=20s"}},
		"nvml.restart-after":                           {args: []string{"--nvml.restart-after=20m"}},
		"nvml.library":                                 {args: []string{"--nvml.library=" + lib}},
		"path.sysfs":                                   {args: []string{"--path.sysfs=" + dir}},
		"simulate.seed":                                {args: []string{"--simulate.seed=7"}},
		"simulate.scenario":                            {args: []string{"--simulate.scenario=../scripts/bench/mig-8x7-200pods.yaml"}},
		"log.level":                                    {args: []string{"--log.level=debug"}},
		"log.format":                                   {args: []string{"--log.format=console"}},
		"node-name":                                    {args: []string{"--node-name=gpu-node-1"}},
		"web.max-requests":                             {args: []string{"--web.max-requests=10"}},
		"web.max-connections":                          {args: []string{"--web.max-connections=10"}},
		"web.probe-address":                            {args: []string{"--web.probe-address=127.0.0.1:19948"}},
		"web.shutdown-timeout":                         {args: []string{"--web.shutdown-timeout=10s"}},
		"idle.threshold":                               {args: []string{"--idle.threshold=0.1"}},
		"idle.window":                                  {args: []string{"--idle.window=1h"}},
		"idle.price-file":                              {args: []string{"--idle.price-file=../deploy/prices-example.yaml"}},
		"idle.price":                                   {args: []string{"--idle.price=NVIDIA H100 80GB HBM3=11.06"}},
		"fragmentation.shapes":                         {args: []string{"--fragmentation.shapes=1:1"}},
		"dcgm.mode":                                    {args: []string{"--dcgm.mode=off"}},
		"dcgm.host-engine":                             {args: []string{"--dcgm.host-engine=127.0.0.1:5555"}},
		"kubelet.pod-resources-socket":                 {args: []string{"--kubelet.pod-resources-socket=" + filepath.Join(dir, "kubelet.sock")}},
		"kubelet.refresh-interval":                     {args: []string{"--kubelet.refresh-interval=20s"}},
		"kubelet.timeout":                              {args: []string{"--kubelet.timeout=3s"}},
		"kubelet.max-response-bytes":                   {args: []string{"--kubelet.max-response-bytes=8MiB"}},
		"kubelet.resource-names":                       {args: []string{"--kubelet.resource-names=example.com/gpu"}},
		"collector.profile":                            {args: []string{"--collector.profile=lean"}},
		"compat.dcgm-exporter.hostname-label":          {with: []string{"--compat.dcgm-exporter"}, args: []string{"--compat.dcgm-exporter.hostname-label=Hostname"}},
		"compat.dcgm-exporter.release":                 {with: []string{"--compat.dcgm-exporter"}, args: []string{"--compat.dcgm-exporter.release=4.9"}},
		"compat.dcgm-exporter.nvidia-resource-names":   {with: []string{"--compat.dcgm-exporter"}, args: []string{"--compat.dcgm-exporter.nvidia-resource-names=nvidia.com/gpu.shared"}},
		"compat.dcgm-exporter.xid-count-window-size":   {with: []string{"--compat.dcgm-exporter"}, args: []string{"--compat.dcgm-exporter.xid-count-window-size=60000"}},
		"procs.proc-root":                              {with: []string{"--procs.enabled"}, args: []string{"--procs.proc-root=" + dir}},
		"procs.container-log-dir":                      {with: []string{"--procs.enabled"}, args: []string{"--procs.container-log-dir=" + dir}},
		"procs.cri-socket":                             {with: []string{"--procs.enabled"}, args: []string{"--procs.cri-socket=" + filepath.Join(dir, "containerd.sock")}},
		"compat.dcgm-exporter.kubernetes-virtual-gpus": {with: []string{"--compat.dcgm-exporter"}},
		"compat.dcgm-exporter.collectors":              {args: []string{"--compat.dcgm-exporter.collectors=../deploy/dcgm-exporter/4.8.3/dcp-metrics-included.csv"}},
		"compat.dcgm-exporter.kubernetes-enable-pod-labels": {with: []string{"--compat.dcgm-exporter", "--node-name=n"}},
		"compat.dcgm-exporter.kubernetes-enable-pod-uid":    {with: []string{"--compat.dcgm-exporter", "--node-name=n"}},
		"compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex": {with: []string{"--compat.dcgm-exporter", "--node-name=n", "--compat.dcgm-exporter.kubernetes-enable-pod-labels"},
			args: []string{"--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex=^app$"}},
		"kubernetes.kubeconfig":                      {args: []string{"--kubernetes.kubeconfig=" + filepath.Join(dir, "kubeconfig")}},
		"compat.dcgm-exporter.kubernetes-enable-dra": {with: []string{"--compat.dcgm-exporter"}},
		"node-condition.type":                        {with: []string{"--node-condition"}, args: []string{"--node-condition.type=example.com/GPUFault"}},
	}
	parse := func(t *testing.T, args []string) *agent.Config {
		t.Helper()
		c, code, err := agent.ParseConfig(args, io.Discard, io.Discard, simagent.New())
		if err != nil || c == nil {
			t.Fatalf("%s: exit %d, %v", strings.Join(args, " "), code, err)
		}
		return c
	}
	// The simulated node's binary has every flag of the agent and its own.
	app := agent.FlagApp(simagent.New())
	for _, f := range app.Model().Flags {
		if slices.Contains(kingpinBuiltins, f.Name) {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			v, listed := values[f.Name]
			tries := [][]string{v.args}
			if f.IsBoolFlag() && v.args == nil {
				tries = [][]string{{"--" + f.Name}, {"--no-" + f.Name}}
			} else if !listed {
				t.Fatalf("--%s has no value in this test: add one other than its default (%q)", f.Name, f.Default)
			}
			base := parse(t, v.with)
			for _, args := range tries {
				if !reflect.DeepEqual(parse(t, append(slices.Clone(v.with), args...)), base) {
					return
				}
			}
			t.Errorf("--%s: %v change nothing in the configuration (beside %v): the flag is accepted and ignored", f.Name, tries, v.with)
		})
	}
}
