package chstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/go-cmp/cmp"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// TestEachUsageCostReadsInBoundedChunks: the usage-and-cost export reads
// its range in chunks of whole steps, no query returning more rows than the
// chunk bound (one query of a month's every tenant's hours came as one
// block of 2.9M rows, decoded whole), and streams the same rows in (step,
// tenant, model, deployment) order, the newest computation of each hour.
func TestEachUsageCostReadsInBoundedChunks(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	day := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	tenants := []string{"a", "b", "c"}
	// 30 hours of three tenants; hour 3 computed twice (the second
	// computation's rows are the ones read).
	write := func(h int, version uint64, requests uint64) {
		t.Helper()
		var cost []rollup.CostRow
		for i, tenant := range tenants {
			cost = append(cost, rollup.CostRow{Hour: day.Add(time.Duration(h) * time.Hour), TenantID: tenant, Deployment: "d", Model: "m",
				GPUType: "H100", Requests: requests + uint64(i), InputTokens: 10, OutputTokens: 1, ListCharge: 7, ListPriced: true,
				PriceVersion: fmt.Sprintf("v%d", version)})
		}
		if err := s.WriteCost(ctx, nil, cost, version); err != nil {
			t.Fatal(err)
		}
	}
	for h := range 30 {
		write(h, 1, uint64(h*10))
	}
	write(3, 2, 1000)
	want := map[string][]string{}
	for h := range 30 {
		requests := uint64(h * 10)
		if h == 3 {
			requests = 1000
		}
		for i, tenant := range tenants {
			version := "v1"
			if h == 3 {
				version = "v2"
			}
			want["hour"] = append(want["hour"], fmt.Sprintf("%s %s m d %d %s", day.Add(time.Duration(h)*time.Hour).Format(time.RFC3339), tenant, requests+uint64(i), version))
		}
	}
	for d := range 2 {
		for i, tenant := range tenants {
			var requests uint64
			versions := map[string]bool{}
			for h := d * 24; h < min(30, d*24+24); h++ {
				requests += uint64(h*10) + uint64(i)
				versions["v1"] = true
				if h == 3 {
					requests += 1000 - 30
					versions["v2"] = true
				}
			}
			v := "v1"
			if len(versions) == 2 {
				v = "v1 v2"
			}
			want["day"] = append(want["day"], fmt.Sprintf("%s %s m d %d %s", day.AddDate(0, 0, d).Format(time.RFC3339), tenant, requests, v))
		}
	}
	const chunk = 7 // rows of cost_hour: two hours of three tenants
	s.SetUsageCostChunkRows(chunk)
	reads := query.New(s, query.Config{})
	for _, step := range []string{"hour", "day"} {
		t.Run(step, func(t *testing.T) {
			marker := 1<<20 + rand.Uint64N(1<<20) // max_query_size: tells this test's queries apart in the log
			qctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1, "max_query_size": int(marker)}))
			var got []string
			err := reads.EachUsageCost(qctx, query.CostQuery{Start: day, End: day.Add(48 * time.Hour), Step: step}, func(r *query.UsageCostRow) error {
				got = append(got, fmt.Sprintf("%s %s %s %s %d %s", r.Start.Format(time.RFC3339), r.Tenant, r.Model, r.Deployment, r.Requests, strings.Join(r.PriceVersions, " ")))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want[step], got); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			// The server logs a query's end just after its last block, so
			// the log may lack the last query for a moment: read it again
			// until it has every row, for up to 10 s.
			var (
				results []uint64
				total   uint64
			)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				if results, err = s.UsageCostResultRows(ctx, marker); err != nil {
					t.Fatal(err)
				}
				total = 0
				for _, n := range results {
					total += n
				}
				if total >= uint64(len(want[step])) || time.Now().After(deadline) {
					break
				}
			}
			for _, n := range results {
				// A step is never cut: a day of 72 rows of cost_hour is a
				// chunk of its own, of one row per tenant.
				limit := uint64(chunk)
				if step == "day" {
					limit = uint64(len(tenants))
				}
				if n > limit {
					t.Errorf("a query returned %d rows, want at most %d", n, limit)
				}
			}
			if total != uint64(len(want[step])) || len(results) < 2 {
				t.Errorf("%d queries returned %d rows, want %d rows in several queries", len(results), total, len(want[step]))
			}
		})
	}
}

