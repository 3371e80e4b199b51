// Package sketch owns tokenmeter's latency distributions: the log-bucket
// mapping of a latency to a histogram key (DDSketch-style, relative accuracy
// 1%), the sparse histogram that rollups store and merge, quantiles from it,
// and the exact nearest-rank quantile it is measured against.
//
// # Buckets
//
// Latencies are in milliseconds. With γ = (1+α)/(1−α) = 1.01/0.99, bucket k
// holds the values in (γ^(k−1), γ^k], so
//
//	Key(v) = ⌈ln v / ln γ⌉
//
// and Value(k) = 2γ^k/(γ+1) is within α of every value in the bucket. Keys
// are clamped to [MinKey, MaxKey]: every value ≤ MinValue (1 µs) — zero,
// negative values and NaN included — has key MinKey, and every value ≥
// MaxValue (10^10 ms, about 116 days) has key MaxKey. The range holds 1,498
// keys, far inside Int16, and reaches well beyond the 24 h bound that ingest
// validation puts on latencies by default.
//
// # Storage
//
// A histogram is two parallel arrays, keys Array(Int16) and counts
// Array(UInt64), sorted by key and without zero counts: the shape that
// ClickHouse's sumMap returns, so histograms merge exactly with
// sumMap(keys, counts) over any range and grouping. Histogram holds one in
// Go, adds to it, merges it and reads quantiles from it; internal/adapter/chstore
// holds the SQL that computes the same keys and histograms, and merges
// stored ones, inside ClickHouse.
//
// # Quantiles
//
// A quantile q of n values is the value of nearest rank r = ⌈q·n⌉ (1-based,
// at least 1): p50 of 4 values is the 2nd smallest. ExactQuantile gives it
// from sorted raw values; Histogram.Quantile gives the Value of the bucket
// holding the value of rank r, hence within α of ExactQuantile for values in
// [MinValue, MaxValue].
//
// The package holds no SQL, does not query ClickHouse or own table schemas
// (that is internal/adapter/chstore), and does not decide which requests enter a
// distribution (that is the rollup job, per ARCHITECTURE "Latency
// definitions").
package sketch

import "math"

// RelativeAccuracy is α: a histogram's quantile is within this relative
// error of the exact quantile.
const RelativeAccuracy = 0.01

// Gamma is γ = (1+α)/(1−α), the ratio of consecutive bucket bounds. Its
// float64 value equals the one ClickHouse computes for 1.01 / 0.99.
const Gamma = (1 + RelativeAccuracy) / (1 - RelativeAccuracy)

// The key range. Values ≤ MinValue map to MinKey, values ≥ MaxValue to
// MaxKey; MinKey = Key(MinValue) and MaxKey = Key(MaxValue).
const (
	// MinValue is 1 µs in milliseconds: every value up to it, zero
	// included, has the lowest key.
	MinValue = 1e-3
	// MaxValue is 10^10 ms, about 116 days.
	MaxValue = 1e10

	MinKey int16 = -345
	MaxKey int16 = 1152
)

// lnGamma is ln γ as math.Log computes it (internal/adapter/chstore's SQL divides
// by the same float64).
var lnGamma = math.Log(Gamma)

// Key returns the key of the bucket holding the latency v (ms):
// ⌈ln v / ln γ⌉, clamped to [MinKey, MaxKey]. NaN and every value ≤
// MinValue, zero and negative ones included, map to MinKey; +Inf and every
// value ≥ MaxValue map to MaxKey. internal/adapter/chstore computes the same in
// ClickHouse.
func Key(v float64) int16 {
	switch {
	case !(v > MinValue): // NaN too
		return MinKey
	case v >= MaxValue:
		return MaxKey
	}
	// ln v = e·ln 2 + ln(1 + j/256) + ln(1 + r), for v = m·2^e with m in
	// [1 + j/256, 1 + (j+1)/256) and 1 + r = m / (1 + j/256): a table and
	// a short series instead of math.Log (4 of them per event were a tenth
	// of the hour rollup's CPU). Its error, below 1e-12 of a key, decides
	// the key unless ln v / ln γ is that close to a whole number; those
	// (about one value in 10^8) take math.Log's key.
	b := math.Float64bits(v)
	j := b >> (52 - 8) & 255
	r := math.Float64frombits(b&(1<<52-1)|1023<<52)*logTable.inv[j] - 1
	ln := float64(int(b>>52)-1023)*math.Ln2 + logTable.ln[j] +
		r*(1-r*(1.0/2-r*(1.0/3-r*(1.0/4-r*(1.0/5)))))
	f := ln * logTable.perLnGamma
	k := math.Ceil(f)
	if d := k - f; d < 1e-9 || d > 1-1e-9 {
		return int16(math.Ceil(math.Log(v) / lnGamma))
	}
	return int16(k)
}

// logTable holds ln(1 + j/256) and 1 / (1 + j/256) for Key, and 1 / ln γ.
var logTable = func() (t struct {
	ln, inv    [256]float64
	perLnGamma float64
}) {
	for j := range 256 {
		t.ln[j] = math.Log(1 + float64(j)/256)
		t.inv[j] = 1 / (1 + float64(j)/256)
	}
	t.perLnGamma = 1 / lnGamma
	return t
}()

// Value returns the estimate of the values in bucket k: 2γ^k/(γ+1), within
// α of every value in (γ^(k−1), γ^k]. For MinKey it is about 1 µs, the
// estimate of every clamped value below (zero included); for MaxKey about
// MaxValue.
func Value(k int16) float64 {
	return 2 * math.Pow(Gamma, float64(k)) / (Gamma + 1)
}

// LowerBound returns the exclusive lower bound of the values with key k:
// γ^(k−1), or 0 for MinKey (which also counts zero, negative values and
// NaN).
func LowerBound(k int16) float64 {
	if k <= MinKey {
		return 0
	}
	return math.Pow(Gamma, float64(k)-1)
}

// UpperBound returns the inclusive upper bound of the values with key k:
// γ^k, or +Inf for MaxKey.
func UpperBound(k int16) float64 {
	if k >= MaxKey {
		return math.Inf(1)
	}
	return math.Pow(Gamma, float64(k))
}
