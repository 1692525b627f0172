// Package promapi is the one Prometheus query client of the subcommands
// that read Prometheus (fleet, recommend, report; Prometheus, Thanos Query
// or GKE Managed Prometheus' frontend): their flags (--prometheus, --prometheus.bearer-token-file,
// --tls.insecure-skip-verify, --timeout), client_golang's
// api/prometheus/v1 client over prometheus/common's HTTP client, and
// errors that say what to do.
//
// The files:
//
//	promapi.go  the flags, the client, instant and range queries
package promapi
