// Package collector turns the samplers' readings (NVML, DCGM, XID events,
// processes, pod holdings) into gpu-pool-exporter's Prometheus metrics: one
// page rendered per sample, served to every scrape.
package collector
