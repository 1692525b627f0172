// Package promqlcheck holds only a test: it parses every PromQL expression of
// the alert and recording rules (alerts/gpu-pool-exporter.rules.yml, including
// the queries inside annotation templates) and of the Grafana dashboards
// (panel targets, template variables, annotations) with Prometheus' own
// parser, and checks that every metric name they use is one the exporter
// serves (alerts/known_metrics.txt), a recording rule of the rules file, a
// kube-state-metrics metric on the list in the test, or up/ALERTS.
package promqlcheck
