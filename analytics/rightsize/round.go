package rightsize

import "math"

func roundTo(v float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(v*p) / p
}

// roundedPtr is a copy of *v rounded, or nil.
func roundedPtr(v *float64, decimals int) *float64 {
	if v == nil {
		return nil
	}
	r := roundTo(*v, decimals)
	return &r
}

func ptr(v float64) *float64 { return &v }
