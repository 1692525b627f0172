//go:build !(cgo && linux) || nodcgm

package dcgm

import "fmt"

// Without cgo (or off Linux) go-dcgm cannot be linked, and a build with the
// nodcgm tag leaves it out on purpose (the simulated node's quick build:
// its DCGM is sim/fakedcgm): DCGM is unavailable, and auto mode turns it
// off.
func openReal(cfg Config, standalone bool, addr, isSocket string) (Client, error) {
	return nil, fmt.Errorf("%w: this binary was built without DCGM support (without cgo, or with the nodcgm tag); the gpu-pool-exporter binary of the image has it", ErrLibraryNotFound)
}
