//go:build !(cgo && linux) || nodcgm

package dcgm

import (
	"errors"
	"strings"
	"testing"
)

// TestBuiltWithoutDCGM: a build without go-dcgm (no cgo, or make run's
// nodcgm tag) finds no library in every mode that would load it, and says
// why; off stays off.
func TestBuiltWithoutDCGM(t *testing.T) {
	for _, mode := range []Mode{ModeAuto, ModeEmbedded, ModeStandalone} {
		c, err := DefaultOpen(Config{Mode: mode, HostEngine: "localhost:5555"})
		if c != nil || !errors.Is(err, ErrLibraryNotFound) {
			t.Errorf("mode %s: got (%v, %v), want ErrLibraryNotFound", mode, c, err)
			continue
		}
		if !strings.Contains(err.Error(), "built without DCGM support") {
			t.Errorf("mode %s: %q does not say the binary was built without DCGM", mode, err)
		}
	}
	if _, err := DefaultOpen(Config{Mode: ModeOff}); !errors.Is(err, ErrDisabled) {
		t.Errorf("mode off: %v, want ErrDisabled", err)
	}
}
