package api_test

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"slices"
	"testing"

	"tokenmeter/api"
	"tokenmeter/billing/export"
)

// TestBillingFocusExportHeaders checks the FOCUS exports over REST: the
// X-Export-Rows trailer counts the file's rows (FOCUS rows, one per token
// kind, and a rounding row per statement: more than the statements have
// lines), the FOCUS metadata a CSV has no place for comes as X-Focus-*
// headers (none on the other formats), and a tenant's usage-cost file
// names no deployment where finance's does.
func TestBillingFocusExportHeaders(t *testing.T) {
	store, svc := newBillingData(t)
	s := startBillingAPI(t, store, svc, api.Config{})
	closeOctober(t, s)
	for _, tt := range []struct {
		who, key string
		finance  bool
	}{{"tenant", testKeys["tenant"], false}, {"finance", testKeys["finance"], true}} {
		t.Run(tt.who, func(t *testing.T) {
			lines := s.get(t, "GET", statementsExportPath("2026-10", "acme", "csv"), tt.key, "")
			r := s.get(t, "GET", statementsExportPath("2026-10", "acme", "focus-csv"), tt.key, "")
			if r.code != 200 || lines.code != 200 {
				t.Fatalf("exports: %d %s; %d %s", r.code, r.body, lines.code, lines.body)
			}
			recs, err := csv.NewReader(bytes.NewReader(r.body)).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.trailer.Get("X-Export-Rows"), fmt.Sprint(len(recs)-1); got != want {
				t.Errorf("X-Export-Rows %s, the file has %s rows", got, want)
			}
			if n := bytes.Count(lines.body, []byte("\n")) - 1; len(recs)-1 <= n {
				t.Errorf("%d FOCUS rows for %d statement lines: want a row per token kind and a rounding row", len(recs)-1, n)
			}
			md := export.FocusMetadataOf(export.Options{Finance: tt.finance})
			for h, want := range map[string]string{"X-Focus-Version": "1.2", "X-Focus-Schema-Id": md.SchemaID, "X-Focus-Data-Generator": md.DataGenerator} {
				if got := r.header.Get(h); got != want {
					t.Errorf("%s %q, want %q", h, got, want)
				}
				if got := lines.header.Get(h); got != "" {
					t.Errorf("csv export: %s %q, want none", h, got)
				}
			}
			// Usage rows are per deployment: finance sees which.
			u := s.get(t, "GET", usageCostExportPath("acme", "focus-csv"), tt.key, "")
			if recs, err = csv.NewReader(bytes.NewReader(u.body)).ReadAll(); u.code != 200 || err != nil || len(recs) < 2 {
				t.Fatalf("usage-cost export: %d %v %s", u.code, err, u.body)
			}
			dep := slices.Index(recs[0], "x_Deployment")
			named := 0
			for _, rec := range recs[1:] {
				if rec[dep] != "" {
					named++
				}
			}
			if (named > 0) != tt.finance {
				t.Errorf("%d rows name a deployment; finance %v", named, tt.finance)
			}
		})
	}
}
