// Package fragmentation computes, for one Kubernetes GPU node, how much of the
// node's unallocated GPU capacity is usable by the jobs the cluster actually
// runs, how long allocated devices have sat idle, and what they cost.
//
// Everything here is pure: the caller (the exporter's collector) gathers the
// node's devices, holders and activity, and turns the results into metrics
// (gpu_free_devices_largest_group, gpu_mig_free_slices,
// gpu_fragmentation_gpus, gpu_allocation_idle, gpu_price_dollars_per_hour, ...).
// No function here does I/O except [LoadPriceList].
//
// # Schedulable units
//
// A schedulable unit is what the device plugin hands to a pod: a whole GPU
// when MIG is off, a MIG instance when MIG is on. [Result.Free],
// [Result.Allocated] and [Result.Unhealthy] count units; every unit of an
// unhealthy GPU is unhealthy. A MIG GPU with no instances has no units, nor
// has a GPU instance without compute instances.
//
// # Unallocated capacity R_g
//
// R_g is the fraction of GPU g that no holder has:
//
//   - unhealthy GPU: 0 (nothing can be scheduled there);
//   - whole GPU (MIG off): 1 when free, 0 when allocated;
//   - MIG GPU: (slices not covered by an allocated instance) / TotalSlices,
//     that is free slices plus the slices of existing but unallocated
//     instances (an instance without compute instances included: no task
//     can use it, so its slices count as fragmentation for every shape).
//
// The node's unallocated capacity is sum_g R_g ([Result.UnallocatedGPUs]).
//
// # Fragmentation (Weng et al., USENIX ATC'23)
//
// "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
// Fragmentation Gradient Descent" defines, for a task shape m and a node n,
// F_n(m) as the node's unallocated GPU capacity that m cannot use:
//
//   - if m cannot be placed on n at all, all of it: sum_g R_g;
//   - otherwise the sum of R_g over the GPUs g that cannot serve m.
//
// A task of k whole GPUs demands D_m = 1 on each of k GPUs: GPU g can serve
// it iff R_g >= 1, i.e. it is a healthy, free, non-MIG GPU (a MIG GPU cannot
// take a whole-GPU request even when all its slices are free), and m fits
// iff at least k GPUs can serve it. Topology is deliberately not part of the
// test, as in the paper; [Result.LargestFreeGroup] reports it separately.
//
// A MIG task of profile P demands D_m = P's slices / TotalSlices on one GPU.
// Because MIG capacity is not fungible (a free 3g instance cannot run a 1g
// task), GPU g can serve it iff g is a healthy MIG GPU that has an
// unallocated existing instance of profile P with a compute instance (a
// GPU instance created without one has no MIG device to hand out) or a
// free placement for P
// (all slices of one of the placements NVML lists for P are uncovered by
// existing instances). m fits iff some GPU can serve it.
//
// The popularity-weighted measure is
//
//	F_n(M) = sum_m w_m * F_n(m) / sum_m w_m
//
// ([Result.Weighted]); the cluster's fragmentation is the sum over nodes,
// which Prometheus recording rules compute from the per-node series.
//
// # Worked example
//
// A node with four GPUs, 7-slice MIG geometry on GPU 2:
//
//	GPU 0  whole, allocated                          R = 0
//	GPU 1  whole, free                               R = 1
//	GPU 2  MIG, one allocated 4g.40gb at slices 0-3  R = 3/7 (slices 4, 5, 6 free)
//	GPU 3  unhealthy                                 R = 0
//
// Unallocated capacity: 1 + 3/7 = 10/7 ≈ 1.4286 GPUs. With shapes
// "1" (weight 0.5), "2" (0.3) and "mig-1g.10gb" (0.2):
//
//	"1":            GPU 1 serves it, so it fits; GPU 2 cannot serve a whole-GPU
//	                task, so F = R_2 = 3/7 ≈ 0.4286.
//	"2":            only one GPU has R >= 1, so it does not fit: F = 10/7 ≈ 1.4286.
//	"mig-1g.10gb":  GPU 2 has free 1g placements at slices 4, 5 and 6, so it
//	                fits; GPU 1 cannot serve a MIG task: F = R_1 = 1.
//	F_n(M) = (0.5*3/7 + 0.3*10/7 + 0.2*1) / (0.5+0.3+0.2) = 5.9/7 ≈ 0.8429.
//
// The node has one free GPU and three free slices, yet on average about 0.84
// GPUs of it are useless to the next arriving task.
//
// # MIG slots
//
// MIG placements come from NVML (nvmlDeviceGetGpuInstancePossiblePlacements):
// a start and a size in slots. The slot space can be wider than the compute
// slices: on A100/H100, TotalSlices is 7 but NVML's slot space is 8 wide
// (3g placements have size 4 and 7g size 8); an RTX PRO 6000 has 4 compute
// slices on 12 slots (1g at {0,3,6,9}:3, 2g at {0,6}:6, 4g at {0}:12). This
// package treats slots as a bitmap: an existing instance covers
// [Start, Start+Size) and a placement is free iff none of its slots is
// covered. The free-slice count is compute slices: TotalSlices less the
// slices of the existing instances (MIGInstance.Slices, else their
// profile's). Slots at 64 and above are not modelled.
//
// # Idle allocations
//
// [IdleTracker] follows each holder (namespace, pod, container, resource,
// device) from sample to sample and reports it idle once its device's
// activity stayed below a threshold for a whole window; see [IdleTracker.Observe].
//
// # Prices
//
// [PriceList] maps NVML model names to on-demand US dollars per GPU-hour,
// loaded from a strict YAML file ([LoadPriceList]) or a flag
// ([ParsePriceFlag]); [SliceShare] prices a MIG instance by its share of
// slices.
package fragmentation
