// Package sample is the node's data model: what one sampling pass saw of
// every GPU (identity, MIG layout, per-device field values, board health,
// processes) and of the driver stack.
//
// Every data source fills it and the renderer reads it; it belongs to no
// source. The NVML sampler (collector/nvmlsampler) builds a NodeSample,
// DCGM's values and health are merged into it by the orchestration
// (package collector) before anything is rendered, and the renderer turns
// it into the exposition page. Nothing here calls a driver.
package sample
