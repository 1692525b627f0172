//go:build !(cgo && linux)

package dcgm

import "fmt"

// Without cgo (or off Linux) go-dcgm cannot be linked: DCGM is unavailable,
// and auto mode turns it off.
func openReal(cfg Config, standalone bool, addr, isSocket string) (Client, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo", ErrLibraryNotFound)
}
