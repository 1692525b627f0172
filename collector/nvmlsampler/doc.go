// Package nvmlsampler samples every GPU of the node through NVIDIA's NVML library:
// identity, memory, utilisation, clocks, power, temperature, PCIe, board
// health (ECC, retired pages, row remapping, clock event reasons, NVLink,
// recovery action) and the MIG layout, one goroutine per GPU so that a hung
// or lost GPU never delays the others.
//
// It fills the node's data model (collector/sample); nvml.X names NVIDIA's
// go-nvml binding (github.com/NVIDIA/go-nvml/pkg/nvml). The real library is reached
// through the narrow NVML and Device interfaces, which the simulated node
// (sim/simnode) also implements.
package nvmlsampler
