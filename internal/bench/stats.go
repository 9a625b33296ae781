package bench

import (
	"slices"
	"sort"
	"time"

	"github.com/softuvm/softuvm/trace"
)

// median is the middle of xs (the upper one of an even count), which it
// leaves in its order.
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// medianDuration is the middle of d, which it sorts.
func medianDuration(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// humanSize is trace.HumanSize, the reports' way of writing bytes.
func humanSize(n uint64) string { return trace.HumanSize(n) }
