package sketch

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// percentiles are the quantiles tokenmeter reports (ARCHITECTURE "Latency
// definitions"), with the minimum and p99.9 besides.
var percentiles = []float64{0, 0.5, 0.9, 0.95, 0.99, 0.999}

func histogramOf(values []float64) Histogram {
	var h Histogram
	for _, v := range values {
		h.Add(v)
	}
	return h
}

func TestFromArrays(t *testing.T) {
	tests := []struct {
		name   string
		keys   []int16
		counts []uint64
		want   Histogram
	}{
		{"empty", nil, nil, Histogram{}},
		{"empty arrays", []int16{}, []uint64{}, Histogram{}},
		{"only zero counts", []int16{3, 4}, []uint64{0, 0}, Histogram{}},
		{"sorted", []int16{-2, 0, 7}, []uint64{1, 2, 3}, Histogram{Keys: []int16{-2, 0, 7}, Counts: []uint64{1, 2, 3}}},
		{"unsorted", []int16{7, -2, 0}, []uint64{3, 1, 2}, Histogram{Keys: []int16{-2, 0, 7}, Counts: []uint64{1, 2, 3}}},
		{"duplicates", []int16{5, 1, 5, 1, 5}, []uint64{1, 2, 3, 4, 5}, Histogram{Keys: []int16{1, 5}, Counts: []uint64{6, 9}}},
		{"zero counts", []int16{1, 2, 3}, []uint64{4, 0, 6}, Histogram{Keys: []int16{1, 3}, Counts: []uint64{4, 6}}},
		{"range ends", []int16{MaxKey, MinKey}, []uint64{1, 1}, Histogram{Keys: []int16{MinKey, MaxKey}, Counts: []uint64{1, 1}}},
	}
	for _, tt := range tests {
		got, err := FromArrays(tt.keys, tt.counts)
		if err != nil {
			t.Errorf("%s: FromArrays(%v, %v): %v", tt.name, tt.keys, tt.counts, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: FromArrays(%v, %v) mismatch (-want +got):\n%s", tt.name, tt.keys, tt.counts, diff)
		}
	}
}

func TestFromArraysCopies(t *testing.T) {
	// Unsorted arrays, and arrays already shaped as stored.
	for _, in := range []Histogram{{Keys: []int16{2, 1}, Counts: []uint64{5, 6}}, {Keys: []int16{1, 2}, Counts: []uint64{6, 5}}} {
		keys, counts := slices.Clone(in.Keys), slices.Clone(in.Counts)
		h, err := FromArrays(keys, counts)
		if err != nil {
			t.Fatal(err)
		}
		h.Counts[0]++
		h.Add(1)
		if diff := cmp.Diff(in.Keys, keys); diff != "" {
			t.Errorf("FromArrays changed its keys (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(in.Counts, counts); diff != "" {
			t.Errorf("FromArrays changed its counts (-want +got):\n%s", diff)
		}
	}
}

func TestMerger(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var m Merger
	for round := range 3 {
		var want Histogram
		for range 50 {
			h := histogramOf(sample(distribution{"log-normal", logNormal(200, 1.5)}, rng.Uint64(), 1+rng.IntN(40)))
			want.Merge(h)
			m.Add(h)
		}
		m.AddKey(MinKey, 0) // a zero count adds no bucket
		m.AddKey(MaxKey, 2)
		want.Merge(Histogram{Keys: []int16{MaxKey}, Counts: []uint64{2}})
		got := m.Take()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: Merger differs from Merge (-want +got):\n%s", round, diff)
		}
	}
	if got := m.Take(); len(got.Keys) != 0 || len(got.Counts) != 0 {
		t.Errorf("Take after Take = %+v, want empty", got)
	}
}

// TestMergerAnyKeys checks the Merger over the whole key range, the range's
// ends and neighbouring keys of its bitmap words included, with single keys
// and histograms added in any mix and sums taken of every size (none, one
// bucket, every bucket).
func TestMergerAnyKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var m Merger
	randomKey := func() int16 {
		switch rng.IntN(4) {
		case 0: // an end of the range, or next to one
			return []int16{MinKey, MinKey + 1, MaxKey - 1, MaxKey}[rng.IntN(4)]
		case 1: // a word boundary of the bitmap (keys 64 apart from MinKey)
			n := int(MaxKey-MinKey) + 1
			return MinKey + int16((64*rng.IntN(24)-rng.IntN(2)+n)%n)
		}
		return MinKey + int16(rng.IntN(int(MaxKey-MinKey)+1))
	}
	for round := range 200 {
		var want Histogram
		for range rng.IntN(6) {
			if rng.IntN(2) == 0 {
				k, n := randomKey(), uint64(rng.IntN(3)) // n = 0 adds no bucket
				m.AddKey(k, n)
				if n > 0 {
					want.Merge(Histogram{Keys: []int16{k}, Counts: []uint64{n}})
				}
				continue
			}
			keys := map[int16]uint64{}
			for range rng.IntN(50) {
				keys[randomKey()] += uint64(1 + rng.IntN(1000))
			}
			var h Histogram
			for _, k := range slices.Sorted(func(yield func(int16) bool) {
				for k := range keys {
					if !yield(k) {
						return
					}
				}
			}) {
				h.Keys, h.Counts = append(h.Keys, k), append(h.Counts, keys[k])
			}
			m.Add(h)
			want.Merge(h)
		}
		if round%50 == 49 { // every bucket
			for k := MinKey; k <= MaxKey; k++ {
				m.AddKey(k, 1)
				want.Merge(Histogram{Keys: []int16{k}, Counts: []uint64{1}})
			}
		}
		got := m.Take()
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round %d: Merger differs from Merge (-want +got):\n%s", round, diff)
		}
	}
}

