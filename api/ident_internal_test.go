package api

import (
	"context"
	"errors"
	"testing"
	"time"
	"tokenmeter/query"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/internal/ident"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// rowsReader is a RollupReader that returns fixed rows, standing for rows of
// ids that got into ClickHouse some other way than through validation.
type rowsReader struct {
	rows []query.RollupRow
	raw  []query.RawLatencyRow
}

func (r rowsReader) Rollups(context.Context, query.RollupQuery) ([]query.RollupRow, error) {
	return r.rows, nil
}

func (r rowsReader) RawLatency(context.Context, query.RollupQuery) ([]query.RawLatencyRow, error) {
	return r.raw, nil
}

func (r rowsReader) Traffic(context.Context, query.RollupQuery) ([]query.TrafficRow, error) {
	var out []query.TrafficRow
	for _, row := range r.rows {
		out = append(out, query.TrafficRow{Start: row.Start, Group: row.Group, Requests: row.Requests, PeakMinuteRequests: row.Requests})
	}
	return out, nil
}

// TestGroupKeysDoNotCollide: the two groups of issue 13 were one series
// under "\x00"-joined keys; series stay sorted by their values, tuple-wise.
func TestGroupKeysDoNotCollide(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	groups := []map[string]string{
		{"tenant_id": "nulA\x00b", "model": "c"},
		{"tenant_id": "nulA", "model": "b\x00c"},
		{"tenant_id": "nulA", "model": "b"},
		{"tenant_id": "nulA", "model": ""},
		{"tenant_id": "", "model": "nulA\x00b\x00c"},
	}
	// Tuple order of (tenant_id, model).
	want := []map[string]string{groups[4], groups[3], groups[2], groups[1], groups[0]}
	var rows []query.RollupRow
	var raw []query.RawLatencyRow
	for i, g := range groups {
		rows = append(rows, query.RollupRow{Start: at, Group: g, Requests: uint64(i + 1)})
		raw = append(raw, query.RawLatencyRow{Start: at, Group: g, Values: map[string][]float64{"ttft": {float64(100 * (i + 1))}}})
	}
	s := &metricsService{store: rowsReader{rows: rows, raw: raw}}
	ctx := withPrincipal(context.Background(), Principal{Name: "admin", Role: RoleAdmin})
	sel := &meterv1.SeriesSelector{Step: "total", GroupBy: []string{"tenant_id", "model"},
		Start: timestamppb.New(at), End: timestamppb.New(at.Add(time.Hour))}

	traffic, err := s.GetTraffic(ctx, &meterv1.GetTrafficRequest{Selector: sel})
	if err != nil {
		t.Fatal(err)
	}
	var gotGroups []map[string]string
	for i, se := range traffic.GetSeries() {
		gotGroups = append(gotGroups, se.GetGroup())
		// Row i of groups holds i+1 requests; each series only its own row.
		if i < len(want) {
			wantReq := uint64(0)
			for j, g := range groups {
				if cmp.Equal(g, want[i]) {
					wantReq = uint64(j + 1)
				}
			}
			if n := se.GetSummary().GetRequests(); n != wantReq {
				t.Errorf("series %q: got %d requests, want %d", se.GetGroup(), n, wantReq)
			}
		}
	}
	if diff := cmp.Diff(want, gotGroups); diff != "" {
		t.Errorf("traffic series groups (-want +got):\n%s", diff)
	}

	lat, err := s.GetLatency(ctx, &meterv1.GetLatencyRequest{Selector: sel, Exact: true})
	if err != nil {
		t.Fatal(err)
	}
	gotGroups = nil
	for _, se := range lat.GetSeries() {
		gotGroups = append(gotGroups, se.GetGroup())
		if c := se.GetSummary().GetTtft().GetCount(); c != 1 {
			t.Errorf("latency series %q: got %d values, want 1 (no mixed percentiles)", se.GetGroup(), c)
		}
	}
	if diff := cmp.Diff(want, gotGroups); diff != "" {
		t.Errorf("latency series groups (-want +got):\n%s", diff)
	}
}

func TestQueryTenantMustBeAnIdentifier(t *testing.T) {
	ctx := withPrincipal(context.Background(), Principal{Name: "finance", Role: RoleFinance})
	for _, tenant := range []string{"\u200b__idle__", "nulA\x00b", " acme", "acme ", "ac\u202eme"} {
		if _, err := scopeTenant(ctx, tenant); !errors.Is(err, query.ErrInvalidQuery) || !errors.Is(err, ident.ErrInvalid) {
			t.Errorf("scopeTenant(%q): got %v, want an invalid query naming the identifier rule", tenant, err)
		}
	}
	if got, err := scopeTenant(ctx, "acme corp"); err != nil || got != "acme corp" {
		t.Errorf(`scopeTenant("acme corp"): got %q, %v; want it back`, got, err)
	}
}

func TestKeysFileTenantMustBeAnIdentifier(t *testing.T) {
	_, err := NewKeys(KeysFile{Keys: []KeyEntry{{Name: "t", SHA256: HashKey("k"), Role: RoleTenant, TenantID: "acme\u200b"}}})
	if !errors.Is(err, ident.ErrInvalid) {
		t.Errorf("got %v, want an error wrapping ident.ErrInvalid", err)
	}
}
