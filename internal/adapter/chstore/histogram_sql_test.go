package chstore

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/rollup/sketch"
)

func TestHistogramSQL(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{
			"histogramKeySQL", histogramKeySQL("ttft"),
			"toInt16(ceil(log(least(greatest(if(isNaN(ttft), 0, ttft), 0.001), 1e+10)) / 0.020000666706669435))",
		},
		{
			"histogramSQL", histogramSQL("ttft"),
			"sumMapIf([toInt16(ceil(log(least(greatest(if(isNaN(ifNull(ttft, 0)), 0, ifNull(ttft, 0)), 0.001), 1e+10)) / 0.020000666706669435))], [toUInt64(1)], isNotNull(ttft))",
		},
		{
			"histogramSQL in a statement", "SELECT tenant_id, (" + histogramSQL("ttft_ms") + " AS h).1 AS ttft_keys, h.2 AS ttft_counts",
			"SELECT tenant_id, (sumMapIf([toInt16(ceil(log(least(greatest(if(isNaN(ifNull(ttft_ms, 0)), 0, ifNull(ttft_ms, 0)), 0.001), 1e+10)) / 0.020000666706669435))], [toUInt64(1)], isNotNull(ttft_ms)) AS h).1 AS ttft_keys, h.2 AS ttft_counts",
		},
		{"histogramMergeSQL", histogramMergeSQL("ttft_keys", "ttft_counts"), "sumMap(ttft_keys, ttft_counts)"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s:\ngot  %s\nwant %s", tt.name, tt.got, tt.want)
		}
	}
}

// latencyRow is one raw latency of the ClickHouse test: x is
// Nullable(Float64), y the same value with NULL as 0 in a Float64 column.
type latencyRow struct {
	id    uint32
	group uint16
	x     *float64
}

func (r latencyRow) y() float64 {
	if r.x == nil {
		return 0
	}
	return *r.x
}

// latencyRows returns 100k latencies in 40 groups: special values (zero,
// negative, NaN, infinities, values at and beyond MinValue and MaxValue),
// every bucket bound with its float64 neighbours, where a log rounding
// differently would show, and then draws from the test distributions with
// 5% NULLs and 1% zeros.
func latencyRows() []latencyRow {
	rng := rand.New(rand.NewPCG(42, 42))
	var rows []latencyRow
	add := func(v *float64) {
		rows = append(rows, latencyRow{id: uint32(len(rows)), group: uint16(rng.IntN(40)), x: v})
	}
	special := []float64{
		0, math.Copysign(0, -1), -1, math.Inf(-1), math.NaN(), math.SmallestNonzeroFloat64, 1e-9,
		sketch.MinValue, math.Nextafter(sketch.MinValue, 0), math.Nextafter(sketch.MinValue, 1), 0.0015, 1, sketch.Gamma,
		24 * 3600 * 1e3, math.Nextafter(sketch.MaxValue, 0), sketch.MaxValue, math.Nextafter(sketch.MaxValue, math.Inf(1)),
		1e300, math.MaxFloat64, math.Inf(1),
	}
	for _, v := range special {
		add(&v)
	}
	for k := sketch.MinKey; k < sketch.MaxKey; k++ {
		b := sketch.UpperBound(k)
		for _, v := range []float64{math.Nextafter(b, 0), b, math.Nextafter(b, math.Inf(1))} {
			add(&v)
		}
	}
	for len(rows) < 100_000 {
		switch p := rng.Float64(); {
		case p < 0.05:
			add(nil)
		case p < 0.06:
			v := 0.0
			add(&v)
		default:
			v := latencyDraws[rng.IntN(len(latencyDraws))](rng)
			add(&v)
		}
	}
	return rows
}

