package rollup

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"tokenmeter/internal/ident"
)

// Rule is one SLO rule: thresholds for the requests of a tenant, model and
// slo_class. An empty selector matches anything; the most specific matching
// rule wins (tenant outranks model, model outranks class). A threshold of 0
// or absent is not checked.
type Rule struct {
	TenantID string  `json:"tenant_id,omitempty"`
	Model    string  `json:"model,omitempty"`
	SLOClass string  `json:"slo_class,omitempty"`
	TTFTMs   float64 `json:"ttft_ms,omitempty"`
	ITLMs    float64 `json:"itl_ms,omitempty"`
	E2EMs    float64 `json:"e2e_ms,omitempty"`
}

// SLOSet is the set of rules in force. Its JSON form is the --slo-file format:
// {"default_class":"interactive","rules":[{"slo_class":"interactive","ttft_ms":500,"itl_ms":250}]}
type SLOSet struct {
	// DefaultClass is the slo_class of events that carry none. Default "interactive".
	DefaultClass string `json:"default_class,omitempty"`
	Rules        []Rule `json:"rules"`
}

// DefaultSLOSet: interactive requests need TTFT ≤ 500 ms and ITL ≤ 250 ms
// (ARCHITECTURE "Goodput"); batch requests need E2E ≤ 10 minutes.
func DefaultSLOSet() SLOSet {
	return SLOSet{DefaultClass: "interactive", Rules: []Rule{
		{SLOClass: "interactive", TTFTMs: 500, ITLMs: 250},
		{SLOClass: "batch", E2EMs: 600_000},
	}}
}

// Validate reports every problem at once.
func (s SLOSet) Validate() error {
	var errs []error
	if err := ident.Check("default_class", s.DefaultClass); err != nil {
		errs = append(errs, err)
	}
	seen := map[[3]string]bool{}
	for i, r := range s.Rules {
		for _, f := range []struct{ name, v string }{{"tenant_id", r.TenantID}, {"model", r.Model}, {"slo_class", r.SLOClass}} {
			if err := ident.Check(f.name, f.v); err != nil {
				errs = append(errs, fmt.Errorf("rule %d: %w", i, err))
			}
		}
		key := [3]string{r.TenantID, r.Model, r.SLOClass}
		if seen[key] {
			errs = append(errs, fmt.Errorf("rule %d: another rule has the same tenant_id, model and slo_class", i))
		}
		seen[key] = true
		for _, v := range []struct {
			name string
			v    float64
		}{{"ttft_ms", r.TTFTMs}, {"itl_ms", r.ITLMs}, {"e2e_ms", r.E2EMs}} {
			if v.v < 0 || math.IsNaN(v.v) || math.IsInf(v.v, 0) {
				errs = append(errs, fmt.Errorf("rule %d: %s must be a non-negative number", i, v.name))
			}
		}
	}
	return errors.Join(errs...)
}

// Canonical is the set's normalized JSON: defaults filled and rules sorted,
// so that equal sets have equal bytes (a reload does not create a version).
func (s SLOSet) Canonical() ([]byte, error) {
	if s.DefaultClass == "" {
		s.DefaultClass = "interactive"
	}
	rules := append([]Rule(nil), s.Rules...)
	slices.SortFunc(rules, func(a, b Rule) int {
		return cmp.Or(strings.Compare(a.TenantID, b.TenantID), strings.Compare(a.Model, b.Model), strings.Compare(a.SLOClass, b.SLOClass))
	})
	s.Rules = rules
	return json.Marshal(s)
}

// ParseSLOSet reads the JSON form, refusing unknown fields.
func ParseSLOSet(data []byte) (SLOSet, error) {
	var s SLOSet
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return SLOSet{}, fmt.Errorf("parse SLO set: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return SLOSet{}, errors.New("parse SLO set: data after the top-level object")
	}
	if err := s.Validate(); err != nil {
		return SLOSet{}, fmt.Errorf("SLO set: %w", err)
	}
	return s, nil
}

// LoadSLOFile reads an SLO set from a file.
func LoadSLOFile(path string) (SLOSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return SLOSet{}, fmt.Errorf("read SLO file: %w", err)
	}
	s, err := ParseSLOSet(data)
	if err != nil {
		return SLOSet{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

func specificity(r Rule) int {
	n := 0
	if r.TenantID != "" {
		n += 4
	}
	if r.Model != "" {
		n += 2
	}
	if r.SLOClass != "" {
		n++
	}
	return n
}

// Resolve returns the rule that applies to a request: the most specific
// matching rule; ok is false when none matches (every OK request is good).
func (s SLOSet) Resolve(tenant, model, class string) (Rule, bool) {
	if class == "" {
		class = s.defaultClass()
	}
	best, found := Rule{}, false
	for _, r := range s.Rules {
		if (r.TenantID != "" && r.TenantID != tenant) || (r.Model != "" && r.Model != model) || (r.SLOClass != "" && r.SLOClass != class) {
			continue
		}
		if !found || specificity(r) > specificity(best) {
			best, found = r, true
		}
	}
	return best, found
}

func (s SLOSet) defaultClass() string {
	if s.DefaultClass == "" {
		return "interactive"
	}
	return s.DefaultClass
}

// Spec compiles the set for RollupHour: rules most specific first.
func (s SLOSet) Spec(version uint32) GoodputSpec {
	rules := append([]Rule(nil), s.Rules...)
	sort.SliceStable(rules, func(i, j int) bool { return specificity(rules[i]) > specificity(rules[j]) })
	spec := GoodputSpec{Version: version, DefaultClass: s.defaultClass()}
	for _, r := range rules {
		spec.Rules = append(spec.Rules, GoodputRule{
			Tenant: r.TenantID, Model: r.Model, Class: r.SLOClass, TTFTMs: r.TTFTMs, ITLMs: r.ITLMs, E2EMs: r.E2EMs,
		})
	}
	return spec
}
