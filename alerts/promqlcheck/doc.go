// Package promqlcheck parses every PromQL expression of the alert and
// recording rules (alerts/gpu-pool-exporter.rules.yml, including the queries
// inside annotation templates) and of the Grafana dashboards (panel targets,
// template variables, annotations) with Prometheus' own parser. Its tests
// check that every metric name they use is one the exporter serves
// (alerts/known_metrics.txt), a recording rule of the rules file, a
// kube-state-metrics metric on the list in the test, or up/ALERTS; and that
// the lean profile (--collector.profile=lean) still serves every exporter
// metric they use. UsedMetrics gives the same list to other tests.
package promqlcheck