func TestFromArraysErrors(t *testing.T) {
	tests := []struct {
		name   string
		keys   []int16
		counts []uint64
	}{
		{"more keys", []int16{1, 2}, []uint64{1}},
		{"more counts", []int16{1}, []uint64{1, 2}},
		{"key below the range", []int16{MinKey - 1}, []uint64{1}},
		{"key above the range", []int16{0, MaxKey + 1}, []uint64{1, 1}},
	}
	for _, tt := range tests {
		if _, err := FromArrays(tt.keys, tt.counts); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: FromArrays(%v, %v) error %v, want %v", tt.name, tt.keys, tt.counts, err, ErrMalformed)
		}
	}
}

func TestAdd(t *testing.T) {
	values := []float64{1000, 1, 0, 1000, math.NaN(), 1, 1e12, 1, 0.5}
	want := Histogram{
		Keys:   []int16{MinKey, Key(0.5), 0, Key(1000), MaxKey},
		Counts: []uint64{2, 1, 3, 2, 1},
	}
	if diff := cmp.Diff(want, histogramOf(values)); diff != "" {
		t.Errorf("histogram of %v mismatch (-want +got):\n%s", values, diff)
	}
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name string
		a, b Histogram
		want Histogram
	}{
		{"both empty", Histogram{}, Histogram{}, Histogram{}},
		{"into empty", Histogram{}, Histogram{Keys: []int16{1}, Counts: []uint64{2}}, Histogram{Keys: []int16{1}, Counts: []uint64{2}}},
		{"empty into", Histogram{Keys: []int16{1}, Counts: []uint64{2}}, Histogram{}, Histogram{Keys: []int16{1}, Counts: []uint64{2}}},
		{
			"interleaved",
			Histogram{Keys: []int16{-3, 1, 4, 9}, Counts: []uint64{1, 2, 3, 4}},
			Histogram{Keys: []int16{-5, 1, 5, 9, 12}, Counts: []uint64{10, 20, 30, 40, 50}},
			Histogram{Keys: []int16{-5, -3, 1, 4, 5, 9, 12}, Counts: []uint64{10, 1, 22, 3, 30, 44, 50}},
		},
	}
	for _, tt := range tests {
		got := Histogram{Keys: slices.Clone(tt.a.Keys), Counts: slices.Clone(tt.a.Counts)}
		got.Merge(tt.b)
		if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: merge mismatch (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestMergeDoesNotAlias(t *testing.T) {
	o := Histogram{Keys: []int16{1}, Counts: []uint64{1}}
	var h Histogram
	h.Merge(o)
	h.Add(1)
	if o.Counts[0] != 1 {
		t.Errorf("Merge shares counts with its argument: adding to the result changed it to %d", o.Counts[0])
	}
}

func TestRank(t *testing.T) {
	tests := []struct {
		q    float64
		n    uint64
		want uint64
	}{
		{0, 1, 1},
		{1, 1, 1},
		{0, 4, 1},
		{0.25, 4, 1},
		{0.26, 4, 2},
		{0.5, 4, 2},
		{0.51, 4, 3},
		{1, 4, 4},
		{0.99, 100, 99},
		{0.999, 100, 100},
		{0.07, 100, 7}, // 0.07·100 = 7.000000000000001 in float64
		{0.95, 20, 19},
		{0.5, 1_000_001, 500_001},
		{0.9, 10, 9},
		{0.3, 10, 3},
		{1e-9, 1000, 1},
	}
	for _, tt := range tests {
		if got := Rank(tt.q, tt.n); got != tt.want {
			t.Errorf("Rank(%v, %d) = %d, want %d", tt.q, tt.n, got, tt.want)
		}
	}
}

// TestRankDecimal checks that the rank of every decimal quantile k/n with
// k = 1..n is k, for n up to 1000.
func TestRankDecimal(t *testing.T) {
	for n := uint64(1); n <= 1000; n++ {
		for k := uint64(1); k <= n; k++ {
			if got := Rank(float64(k)/float64(n), n); got != k {
				t.Fatalf("Rank(%d/%d, %d) = %d, want %d", k, n, n, got, k)
			}
		}
	}
}

func TestExactQuantile(t *testing.T) {
	four := []float64{10, 20, 30, 40}
	tests := []struct {
		sorted []float64
		q      float64
		want   float64
	}{
		{four, 0, 10},
		{four, 0.25, 10},
		{four, 0.5, 20}, // nearest rank: p50 of 4 values is the 2nd
		{four, 0.75, 30},
		{four, 0.9, 40},
		{four, 1, 40},
		{[]float64{7}, 0.5, 7},
	}
	for _, tt := range tests {
		got, err := ExactQuantile(tt.sorted, tt.q)
		if err != nil || got != tt.want {
			t.Errorf("ExactQuantile(%v, %v) = %v, %v, want %v", tt.sorted, tt.q, got, err, tt.want)
		}
	}
}

func TestQuantileErrors(t *testing.T) {
	one := histogramOf([]float64{5})
	tests := []struct {
		name string
		h    Histogram
		raw  []float64
		q    float64
		want error
	}{
		{"empty", Histogram{}, nil, 0.5, ErrEmpty},
		{"below 0", one, []float64{5}, -0.1, ErrQuantile},
		{"above 1", one, []float64{5}, 1.1, ErrQuantile},
		{"NaN", one, []float64{5}, math.NaN(), ErrQuantile},
		{"percent, not fraction", one, []float64{5}, 99, ErrQuantile},
	}
	for _, tt := range tests {
		if _, err := tt.h.Quantile(tt.q); !errors.Is(err, tt.want) {
			t.Errorf("%s: Quantile(%v) error %v, want %v", tt.name, tt.q, err, tt.want)
		}
		if _, err := tt.h.Quantiles(0.5, tt.q); !errors.Is(err, tt.want) {
			t.Errorf("%s: Quantiles(0.5, %v) error %v, want %v", tt.name, tt.q, err, tt.want)
		}
		if _, err := ExactQuantile(tt.raw, tt.q); !errors.Is(err, tt.want) {
			t.Errorf("%s: ExactQuantile(%v) error %v, want %v", tt.name, tt.q, err, tt.want)
		}
	}
}

func TestQuantileSmall(t *testing.T) {
	h := histogramOf([]float64{40, 10, 30, 20})
	tests := []struct {
		q    float64
		want float64
	}{
		{0, Value(Key(10))},
		{0.5, Value(Key(20))},
		{0.75, Value(Key(30))},
		{1, Value(Key(40))},
	}
	for _, tt := range tests {
		got, err := h.Quantile(tt.q)
		if err != nil || got != tt.want {
			t.Errorf("Quantile(%v) = %v, %v, want %v", tt.q, got, err, tt.want)
		}
	}
	// Quantiles answers in the order asked, whatever it is.
	got, err := h.Quantiles(1, 0, 0.5, 0.5, 0.75)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{Value(Key(40)), Value(Key(10)), Value(Key(20)), Value(Key(20)), Value(Key(30))}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Quantiles(1, 0, 0.5, 0.5, 0.75) mismatch (-want +got):\n%s", diff)
	}
}

// distribution draws synthetic latencies (ms) from rng.
type distribution struct {
	name string
	draw func(rng *rand.Rand) float64
}

func logNormal(median, sigma float64) func(*rand.Rand) float64 {
	return func(rng *rand.Rand) float64 { return median * math.Exp(sigma*rng.NormFloat64()) }
}

var distributions = []distribution{
	// TTFT-like: median 200 ms, p99 about 1.3 s.
	{"log-normal", logNormal(200, 0.8)},
	// Fast cache hits and slow cold requests, two decades apart.
	{"bimodal", func(rng *rand.Rand) float64 {
		if rng.Float64() < 0.7 {
			return logNormal(50, 0.3)(rng)
		}
		return logNormal(5000, 0.5)(rng)
	}},
	// Pareto with x_m = 10 ms and shape 1.2: infinite variance.
	{"pareto", func(rng *rand.Rand) float64 { return 10 / math.Pow(1-rng.Float64(), 1/1.2) }},
	// Sub-millisecond values down to 1 µs, as ITL of cached or batched
	// decoding can be.
	{"log-uniform µs..s", func(rng *rand.Rand) float64 { return MinValue * math.Pow(1e6, rng.Float64()) }},
}

func sample(d distribution, seed uint64, n int) []float64 {
	rng := rand.New(rand.NewPCG(seed, 0x7e4e))
	values := make([]float64, n)
	for i := range values {
		values[i] = d.draw(rng)
	}
	return values
}

// checkQuantiles compares the histogram's percentiles with the exact ones
// of values and returns their relative errors, as text, and the largest.
func checkQuantiles(t *testing.T, name string, h Histogram, values []float64) (string, float64) {
	t.Helper()
	sorted := slices.Sorted(slices.Values(values))
	got, err := h.Quantiles(percentiles...)
	if err != nil {
		t.Fatalf("%s: Quantiles: %v", name, err)
	}
	var maxErr float64
	var report strings.Builder
	for i, q := range percentiles {
		want, err := ExactQuantile(sorted, q)
		if err != nil {
			t.Fatalf("%s: ExactQuantile(%v): %v", name, q, err)
		}
		e := relErr(got[i], want)
		maxErr = max(maxErr, e)
		fmt.Fprintf(&report, " q%v %.5f", q, e)
		if e > RelativeAccuracy+edgeTolerance {
			t.Errorf("%s: q%v = %v, exact %v: relative error %.5f, want ≤ %v", name, q, got[i], want, e, RelativeAccuracy)
		}
	}
	return report.String(), maxErr
}

func TestQuantileAccuracy(t *testing.T) {
	const n = 200_000
	for i, d := range distributions {
		values := sample(d, uint64(i+1), n)
		h := histogramOf(values)
		if got := h.Count(); got != n {
			t.Errorf("%s: Count() = %d, want %d", d.name, got, n)
		}
		errs, maxErr := checkQuantiles(t, d.name, h, values)
		t.Logf("%-18s n=%d buckets=%d max relative error %.5f:%s", d.name, n, len(h.Keys), maxErr, errs)
	}
}

// TestMergeMany merges the hourly histograms of 50 tenants over a day, in
// shuffled order, and checks that the result is the histogram of all the
// values and gives their quantiles within α.
func TestMergeMany(t *testing.T) {
	const hours, tenants, perPart = 24, 50, 100
	var all []float64
	var parts []Histogram
	for h := range hours {
		for tn := range tenants {
			d := distributions[(h+tn)%len(distributions)]
			values := sample(d, uint64(h*tenants+tn+100), perPart+tn) // uneven sizes
			all = append(all, values...)
			parts = append(parts, histogramOf(values))
		}
	}
	rand.New(rand.NewPCG(9, 9)).Shuffle(len(parts), func(i, j int) { parts[i], parts[j] = parts[j], parts[i] })
	var merged Histogram
	for _, p := range parts {
		merged.Merge(p)
	}
	if diff := cmp.Diff(histogramOf(all), merged); diff != "" {
		t.Errorf("merge of %d histograms differs from the histogram of all %d values (-want +got):\n%s", len(parts), len(all), diff)
	}
	errs, maxErr := checkQuantiles(t, "merged", merged, all)
	t.Logf("merged %d histograms, %d values, %d buckets: max relative error %.5f:%s", len(parts), len(all), len(merged.Keys), maxErr, errs)
}

func BenchmarkAdd(b *testing.B) {
	values := sample(distributions[0], 1, 1<<16)
	var h Histogram
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		h.Add(values[i&(len(values)-1)])
		i++
	}
}

func BenchmarkKey(b *testing.B) {
	values := sample(distributions[0], 1, 1<<16)
	var sink int16
	i := 0
	for b.Loop() {
		sink += Key(values[i&(len(values)-1)])
		i++
	}
	_ = sink
}

func BenchmarkQuantiles(b *testing.B) {
	for _, d := range distributions {
		h := histogramOf(sample(d, 1, 100_000))
		b.Run(fmt.Sprintf("%s/%d-buckets", d.name, len(h.Keys)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := h.Quantiles(0.5, 0.9, 0.95, 0.99); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMerge(b *testing.B) {
	x := histogramOf(sample(distributions[1], 1, 100_000))
	y := histogramOf(sample(distributions[1], 2, 100_000))
	b.ReportAllocs()
	for b.Loop() {
		h := x
		h.Merge(y)
	}
}
