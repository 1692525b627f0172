package agent

import "errors"

// Exit codes (see the package comment and --help): ExitUsage only for what
// the user wrote, so that a wrapper or an operator can tell a typo, to fix,
// from a node that cannot run the exporter now, to retry or investigate.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// InputError marks an error in what the user wrote (exit 2) among start-up
// errors, which are otherwise the machine's (exit 1).
type InputError struct{ error }

// NewInputError marks err as the user's.
func NewInputError(err error) error { return InputError{err} }

func (e InputError) Unwrap() error { return e.error }

// exitCode is ExitUsage for an InputError, else ExitError.
func exitCode(err error) int {
	if errors.As(err, new(InputError)) {
		return ExitUsage
	}
	return ExitError
}
