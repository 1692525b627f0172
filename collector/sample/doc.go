// Package sample is the node's data model: what one sampling pass saw of
// every GPU (identity, MIG layout, per-device field values, board health,
// processes) and of the driver stack.
//
// Every data source fills it and the rest of the exporter reads it; it
// belongs to no source. The NVML sampler (collector/nvmlsampler) builds a
// NodeSample, the join (collector/state) merges DCGM's values and health
// into it before anything else reads it, and the render (collector/render)
// turns the joined state into the page. Nothing here calls a driver.
//
// The files, each using only those before it:
//
//	fields.go   the per-device value slots (Field, Values)
//	health.go   a GPU's board health (ECC, row remapping, clock events, NVLink)
//	sample.go   NodeSample, GPUState, DeviceState, MIG layout, processes
//	units.go    the schedulable units of a sample (whole GPUs, MIG devices),
//	            listed once per sample with their health, and the lookups
//	            every reader of a sample shares
package sample
