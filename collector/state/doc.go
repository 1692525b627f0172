// Package state joins one sample of the node with everything else known
// at that moment into an immutable State: DCGM's values, who holds which
// device (the kubelet), what each container uses (process accounting), the
// derived gauges (idle allocations, prices, fragmentation), the XID
// counts, a DRA driver's device taints and the GPUs' fatal faults. It renders nothing: collector/render turns a State into the page,
// and this package never imports it.
//
// The files, in the order of the join, each using only those before it:
//
//	dcgm.go         DCGM's values and health merged into the sample, one way
//	eccwatch.go     when each GPU's uncorrected ECC count last grew
//	allocations.go  the kubelet's holdings resolved against the sample's units
//	dra.go          a DRA driver's device taints (ResourceSlices) on the
//	                sample's devices they name
//	usage.go        each unit's processes by container (process accounting)
//	derived.go      idle observations, prices and the fragmentation model's input
//	faults.go       Fault: a GPU's fatal fault, as the node condition words it
//	state.go        State: what one render shows
//	xids.go         the XID reader's counts, those of MIG devices kept with the
//	                devices the sample shows
//	faulttrack.go   a State's fatal faults, with the GPU resets that clear
//	                an XID's (across samples)
//	join.go         Joiner: one sample in, one State out, with what spans
//	                samples (idle windows, last good reads, log once)
package state
