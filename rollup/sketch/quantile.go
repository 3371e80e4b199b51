package sketch

import (
	"fmt"
	"math"
)

// ExactQuantile returns quantile q (0 ≤ q ≤ 1) of values sorted in
// increasing order: the value of nearest rank ⌈q·n⌉, sorted[Rank(q, n)−1].
// It is the reference that Histogram.Quantile estimates, and the exact
// quantile of raw rows. It fails with ErrEmpty when sorted is empty and
// ErrQuantile when q is outside [0, 1].
//
// ClickHouse's quantileExact ranks differently, ⌊q·n⌋+1 (its p50 of 4
// values is the 3rd), so exact quantiles of raw rows come from the sorted
// values (groupArray) through this function, not from quantileExact.
func ExactQuantile(sorted []float64, q float64) (float64, error) {
	if !(q >= 0 && q <= 1) {
		return 0, fmt.Errorf("%w: %v", ErrQuantile, q)
	}
	if len(sorted) == 0 {
		return 0, ErrEmpty
	}
	return sorted[Rank(q, uint64(len(sorted)))-1], nil
}

// Rank returns the 1-based nearest rank of quantile q (0 ≤ q ≤ 1) among
// n > 0 values: ⌈q·n⌉, at least 1 and at most n. It corrects the binary rounding of q·n,
// so that the rank of a decimal quantile is the decimal one: q = 0.07 of
// n = 100 is rank 7, although 0.07·100 is 7.000000000000001 in float64.
// Precisely, it is the smallest r ≥ 1 whose float64 quotient r/n is ≥ q.
func Rank(q float64, n uint64) uint64 {
	fn := float64(n)
	r := uint64(max(math.Ceil(q*fn), 1))
	if r > 1 && float64(r-1)/fn >= q {
		r--
	} else if r < n && float64(r)/fn < q {
		r++
	}
	return min(r, n)
}
