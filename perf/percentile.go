package perf

import (
	"slices"
	"time"
)

// Percentile is the p-th (0 to 1) of ds by nearest rank, 0 for none. It
// sorts ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := min(len(ds)-1, int(float64(len(ds))*p))
	return ds[i]
}
