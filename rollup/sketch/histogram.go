package sketch

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Errors of histograms and quantiles.
var (
	// ErrMalformed reports key and count arrays that are not a histogram:
	// different lengths, or a key outside [MinKey, MaxKey].
	ErrMalformed = errors.New("malformed histogram")
	// ErrEmpty reports a quantile asked of no values.
	ErrEmpty = errors.New("no values")
	// ErrQuantile reports a quantile outside [0, 1].
	ErrQuantile = errors.New("quantile outside [0, 1]")
)

// Histogram is a sparse log-bucket histogram of latencies: Counts[i] values
// had key Keys[i]. Keys are strictly increasing, no count is zero and the
// slices have the same length, as ClickHouse's sumMap returns them; build a
// Histogram from arrays of unknown shape with FromArrays. The zero value is
// an empty histogram.
type Histogram struct {
	Keys   []int16
	Counts []uint64
}

// FromArrays returns the histogram of parallel key and count arrays, as read
// from ClickHouse: it copies them, sorts them by key, sums the counts of
// equal keys and drops zero counts. It fails with ErrMalformed when the
// lengths differ or a key lies outside [MinKey, MaxKey].
func FromArrays(keys []int16, counts []uint64) (Histogram, error) {
	if len(keys) != len(counts) {
		return Histogram{}, fmt.Errorf("%w: %d keys, %d counts", ErrMalformed, len(keys), len(counts))
	}
	if isHistogram(keys, counts) { // as stored: copy, no sort
		return Histogram{Keys: slices.Clone(keys), Counts: slices.Clone(counts)}, nil
	}
	type bucket struct {
		key   int16
		count uint64
	}
	buckets := make([]bucket, 0, len(keys))
	for i, k := range keys {
		if k < MinKey || k > MaxKey {
			return Histogram{}, fmt.Errorf("%w: key %d outside [%d, %d]", ErrMalformed, k, MinKey, MaxKey)
		}
		if counts[i] != 0 {
			buckets = append(buckets, bucket{k, counts[i]})
		}
	}
	slices.SortFunc(buckets, func(a, b bucket) int { return cmp.Compare(a.key, b.key) })
	var h Histogram
	for _, b := range buckets {
		if n := len(h.Keys); n > 0 && h.Keys[n-1] == b.key {
			h.Counts[n-1] += b.count
			continue
		}
		h.Keys = append(h.Keys, b.key)
		h.Counts = append(h.Counts, b.count)
	}
	return h, nil
}

// isHistogram reports whether keys are strictly increasing within [MinKey,
// MaxKey] and no count is zero.
func isHistogram(keys []int16, counts []uint64) bool {
	for i, k := range keys {
		if k < MinKey || k > MaxKey || counts[i] == 0 || (i > 0 && k <= keys[i-1]) {
			return false
		}
	}
	return true
}

// Add counts the latency v (ms) in the bucket Key(v).
func (h *Histogram) Add(v float64) {
	k := Key(v)
	i, found := slices.BinarySearch(h.Keys, k)
	if found {
		h.Counts[i]++
		return
	}
	h.Keys = slices.Insert(h.Keys, i, k)
	h.Counts = slices.Insert(h.Counts, i, 1)
}

// Merge adds the counts of o to h, as sumMap does in ClickHouse: the result
// is the histogram of both histograms' values. h does not share memory with
// o afterwards.
func (h *Histogram) Merge(o Histogram) {
	if len(o.Keys) == 0 {
		return
	}
	if len(h.Keys) == 0 {
		h.Keys, h.Counts = slices.Clone(o.Keys), slices.Clone(o.Counts)
		return
	}
	n := len(h.Keys) + len(o.Keys)
	keys, counts := make([]int16, 0, n), make([]uint64, 0, n)
	i, j := 0, 0
	for i < len(h.Keys) && j < len(o.Keys) {
		switch a, b := h.Keys[i], o.Keys[j]; {
		case a < b:
			keys, counts = append(keys, a), append(counts, h.Counts[i])
			i++
		case a > b:
			keys, counts = append(keys, b), append(counts, o.Counts[j])
			j++
		default:
			keys, counts = append(keys, a), append(counts, h.Counts[i]+o.Counts[j])
			i++
			j++
		}
	}
	keys, counts = append(keys, h.Keys[i:]...), append(counts, h.Counts[i:]...)
	keys, counts = append(keys, o.Keys[j:]...), append(counts, o.Counts[j:]...)
	h.Keys, h.Counts = keys, counts
}

// Count returns the number of values in h.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Quantile returns the estimate of quantile q (0 ≤ q ≤ 1) of h's values:
// the Value of the bucket holding the value of nearest rank ⌈q·n⌉ (see the
// package comment), within α of ExactQuantile of the same values. It fails
// with ErrEmpty when h has no values and ErrQuantile when q is outside
// [0, 1].
func (h *Histogram) Quantile(q float64) (float64, error) {
	v, err := h.Quantiles(q)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// Quantiles returns the estimates of the quantiles qs, in the order given,
// in one pass over h: Quantiles(0.5, 0.9, 0.95, 0.99) gives p50, p90, p95
// and p99. It fails as Quantile does.
func (h *Histogram) Quantiles(qs ...float64) ([]float64, error) {
	for _, q := range qs {
		if !(q >= 0 && q <= 1) {
			return nil, fmt.Errorf("%w: %v", ErrQuantile, q)
		}
	}
	n := h.Count()
	if n == 0 {
		return nil, ErrEmpty
	}
	// Visit the quantiles in increasing order, so that one walk up the
	// cumulative counts serves them all.
	order := make([]int, len(qs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(qs[a], qs[b]) })
	out := make([]float64, len(qs))
	i, below := 0, uint64(0) // bucket i holds the values of ranks below+1 .. below+Counts[i]
	for _, j := range order {
		r := Rank(qs[j], n)
		for below+h.Counts[i] < r {
			below += h.Counts[i]
			i++
		}
		out[j] = Value(h.Keys[i])
	}
	return out, nil
}
