package chstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestUsageQueryNormalize(t *testing.T) {
	tests := []struct {
		name    string
		q       UsageQuery
		wantErr string
		group   []string
	}{
		{"defaults", UsageQuery{Start: t0, End: t0.Add(time.Hour)}, "", nil},
		{"canonical order and commas", UsageQuery{Start: t0, End: t0.Add(time.Hour), GroupBy: []string{"deployment,tenant_id", "model", "tenant_id"}}, "", []string{"tenant_id", "model", "deployment"}},
		{"unknown field", UsageQuery{Start: t0, End: t0.Add(time.Hour), GroupBy: []string{"region"}}, `unknown group_by field "region"`, nil},
		{"bad granularity", UsageQuery{Start: t0, End: t0.Add(time.Hour), Granularity: "week"}, `granularity "week"`, nil},
		{"end before start", UsageQuery{Start: t0, End: t0.Add(-time.Hour)}, "must be after start", nil},
		{"missing range", UsageQuery{}, "start and end are required", nil},
		{"too many buckets", UsageQuery{Start: t0, End: t0.Add(24 * 365 * time.Hour), Granularity: "minute"}, "coarser granularity", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.q.Normalize()
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidQuery) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Normalize() error = %v, want ErrInvalidQuery mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Normalize() = %v", err)
			}
			if diff := cmp.Diff(tt.group, got.GroupBy); diff != "" {
				t.Errorf("GroupBy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUsageQuerySQL(t *testing.T) {
	q, err := UsageQuery{
		TenantID: "acme", Start: t0.Add(1500 * time.Millisecond), End: t0.Add(2 * time.Hour),
		Granularity: "hour", GroupBy: []string{"model"},
	}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	sql, args := q.SQL()
	for _, want := range []string{
		"toUInt32(intDiv(toUInt32(d_completed_at), 3600) * 3600) AS bucket",
		"GROUP BY tenant_id, event_id",
		"AND tenant_id = ?",
		"GROUP BY bucket, d_model",
		"ORDER BY bucket, d_model",
	} {
		if !strings.Contains(sql, want) {
			t.Errorf("SQL lacks %q:\n%s", want, sql)
		}
	}
	wantArgs := []any{t0.Unix() + 1, t0.Unix() + 7200, t0.UnixMilli() + 1500, t0.UnixMilli() + 7200_000, "acme"}
	if diff := cmp.Diff(wantArgs, args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	if strings.Count(sql, "?") != len(args) {
		t.Errorf("%d placeholders, %d args", strings.Count(sql, "?"), len(args))
	}

	total, _ := UsageQuery{Start: t0, End: t0.Add(time.Hour)}.Normalize()
	sql, args = total.SQL()
	if !strings.HasPrefix(sql, "SELECT toUInt32(?) AS bucket") || strings.Contains(sql, "tenant_id = ?") {
		t.Errorf("total query:\n%s", sql)
	}
	if strings.Count(sql, "?") != len(args) {
		t.Errorf("%d placeholders, %d args", strings.Count(sql, "?"), len(args))
	}
}

func TestMigrationsParse(t *testing.T) {
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) < 2 || migs[0].Version != 1 {
		t.Fatalf("migrations = %+v", migs)
	}
	for _, m := range migs {
		for _, s := range m.Statements {
			if strings.HasSuffix(strings.TrimSpace(s), ";") || strings.HasPrefix(strings.TrimSpace(s), "--") {
				t.Errorf("migration %d: badly split statement %q", m.Version, s)
			}
		}
	}
}
