package query_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// TestTenantDecode: the decode histogram of a tenant, and of every tenant
// by tenant, comes from the tenant rows (hour and day: migration 0029's
// decode_kept) when every row read keeps it, and from the group rows
// (rollup_hour, as before the tenant rows kept it) when some row of the
// range was rolled up before: the same answers either way.
func TestTenantDecode(t *testing.T) {
	addr, db, s := migratedStore(t)
	ctx := context.Background()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: db}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	chstoretest.Insert(t, s, breakdownEvents(3000))
	spec := rollup.GoodputSpec{Version: 1, DefaultClass: "interactive"}
	for h := day; h.Before(day.Add(3 * time.Hour)); h = h.Add(time.Hour) {
		if err := rollupHour(t, s, h, spec, uint64(h.Unix())); err != nil {
			t.Fatal(err)
		}
	}
	rollUpDay := func(version uint64) {
		t.Helper()
		if ok, err := rollup.RollupDay(ctx, s, day, version); err != nil || !ok {
			t.Fatalf("roll up %s: %v, %v", day, ok, err)
		}
	}
	rollUpDay(uint64(day.Unix()) + 1e6)
	end := day.Add(24 * time.Hour)
	queries := []query.RollupQuery{
		{TenantID: "globex", Start: day, End: end, Step: "hour"},
		{Start: day, End: end, Step: "hour", GroupBy: []string{"tenant_id"}},
		{Start: day, End: end, Step: "day", GroupBy: []string{"tenant_id"}}, // day rows
	}
	read := func(q query.RollupQuery) ([]query.RollupRow, []query.Level) {
		t.Helper()
		q.Columns = query.LatencyBreakdownColumns
		rec := &levelRecorder{Store: s}
		rows, err := query.New(rec, query.Config{}).Rollups(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return rows, rec.levels
	}
	want := make([][]query.RollupRow, len(queries))
	for i, q := range queries {
		rows, levels := read(q)
		// The latency, then the breakdown, both from the tenant rows.
		if l := []query.Level{query.LevelTenantHour, query.LevelTenantHour}; !slices.Equal(levels, l) {
			t.Errorf("%+v: levels read %v, want %v", q, levels, l)
		}
		if len(rows) == 0 {
			t.Fatalf("%+v: no rows", q)
		}
		for _, r := range rows {
			if r.HourDists["decode"].Count == 0 {
				t.Errorf("%+v %s %v: no decode", q, r.Start, r.Group)
			}
		}
		want[i] = rows
	}

	// The second hour's tenant rows as code before migration 0029 wrote
	// them (a newer computation of the hour): no decode, decode_kept 0;
	// and the day rolled up again from them (decode_kept 0: not every
	// hour kept decode; its decode the other two hours').
	var cols []string
	if err := conn.QueryRow(ctx, "SELECT groupArray(name) FROM system.columns WHERE database = currentDatabase() AND table = 'rollup_tenant_hour' AND default_kind = ''").Scan(&cols); err != nil {
		t.Fatal(err)
	}
	cols = slices.DeleteFunc(cols, func(c string) bool {
		return c == "decode_keys" || c == "decode_counts" || c == "decode_kept" || c == "version"
	})
	list := strings.Join(cols, ", ")
	old := day.Add(time.Hour)
	if err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO rollup_tenant_hour (%[1]s, version) SELECT %[1]s, version + 1 FROM rollup_tenant_hour WHERE bucket = toDateTime(%[2]d)", list, old.Unix())); err != nil {
		t.Fatal(err)
	}
	rollUpDay(uint64(day.Unix()) + 2e6)
	var unkept uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM rollup_tenant_day WHERE version = ? AND decode_kept = 0", uint64(day.Unix())+2e6).Scan(&unkept); err != nil || unkept != 3 {
		t.Fatalf("day rows without decode kept: %d, %v; want 3", unkept, err)
	}
	opts := cmp.Options{cmpopts.EquateEmpty(), cmpopts.EquateApprox(1e-12, 0)}
	for i, q := range queries {
		rows, levels := read(q)
		// The breakdown met a row without decode and read the group rows.
		if l := []query.Level{query.LevelTenantHour, query.LevelTenantHour, query.LevelHour}; !slices.Equal(levels, l) {
			t.Errorf("%+v: levels read %v, want %v", q, levels, l)
		}
		if diff := cmp.Diff(want[i], rows, opts); diff != "" {
			t.Errorf("%+v: with rows from before decode_kept (-tenant rows +group rows):\n%s", q, diff)
		}
	}
}
