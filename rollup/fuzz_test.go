package rollup

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"tokenmeter/internal/ident"
)

// FuzzParseSLOSet: ParseSLOSet never panics; a set it accepts is one JSON
// document, valid, names only identifiers, compiles, and its canonical form
// parses again to the same canonical bytes.
func FuzzParseSLOSet(f *testing.F) {
	def, err := json.Marshal(DefaultSLOSet())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(def)
	f.Add([]byte(`{"default_class":"batch","rules":[{"tenant_id":"acme","model":"llama-3.1-70b","slo_class":"interactive","ttft_ms":300,"itl_ms":50.5,"e2e_ms":1e4}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseSLOSet(data)
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, which is not one JSON document", data)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted set does not validate: %v", err)
		}
		if err := ident.Check("default_class", s.DefaultClass); err != nil {
			t.Fatalf("accepted %v", err)
		}
		seen := map[[3]string]bool{}
		for _, r := range s.Rules {
			for _, v := range []string{r.TenantID, r.Model, r.SLOClass} {
				if err := ident.Check("name", v); err != nil {
					t.Fatalf("accepted %v", err)
				}
			}
			for _, v := range []float64{r.TTFTMs, r.ITLMs, r.E2EMs} {
				if !(v >= 0) || math.IsInf(v, 0) {
					t.Fatalf("accepted threshold %v", v)
				}
			}
			k := [3]string{r.TenantID, r.Model, r.SLOClass}
			if seen[k] {
				t.Fatalf("accepted two rules for %q", k)
			}
			seen[k] = true
		}
		if spec := s.Spec(1); len(spec.Rules) != len(s.Rules) || spec.DefaultClass == "" {
			t.Fatalf("spec %+v of set %+v", spec, s)
		}
		canon, err := s.Canonical()
		if err != nil {
			t.Fatalf("canonical form of an accepted set: %v", err)
		}
		s2, err := ParseSLOSet(canon)
		if err != nil {
			t.Fatalf("canonical form %s of an accepted set does not parse: %v", canon, err)
		}
		canon2, err := s2.Canonical()
		if err != nil || !bytes.Equal(canon, canon2) {
			t.Fatalf("canonical form changes when parsed again (%v):\n%s\n%s", err, canon, canon2)
		}
	})
}