func TestHistogramSQLOnClickHouse(t *testing.T) {
	addr, db := chtest.NewDB(t)
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close()
	ctx := t.Context()

	var chLog, chLit float64
	if err := conn.QueryRow(ctx, "SELECT log(1.01 / 0.99), "+sqlFloat(lnGamma)).Scan(&chLog, &chLit); err != nil {
		t.Fatalf("select ln γ: %v", err)
	}
	if chLit != lnGamma {
		t.Errorf("ClickHouse parses the literal %s as %v, want %v", sqlFloat(lnGamma), chLit, lnGamma)
	}
	t.Logf("ln γ: Go %v, ClickHouse log(1.01 / 0.99) %v", lnGamma, chLog)

	rows := latencyRows()
	mustExec(ctx, t, conn, "CREATE TABLE raw (id UInt32, g UInt16, x Nullable(Float64), y Float64) ENGINE = Memory")
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO raw (id, g, x, y)")
	if err != nil {
		t.Fatalf("prepare insert: %v", err)
	}
	for _, r := range rows {
		if err := batch.Append(r.id, r.group, r.x, r.y()); err != nil {
			t.Fatalf("append row %d: %v", r.id, err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatalf("insert: %v", err)
	}
	var n, nulls uint64
	if err := conn.QueryRow(ctx, "SELECT count(), countIf(isNull(x)) FROM raw").Scan(&n, &nulls); err != nil {
		t.Fatalf("count rows: %v", err)
	}
	wantNulls := uint64(0)
	for _, r := range rows {
		if r.x == nil {
			wantNulls++
		}
	}
	if n != uint64(len(rows)) || nulls != wantNulls {
		t.Fatalf("ClickHouse holds %d rows, %d NULL, want %d, %d", n, nulls, len(rows), wantNulls)
	}

	t.Run("row keys", func(t *testing.T) {
		res, err := conn.Query(ctx, "SELECT id, "+histogramKeySQL("y")+" FROM raw")
		if err != nil {
			t.Fatalf("select keys: %v", err)
		}
		defer res.Close()
		seen := 0
		for res.Next() {
			var id uint32
			var got int16
			if err := res.Scan(&id, &got); err != nil {
				t.Fatalf("scan key: %v", err)
			}
			seen++
			if v := rows[id].y(); got != sketch.Key(v) {
				t.Errorf("value %v (%016x): ClickHouse key %d, Go key %d", v, math.Float64bits(v), got, sketch.Key(v))
			}
		}
		if err := res.Err(); err != nil {
			t.Fatalf("select keys: %v", err)
		}
		if seen != len(rows) {
			t.Errorf("got %d keys, want %d", seen, len(rows))
		}
	})

	type groupHists map[uint16]sketch.Histogram
	wantX, wantY := groupHists{}, groupHists{}
	var wantAll sketch.Histogram
	for _, r := range rows {
		hy := wantY[r.group]
		hy.Add(r.y())
		wantY[r.group] = hy
		if r.x == nil {
			continue
		}
		hx := wantX[r.group]
		hx.Add(*r.x)
		wantX[r.group] = hx
		wantAll.Add(*r.x)
	}

	t.Run("group histograms", func(t *testing.T) {
		for _, tt := range []struct {
			col  string
			want groupHists
		}{
			{"x", wantX}, // Nullable: NULLs do not count
			{"y", wantY},
		} {
			res, err := conn.Query(ctx, "SELECT g, ("+histogramSQL(tt.col)+" AS h).1, h.2 FROM raw GROUP BY g")
			if err != nil {
				t.Fatalf("select histograms of %s: %v", tt.col, err)
			}
			got := groupHists{}
			for res.Next() {
				var g uint16
				var h sketch.Histogram
				if err := res.Scan(&g, &h.Keys, &h.Counts); err != nil {
					t.Fatalf("scan histogram of %s: %v", tt.col, err)
				}
				got[g] = h
			}
			if err := res.Err(); err != nil {
				t.Fatalf("select histograms of %s: %v", tt.col, err)
			}
			res.Close()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("histograms of %s per group: ClickHouse differs from Go (-go +clickhouse):\n%s", tt.col, diff)
			}
		}
	})

	t.Run("sumMap merge", func(t *testing.T) {
		mustExec(ctx, t, conn, "CREATE TABLE hist (g UInt16, keys Array(Int16), counts Array(UInt64)) ENGINE = Memory")
		mustExec(ctx, t, conn, "INSERT INTO hist (g, keys, counts) SELECT g, ("+histogramSQL("x")+" AS h).1, h.2 FROM raw GROUP BY g")
		var got sketch.Histogram
		if err := conn.QueryRow(ctx, "SELECT ("+histogramMergeSQL("keys", "counts")+" AS m).1, m.2 FROM hist").Scan(&got.Keys, &got.Counts); err != nil {
			t.Fatalf("select merged histogram: %v", err)
		}
		norm, err := sketch.FromArrays(got.Keys, got.Counts)
		if err != nil {
			t.Fatalf("FromArrays: %v", err)
		}
		if diff := cmp.Diff(norm, got); diff != "" {
			t.Errorf("sumMap's arrays are not sorted without zeros (-normalized +sumMap):\n%s", diff)
		}
		var merged sketch.Histogram
		for _, h := range wantX {
			merged.Merge(h)
		}
		if diff := cmp.Diff(merged, got); diff != "" {
			t.Errorf("sumMap of the group histograms differs from Merge (-go +clickhouse):\n%s", diff)
		}
		if diff := cmp.Diff(wantAll, got); diff != "" {
			t.Errorf("sumMap of the group histograms differs from the histogram of all values (-go +clickhouse):\n%s", diff)
		}
	})

	t.Run("empty", func(t *testing.T) {
		var got sketch.Histogram
		if err := conn.QueryRow(ctx, "SELECT ("+histogramSQL("x")+" AS h).1, h.2 FROM raw WHERE isNull(x)").Scan(&got.Keys, &got.Counts); err != nil {
			t.Fatalf("select histogram of NULLs: %v", err)
		}
		if diff := cmp.Diff(sketch.Histogram{}, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("histogram of NULLs is not empty (-want +got):\n%s", diff)
		}
	})
}

func mustExec(ctx context.Context, t *testing.T, conn driver.Conn, query string) {
	t.Helper()
	if err := conn.Exec(ctx, query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// latencyDraws draw synthetic latencies (ms) as package sketch's tests do:
// log-normal, bimodal, Pareto with infinite variance, and log-uniform from
// 1 µs to 1 s.
var latencyDraws = []func(rng *rand.Rand) float64{
	func(rng *rand.Rand) float64 { return 200 * math.Exp(0.8*rng.NormFloat64()) },
	func(rng *rand.Rand) float64 {
		if rng.Float64() < 0.7 {
			return 50 * math.Exp(0.3*rng.NormFloat64())
		}
		return 5000 * math.Exp(0.5*rng.NormFloat64())
	},
	func(rng *rand.Rand) float64 { return 10 / math.Pow(1-rng.Float64(), 1/1.2) },
	func(rng *rand.Rand) float64 { return sketch.MinValue * math.Pow(1e6, rng.Float64()) },
}
