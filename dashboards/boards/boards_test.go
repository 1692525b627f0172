package boards

import (
	"errors"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// TestDashboardsUnmarshalStrictly reads the generated JSON back with the
// SDK's strict decoder: no unknown or mistyped fields.
func TestDashboardsUnmarshalStrictly(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	files, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		var d dashboard.Dashboard
		if err := d.UnmarshalJSONStrict(data); err != nil {
			// The SDK returns an empty, non-nil cog.BuildErrors on success.
			var be cog.BuildErrors
			if !errors.As(err, &be) || len(be) > 0 {
				t.Errorf("%s: %v", name, err)
			}
		}
		if d.Uid == nil || *d.Uid == "" {
			t.Errorf("%s: no uid", name)
		}
	}
}
