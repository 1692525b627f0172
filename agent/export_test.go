package agent

import (
	"io"

	"github.com/alecthomas/kingpin/v2"
)

// FlagApp is the command line's application with sim's flags, for tests
// that walk every flag.
func FlagApp(sim Simulation) *kingpin.Application {
	app, _, _ := newFlags(io.Discard, io.Discard, sim)
	return app
}
