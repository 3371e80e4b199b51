package rollup

import (
	"errors"
	"strings"
	"testing"

	"tokenmeter/internal/ident"
)

// TestSLOSetNamesAreIdentifiers: the tenants, models and classes an SLO set
// names follow the identifier rule of the events it judges.
func TestSLOSetNamesAreIdentifiers(t *testing.T) {
	for _, doc := range []string{
		`{"rules":[{"tenant_id":"\u200bacme","ttft_ms":500}]}`,
		`{"rules":[{"tenant_id":"nulA\u0000b","model":"c","ttft_ms":500}]}`,
		`{"rules":[{"model":"llama ","ttft_ms":500}]}`,
		`{"rules":[{"slo_class":" batch","e2e_ms":500}]}`,
		`{"default_class":"inter\u00adactive","rules":[]}`,
	} {
		_, err := ParseSLOSet([]byte(doc))
		if !errors.Is(err, ident.ErrInvalid) {
			t.Errorf("ParseSLOSet(%s): got %v, want an error wrapping ident.ErrInvalid", doc, err)
		}
	}
	if _, err := ParseSLOSet([]byte(`{"rules":[{"tenant_id":"acme corp","model":"llama-3.1-70b","slo_class":"batch","e2e_ms":500}]}`)); err != nil {
		t.Errorf("valid set: got %v", err)
	}
}

// TestCanonicalOrdersRulesByTuple: rules sort by (tenant_id, model,
// slo_class), part by part.
func TestCanonicalOrdersRulesByTuple(t *testing.T) {
	s := SLOSet{Rules: []Rule{{TenantID: "a", Model: "b"}, {TenantID: "a", SLOClass: "z"}, {TenantID: "", Model: "zz"}, {TenantID: "a-b"}}}
	data, err := s.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	got := string(data)
	order := []string{`"model":"zz"`, `"slo_class":"z"`, `"model":"b"`, `"tenant_id":"a-b"`}
	last := -1
	for _, o := range order {
		i := strings.Index(got, o)
		if i < last {
			t.Fatalf("canonical form %s: %s out of order", got, o)
		}
		last = i
	}
}
