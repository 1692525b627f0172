package fragmentation_test

import (
	"fmt"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
)

// The worked example of the package documentation.
func ExampleCompute() {
	oneG := make([]fragmentation.Placement, 7)
	for i := range oneG {
		oneG[i] = fragmentation.Placement{Start: i, Size: 1}
	}
	gpus := []fragmentation.GPU{
		{Index: 0, Healthy: true, Allocated: true, NVLinkDomain: -1, NUMANode: -1},
		{Index: 1, Healthy: true, NVLinkDomain: -1, NUMANode: -1},
		{Index: 2, Healthy: true, NVLinkDomain: -1, NUMANode: -1, MIG: &fragmentation.MIGState{
			TotalSlices: 7,
			Instances:   []fragmentation.MIGInstance{{Profile: "4g.40gb", Start: 0, Size: 4, Allocated: true}},
			Profiles: []fragmentation.MIGProfile{
				{Name: "1g.10gb", Slices: 1, Placements: oneG},
				{Name: "4g.40gb", Slices: 4, Placements: []fragmentation.Placement{{Start: 0, Size: 4}}},
			},
		}},
		{Index: 3, Healthy: false, NVLinkDomain: -1, NUMANode: -1},
	}
	shapes, err := fragmentation.ParseShapes("1:0.5,2:0.3,mig-1g.10gb:0.2")
	if err != nil {
		panic(err)
	}
	r := fragmentation.Compute(gpus, shapes)
	fmt.Printf("units: %d free, %d allocated, %d unhealthy\n", r.Free, r.Allocated, r.Unhealthy)
	fmt.Printf("unallocated: %.4f GPUs\n", r.UnallocatedGPUs)
	for _, s := range shapes {
		fmt.Printf("F(%s) = %.4f\n", s.Name, r.PerShape[s.Name])
	}
	fmt.Printf("F(M) = %.4f\n", r.Weighted)
	fmt.Printf("GPU 2: %d free slices, largest placeable %s\n", r.MIG[0].FreeSlices, r.MIG[0].LargestPlaceableProfile)
	// Output:
	// units: 1 free, 2 allocated, 1 unhealthy
	// unallocated: 1.4286 GPUs
	// F(1) = 0.4286
	// F(2) = 1.4286
	// F(mig-1g.10gb) = 1.0000
	// F(M) = 0.8429
	// GPU 2: 3 free slices, largest placeable 1g.10gb
}

func ExampleIdleTracker_Observe() {
	tr, err := fragmentation.NewIdleTracker(fragmentation.IdleConfig{Threshold: 0.05, Window: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	key := fragmentation.HolderKey{Namespace: "ml", Pod: "train-0", Container: "main", Resource: "nvidia.com/gpu", GPU: 0, GPUInstance: -1}
	start := time.Unix(0, 0)
	for i, activity := range []float64{0.01, 0.02, 0.01, 0.00, 0.01, 0.60} {
		st := tr.Observe(start.Add(time.Duration(i)*15*time.Second), []fragmentation.Observation{
			{Key: key, Activity: activity, Known: true, PodUID: "uid-1"},
		})
		fmt.Printf("t=%3ds activity=%.2f idle=%v idle_seconds=%v\n", i*15, activity, st[0].Idle, st[0].IdleSeconds)
	}
	// Output:
	// t=  0s activity=0.01 idle=false idle_seconds=0
	// t= 15s activity=0.02 idle=false idle_seconds=0
	// t= 30s activity=0.01 idle=true idle_seconds=0
	// t= 45s activity=0.00 idle=true idle_seconds=15
	// t= 60s activity=0.01 idle=true idle_seconds=30
	// t= 75s activity=0.60 idle=false idle_seconds=30
}

func ExamplePriceList_Lookup() {
	p := &fragmentation.PriceList{PerGPUHour: map[string]float64{"H100 80GB": 11.06, "A100 80GB": 5.07}}
	for _, model := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"} {
		price, ok := p.Lookup(model)
		fmt.Println(model, price, ok)
	}
	// 1g of a 7-slice H100: 11.06/7 per hour.
	fmt.Printf("%.4f\n", fragmentation.SliceShare(11.06, 1, 7))
	// Output:
	// NVIDIA H100 80GB HBM3 11.06 true
	// NVIDIA A100-SXM4-80GB 5.07 true
	// NVIDIA A100-SXM4-40GB 0 false
	// 1.5800
}
