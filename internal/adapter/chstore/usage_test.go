package chstore

import (
	"strings"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestUsageQuerySQL(t *testing.T) {
	q, err := query.UsageQuery{
		TenantID: "acme", Start: t0.Add(1500 * time.Millisecond), End: t0.Add(2 * time.Hour),
		Granularity: "hour", GroupBy: []string{"model"},
	}.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	sql, args := usageRawSQL(q, nil)
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

	total, _ := query.UsageQuery{Start: t0, End: t0.Add(time.Hour)}.Normalize()
	sql, args = usageRawSQL(total, nil)
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
