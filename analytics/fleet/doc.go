// Package fleet reads the fleet's capacity, idle cost and GPUs to replace
// from the recording rules' series in Prometheus (or anything that serves
// its query API: Thanos Query, GMP's frontend), for `gpupool fleet`.
//
// The files:
//
//	fleet.go  the series read, Read (one instant query each) and the
//	          Snapshot it returns, printed as tables by Text
package fleet