// TestEachUsageCostHourSumsAsGroupBy: the hourly export reads cost_hour's
// rows as stored and sorts and sums them in Go; its rows must be what
// ClickHouse's GROUP BY of the same rows gives (EachUsageCostGrouped),
// row for row and in the same order, on rows with several lines of a key
// in one computation (GPU types, unattributed lines, two price versions),
// hours computed again (fewer or other lines), tenant names that sort
// differently from their arrival, and chunks small enough that the next
// chunk is read while the last is streamed.
func TestEachUsageCostHourSumsAsGroupBy(t *testing.T) {
	s := chstoretest.OpenMigrated(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(34, 1))
	day := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	tenants := []string{"b", "B", "a", "a-2", "__idle", "zeta", "é"}
	models := []string{"m2", "m1", "M"}
	deployments := []string{"d1", "d0"}
	write := func(h int, version uint64) {
		t.Helper()
		var cost []rollup.CostRow
		for range 5 + rng.IntN(40) {
			r := rollup.CostRow{Hour: day.Add(time.Duration(h) * time.Hour), TenantID: tenants[rng.IntN(len(tenants))],
				Deployment: deployments[rng.IntN(len(deployments))], Model: models[rng.IntN(len(models))],
				GPUType: []string{"H100", "A100"}[rng.IntN(2)], Unattributed: rng.IntN(4) == 0,
				Requests: rng.Uint64N(1000), InputTokens: rng.Uint64N(1 << 40), CachedInputTokens: rng.Uint64N(1 << 30),
				OutputTokens: rng.Uint64N(1 << 40), ListCharge: rng.Int64N(1<<50) - 1<<40, ListPriced: rng.IntN(3) > 0,
				PriceVersion: fmt.Sprintf("v%d", rng.IntN(3))}
			for b := range r.Busy {
				r.Busy[b] = rng.Int64N(1 << 50)
				for i := range r.Cost[b] {
					r.Cost[b][i] = rng.Int64N(1<<50) - 1<<30
				}
			}
			cost = append(cost, r)
		}
		if err := s.WriteCost(ctx, nil, cost, version); err != nil {
			t.Fatal(err)
		}
	}
	for h := range 60 {
		write(h, 1)
		if h%7 == 3 {
			write(h, 2) // computed again
		}
	}
	format := func(r *query.UsageCostRow) string {
		return fmt.Sprintf("%s %q %q %q %d %d %d %d %d %d %d %d %q", r.Start.Format(time.RFC3339), r.Tenant, r.Model, r.Deployment,
			r.Requests, r.InputTokens, r.CachedInputTokens, r.OutputTokens, r.ListCharge, r.ListUnpricedRequests, r.CostNanos, r.BusyNanos, r.PriceVersions)
	}
	reads := query.New(s, query.Config{})
	for _, chunk := range []int{0, 1, 40, 333} {
		for _, policy := range [][2]string{{"", ""}, {"request_time", "shared_even"}} {
			s.SetUsageCostChunkRows(chunk)
			q := query.CostQuery{Start: day.Add(2 * time.Hour), End: day.Add(59 * time.Hour), Step: "hour", Busy: policy[0], Idle: policy[1]}
			var want, got []string
			nq, err := q.Normalize()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.EachUsageCostGrouped(ctx, nq, func(r *query.UsageCostRow) error {
				want = append(want, format(r))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if err := reads.EachUsageCost(ctx, q, func(r *query.UsageCostRow) error {
				got = append(got, format(r))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(want) < 100 {
				t.Fatalf("only %d rows", len(want))
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("chunk %d, policies %v: rows (-GROUP BY +read and summed in Go):\n%s", chunk, policy, diff)
			}
		}
	}
	// A row function's error stops the stream (the next chunk's read is
	// cancelled) and is returned.
	s.SetUsageCostChunkRows(10)
	stop := fmt.Errorf("enough")
	n := 0
	err := reads.EachUsageCost(ctx, query.CostQuery{Start: day, End: day.Add(60 * time.Hour), Step: "hour"}, func(*query.UsageCostRow) error {
		if n++; n == 25 {
			return stop
		}
		return nil
	})
	if err != stop || n != 25 {
		t.Errorf("after %d rows: %v, want the row function's error after 25", n, err)
	}
}
