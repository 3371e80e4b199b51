package chstore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"tokenmeter/rollup"

	"github.com/google/go-cmp/cmp"
)

// TestSQLParts checks the pieces every read is built from: the scope of a
// range and tenant, the newest computation of each hour (FINAL only for
// the minute rows), and the union of fresh days with the other hours.
func TestSQLParts(t *testing.T) {
	end := t0.Add(72 * time.Hour)
	where, args := scope("bucket", t0, end, "acme")
	if want := "bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ?"; where != want {
		t.Errorf("scope = %q, want %q", where, want)
	}
	if diff := cmp.Diff([]any{t0.Unix(), end.Unix(), "acme"}, args); diff != "" {
		t.Errorf("scope args (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		name, table, timeCol, filter string
		want                         string
		args                         int // times the scope's arguments repeat
	}{
		{"minute rows with FINAL", "rollup_minute_recent", "bucket", "",
			"rollup_minute_recent FINAL\nWHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ?", 1},
		{"hour rows, newest version", "rollup_hour", "bucket", "",
			"rollup_hour\nWHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ?\n" +
				"  AND (bucket, version) IN (SELECT bucket, max(version) FROM rollup_hour WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ? GROUP BY bucket)", 2},
		{"cost rows by hour, filtered", "cost_hour", "hour", "unattributed = 0",
			"cost_hour\nWHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ? AND unattributed = 0\n" +
				"  AND (hour, version) IN (SELECT hour, max(version) FROM cost_hour WHERE bucket >= toDateTime(?) AND bucket < toDateTime(?) AND tenant_id = ? GROUP BY hour)", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, gotArgs := newestRows(tc.table, tc.timeCol, where, args, tc.filter)
			if got != tc.want {
				t.Errorf("newestRows =\n%s\nwant\n%s", got, tc.want)
			}
			var want []any
			for range tc.args {
				want = append(want, args...)
			}
			if diff := cmp.Diff(want, gotArgs); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
	days := []time.Time{t0, t0.Add(24 * time.Hour)}
	from, fromArgs := withDays("bucket, requests", days, where, args)
	for _, w := range []string{
		"(\n  SELECT bucket, requests\n  FROM rollup_tenant_day\n", "AND toUInt32(bucket) IN " + hourList(days),
		"\n  UNION ALL\n  SELECT bucket, requests\n  FROM rollup_tenant_hour\n",
		"AND intDiv(toUInt32(bucket), 86400) * 86400 NOT IN " + hourList(days), "\n)",
	} {
		if !strings.Contains(from, w) {
			t.Errorf("withDays lacks %q:\n%s", w, from)
		}
	}
	if len(fromArgs) != 4*len(args) || strings.Count(from, "?") != len(fromArgs) {
		t.Errorf("withDays: %d args for %d placeholders, want 4 × the scope's", len(fromArgs), strings.Count(from, "?"))
	}
	if got, want := hourList(days), "("+itoa(days[0])+", "+itoa(days[1])+")"; got != want {
		t.Errorf("hourList = %s, want %s", got, want)
	}
}

// TestInsertColumns checks the column lists rows are written with: every
// rollup table has the rollup columns, the hour tables also their busiest
// minute and per-minute counts; every statement names its columns.
func TestInsertColumns(t *testing.T) {
	minute, hour := columnsOf("rollup_minute_recent"), columnsOf("rollup_hour")
	if !slices.Equal(hour[:len(minute)], minute) || !slices.Equal(hour[len(minute):], slices.Concat(peakColumns, minuteColumns, hourHistColumns())) {
		t.Errorf("hour columns %v, want the minute ones %v then the peak, per-minute and hour-only histogram ones", hour, minute)
	}
	if n := 2 * rollup.NumHourDists; len(hourHistColumns()) != n {
		t.Errorf("%d hour-only histogram columns, want keys and counts of %d", len(hourHistColumns()), rollup.NumHourDists)
	}
	if n := 9 + len(errClasses) + 3 + 4*len(distColumns) + 4; len(minute) != n {
		t.Errorf("%d rollup columns, want %d", len(minute), n)
	}
	for _, c := range []string{"bucket", "err_timeout", "ttft_keys", "queue_counts", "slo_version", "version"} {
		if !slices.Contains(minute, c) {
			t.Errorf("rollup columns lack %s", c)
		}
	}
	cost := costColumns()
	for _, c := range []string{"busy_weighted", "cost_request_time_shared_even", "price_version"} {
		if !slices.Contains(cost, c) {
			t.Errorf("cost columns lack %s: %v", c, cost)
		}
	}
	for _, stmt := range []string{InsertEventsSQL, InsertGPUSamplesSQL} {
		if !strings.HasPrefix(stmt, "INSERT INTO ") || !strings.Contains(stmt, " (") || !strings.HasSuffix(stmt, ")") {
			t.Errorf("insert without a column list: %s", stmt)
		}
	}
}
