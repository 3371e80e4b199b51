package billing

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

const exampleBook = `{
  "currency": "USD",
  "gpu_prices": [
    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "region": "us-east-1", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "4.10"},
    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"}
  ],
  "token_prices": [
    {"model": "llama-3.1-70b", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"}
  ],
  "allocation": {"weighted_tokens": {"input_weight": "1", "output_weight": "3"}}
}`

func TestParsePriceBookExample(t *testing.T) {
	b, err := ParsePriceBook([]byte(exampleBook))
	if err != nil {
		t.Fatal(err)
	}
	want := &PriceBook{
		Currency: "USD",
		GPUPrices: []GPUPrice{
			{GPUType: "H100-SXM-80GB", Pool: "on-demand", Region: "us-east-1", EffectiveFrom: ts("2026-01-01T00:00:00Z"), PerHour: 4_100_000_000},
			{GPUType: "H100-SXM-80GB", EffectiveFrom: ts("2026-01-01T00:00:00Z"), PerHour: 3_500_000_000},
		},
		TokenPrices: []TokenPrice{
			{Model: "llama-3.1-70b", EffectiveFrom: ts("2026-01-01T00:00:00Z"), InputPer1M: 600_000_000, CachedInputPer1M: 300_000_000, OutputPer1M: 1_800_000_000},
		},
		Allocation: Policy{
			Busy: BusyTokens, Idle: IdleSeparate,
			// cached_input_weight defaults to input_weight.
			Weights: TokenWeights{Input: 1_000_000_000, CachedInput: 1_000_000_000, Output: 3_000_000_000},
		},
	}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Errorf("ParsePriceBook mismatch (-want +got):\n%s", diff)
	}
}

func TestParsePriceBookDefaults(t *testing.T) {
	b, err := ParsePriceBook([]byte(`{"token_prices":[{"model":"m","effective_from":"2026-01-01T00:00:00+02:00","input_per_1m":"1","output_per_1m":"2"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if b.Currency != "USD" {
		t.Errorf("got currency %q, want USD", b.Currency)
	}
	if diff := cmp.Diff(DefaultPolicy(), b.Allocation); diff != "" {
		t.Errorf("allocation (-want +got):\n%s", diff)
	}
	p := b.TokenPrices[0]
	if p.CachedInputPer1M != p.InputPer1M {
		t.Errorf("cached input price %s, want the input price %s", p.CachedInputPer1M, p.InputPer1M)
	}
	if got := p.EffectiveFrom.Location(); got != time.UTC {
		t.Errorf("effective_from in %v, want UTC", got)
	}
	if got, want := p.ID(), "token:m@2025-12-31T22:00:00Z"; got != want {
		t.Errorf("ID() = %q, want %q", got, want)
	}
}

// fieldErrs lists the (path, specific error) pairs of a joined error.
func fieldErrs(t *testing.T, err error) map[string]error {
	t.Helper()
	out := map[string]error{}
	var walk func(error)
	walk = func(e error) {
		var fe *FieldError
		switch {
		case e == nil:
		case errors.As(e, &fe) && e == error(fe):
			if _, dup := out[fe.Path]; dup {
				t.Errorf("path %s reported twice", fe.Path)
			}
			out[fe.Path] = fe.Err
		default:
			if j, ok := e.(interface{ Unwrap() []error }); ok {
				for _, x := range j.Unwrap() {
					walk(x)
				}
				return
			}
			t.Errorf("error %v is not a *FieldError", e)
		}
	}
	walk(err)
	return out
}

func TestPriceBookValidationErrors(t *testing.T) {
	file := `{
  "currency": "usd",
  "gpu_prices": [
    {"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"},
    {"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.60"},
    {"gpu_type": "", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1"},
    {"gpu_type": "A100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "-1.00"},
    {"gpu_type": "A100", "pool": "spot", "effective_from": "yesterday", "per_hour": "4.1.0"},
    {"gpu_type": "L4", "effective_from": "2026-01-01T00:00:00Z", "per_hour": 0.8},
    {"gpu_type": "L4", "pool": "*", "region": "a|b", "effective_from": "2026-01-01T00:00:00Z"},
    {"gpu_type": "L40S", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1e3"},
    {"gpu_type": "H200", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "0.0000000001"},
    {"gpu_type": "H200", "effective_from": "2026-01-01T01:00:00+01:00", "per_hour": "3"}
  ],
  "token_prices": [
    {"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "-2"},
    {"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "2"},
    {"model": "n", "input_per_1m": "1", "cached_input_per_1m": "x"}
  ],
  "allocation": {"busy_policy": "gpu_memory", "idle_policy": "shared", "weighted_tokens": {"input_weight": "0", "output_weight": "0"}}
}`
	_, err := ParsePriceBook([]byte(file))
	if !errors.Is(err, ErrInvalidPriceBook) {
		t.Fatalf("got %v, want ErrInvalidPriceBook", err)
	}
	got := fieldErrs(t, err)
	want := map[string]error{
		"currency":                            ErrInvalidField,
		"gpu_prices[1]":                       ErrDuplicatePrice,
		"gpu_prices[2].gpu_type":              ErrMissingField,
		"gpu_prices[3].per_hour":              ErrNegativePrice,
		"gpu_prices[4].effective_from":        ErrInvalidField,
		"gpu_prices[4].per_hour":              ErrInvalidMoney,
		"gpu_prices[5].per_hour":              ErrInvalidMoney, // a JSON number
		"gpu_prices[6].pool":                  ErrInvalidField,
		"gpu_prices[6].region":                ErrInvalidField,
		"gpu_prices[6].per_hour":              ErrMissingField,
		"gpu_prices[7].per_hour":              ErrInvalidMoney,
		"gpu_prices[8].per_hour":              ErrInvalidMoney, // 10 decimals
		"gpu_prices[9]":                       ErrDuplicatePrice,
		"token_prices[0].output_per_1m":       ErrNegativePrice,
		"token_prices[1]":                     ErrDuplicatePrice,
		"token_prices[2].effective_from":      ErrMissingField,
		"token_prices[2].cached_input_per_1m": ErrInvalidMoney,
		"token_prices[2].output_per_1m":       ErrMissingField,
		"allocation.busy_policy":              ErrUnknownPolicy,
		"allocation.idle_policy":              ErrUnknownPolicy,
		"allocation.weighted_tokens":          ErrUnknownPolicy,
	}
	for path, w := range want {
		g, ok := got[path]
		if !ok {
			t.Errorf("no error at %s, want %v", path, w)
			continue
		}
		if !errors.Is(g, w) {
			t.Errorf("%s: got %v, want %v", path, g, w)
		}
	}
	for path, g := range got {
		if _, ok := want[path]; !ok {
			t.Errorf("unexpected error at %s: %v", path, g)
		}
	}
}

func TestParsePriceBookStructuralErrors(t *testing.T) {
	for _, in := range []string{
		`{"gpu_prices": [{"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "usd_per_hour": "3"}]}`, // unknown field
		`{"currency": "USD"`,
		`{"currency": "USD"} {}`,
		`[]`,
	} {
		if _, err := ParsePriceBook([]byte(in)); !errors.Is(err, ErrInvalidPriceBook) {
			t.Errorf("ParsePriceBook(%s): got %v, want ErrInvalidPriceBook", in, err)
		}
	}
}

func TestValidateProgrammaticBook(t *testing.T) {
	b := &PriceBook{
		Currency: "EUR",
		GPUPrices: []GPUPrice{
			{GPUType: "H100", EffectiveFrom: ts("2026-01-01T00:00:00Z"), PerHour: 1},
			{GPUType: "H100", EffectiveFrom: ts("2026-01-01T01:00:00+01:00"), PerHour: 2}, // the same instant
		},
		Allocation: DefaultPolicy(),
	}
	got := fieldErrs(t, b.Validate())
	if len(got) != 1 || !errors.Is(got["gpu_prices[1]"], ErrDuplicatePrice) {
		t.Errorf("got %v, want one ErrDuplicatePrice at gpu_prices[1]", got)
	}
	b.GPUPrices = b.GPUPrices[:1]
	if err := b.Validate(); err != nil {
		t.Errorf("valid book: %v", err)
	}
}

func TestGPUPriceMostSpecific(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [
	  {"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1"},
	  {"gpu_type": "H100", "region": "eu", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "2"},
	  {"gpu_type": "H100", "pool": "spot", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3"},
	  {"gpu_type": "H100", "pool": "spot", "region": "eu", "effective_from": "2026-02-01T00:00:00Z", "per_hour": "4"},
	  {"gpu_type": "H100", "effective_from": "2026-03-01T00:00:00Z", "per_hour": "5"},
	  {"gpu_type": "A100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "6"}
	]}`)
	tests := []struct {
		gpuType, pool, region, at string
		want                      string // per_hour, "" = none
	}{
		{"H100", "", "", "2025-12-31T23:59:59Z", ""},             // before any price
		{"H100", "", "", "2026-01-01T00:00:00Z", "1"},            // effective_from is inclusive
		{"H100", "on-demand", "us", "2026-01-15T00:00:00Z", "1"}, // only the wildcard matches
		{"H100", "on-demand", "eu", "2026-01-15T00:00:00Z", "2"}, // region beats wildcard
		{"H100", "spot", "us", "2026-01-15T00:00:00Z", "3"},      // pool beats wildcard
		{"H100", "spot", "eu", "2026-01-15T00:00:00Z", "3"},      // pool beats region; pool+region not yet in force
		{"H100", "spot", "eu", "2026-02-01T00:00:00Z", "4"},      // pool+region beats all
		{"H100", "spot", "eu", "2026-03-15T00:00:00Z", "4"},      // a newer wildcard does not beat a more specific entry
		{"H100", "on-demand", "us", "2026-03-15T00:00:00Z", "5"}, // the newer wildcard replaces the older one
		{"H100", "on-demand", "eu", "2026-03-15T00:00:00Z", "2"},
		{"A100", "spot", "eu", "2026-03-15T00:00:00Z", "6"},
		{"B200", "", "", "2026-03-15T00:00:00Z", ""}, // unknown type
		{"h100", "", "", "2026-03-15T00:00:00Z", ""}, // types match exactly
	}
	for _, tt := range tests {
		p, ok := b.GPUPrice(tt.gpuType, tt.pool, tt.region, ts(tt.at))
		got := ""
		if ok {
			got = p.PerHour.String()
		}
		if got != tt.want {
			t.Errorf("GPUPrice(%s, %s, %s, %s) = %q, want %q", tt.gpuType, tt.pool, tt.region, tt.at, got, tt.want)
		}
	}
	p, _ := b.GPUPrice("H100", "spot", "eu", ts("2026-02-01T00:00:00Z"))
	if got, want := p.ID(), "gpu:H100|spot|eu@2026-02-01T00:00:00Z"; got != want {
		t.Errorf("ID() = %q, want %q", got, want)
	}
	p, _ = b.GPUPrice("H100", "spot", "us", ts("2026-02-01T00:00:00Z"))
	if got, want := p.ID(), "gpu:H100|spot|*@2026-01-01T00:00:00Z"; got != want {
		t.Errorf("ID() = %q, want %q", got, want)
	}
}

func TestGPUPriceChanges(t *testing.T) {
	b := mustBook(t, `{"gpu_prices": [
	  {"gpu_type": "H100", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1"},
	  {"gpu_type": "H100", "effective_from": "2026-01-01T10:30:00Z", "per_hour": "2"},
	  {"gpu_type": "H100", "pool": "spot", "effective_from": "2026-01-01T10:15:00Z", "per_hour": "3"},
	  {"gpu_type": "H100", "region": "eu", "effective_from": "2026-01-01T10:45:00Z", "per_hour": "4"}
	]}`)
	from, to := ts("2026-01-01T10:00:00Z"), ts("2026-01-01T11:00:00Z")
	tests := []struct {
		pool, region string
		want         []time.Time
	}{
		{"", "", []time.Time{ts("2026-01-01T10:30:00Z")}},
		// spot takes over at 10:15; the wildcard change at 10:30 does not
		// change the spot price.
		{"spot", "", []time.Time{ts("2026-01-01T10:15:00Z")}},
		{"", "eu", []time.Time{ts("2026-01-01T10:30:00Z"), ts("2026-01-01T10:45:00Z")}},
		{"spot", "eu", []time.Time{ts("2026-01-01T10:15:00Z")}}, // pool beats region
	}
	for _, tt := range tests {
		got := b.GPUPriceChanges("H100", tt.pool, tt.region, from, to)
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("GPUPriceChanges(H100, %q, %q) (-want +got):\n%s", tt.pool, tt.region, diff)
		}
	}
	if got := b.GPUPriceChanges("H100", "", "", ts("2026-01-01T10:30:00Z"), to); got != nil {
		t.Errorf("a change at from is not inside (from, to): got %v", got)
	}
}

func TestTokenPriceAndListCharge(t *testing.T) {
	b := mustBook(t, `{"token_prices": [
	  {"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"},
	  {"model": "m", "effective_from": "2026-02-01T00:00:00Z", "input_per_1m": "0.50", "output_per_1m": "1.50"}
	]}`)
	tests := []struct {
		at                    string
		input, cached, output int64
		want                  string
		wantID                string
		wantOK                bool
	}{
		// (1,000,000 − 400,000) × 0.60 + 400,000 × 0.30 + 500,000 × 1.80
		// = 360,000 + 120,000 + 900,000 = 1,380,000 dollar-tokens / 1e6 = 1.38
		{"2026-01-15T00:00:00Z", 1_000_000, 400_000, 500_000, "1.38", "token:m@2026-01-01T00:00:00Z", true},
		// 1 input token at 0.60 per 1M = 0.0000006 = 600 nano-units.
		{"2026-01-15T00:00:00Z", 1, 0, 0, "0.0000006", "token:m@2026-01-01T00:00:00Z", true},
		// 1 output token at 1.50 per 1M (cached price defaulted) = 1500 nano.
		{"2026-02-01T00:00:00Z", 0, 0, 1, "0.0000015", "token:m@2026-02-01T00:00:00Z", true},
		// 3 cached tokens at 0.50 (default = input) = 1.5e-6: exact, no rounding.
		{"2026-02-01T00:00:00Z", 3, 3, 0, "0.0000015", "token:m@2026-02-01T00:00:00Z", true},
		{"2025-12-31T00:00:00Z", 1, 0, 0, "0", "", false}, // no price yet
		{"2026-01-15T00:00:00Z", 1, 2, 0, "0", "", false}, // cached > input
		{"2026-01-15T00:00:00Z", -1, 0, 0, "0", "", false},
	}
	for _, tt := range tests {
		got, id, ok := b.ListCharge("m", ts(tt.at), tt.input, tt.cached, tt.output)
		if got.String() != tt.want || id != tt.wantID || ok != tt.wantOK {
			t.Errorf("ListCharge(m, %s, %d, %d, %d) = %s, %q, %v; want %s, %q, %v",
				tt.at, tt.input, tt.cached, tt.output, got, id, ok, tt.want, tt.wantID, tt.wantOK)
		}
	}
	if _, _, ok := b.ListCharge("other", ts("2026-03-01T00:00:00Z"), 1, 0, 0); ok {
		t.Error("ListCharge of a model without price: ok")
	}
}

func TestListChargeRoundsOnceHalfEven(t *testing.T) {
	// A price of 0.000000001 per 1M: each token costs 1e-15; 500,000 tokens
	// cost 0.5 nano-units, which rounds to 0 (even); 1,500,000 to 2.
	b := mustBook(t, `{"token_prices": [{"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.000000001", "output_per_1m": "0.000000001"}]}`)
	at := ts("2026-01-02T00:00:00Z")
	for _, tt := range []struct {
		in, out int64
		want    Money
	}{{500_000, 0, 0}, {1_500_000, 0, 2}, {250_000, 250_000, 0}, {750_000, 750_000, 2}, {600_000, 0, 1}} {
		got, _, _ := b.ListCharge("m", at, tt.in, 0, tt.out)
		if got != tt.want {
			t.Errorf("ListCharge(in %d, out %d) = %d nano, want %d", tt.in, tt.out, got, tt.want)
		}
	}
}

func TestVersionIsCanonical(t *testing.T) {
	a := mustBook(t, exampleBook)
	// The same book: entries reordered, amounts and times spelt differently,
	// defaults written out.
	b := mustBook(t, `{
  "gpu_prices": [
    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-01-01T01:00:00+01:00", "per_hour": "3.5"},
    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "region": "us-east-1", "effective_from": "2026-01-01T00:00:00.000Z", "per_hour": "4.100000000"}
  ],
  "token_prices": [
    {"model": "llama-3.1-70b", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "0.6", "cached_input_per_1m": "0.3", "output_per_1m": "1.8"}
  ],
  "allocation": {"busy_policy": "tokens", "idle_policy": "separate", "weighted_tokens": {"input_weight": "1.0", "cached_input_weight": "1", "output_weight": "3"}}
}`)
	if a.Version() != b.Version() {
		t.Errorf("equal books have versions %s and %s", a.Version(), b.Version())
	}
	if len(a.Version()) != 12 {
		t.Errorf("Version() = %q, want 12 hex digits", a.Version())
	}
	ja, _ := a.MarshalJSON()
	want := `{"currency":"USD","gpu_prices":[` +
		`{"gpu_type":"H100-SXM-80GB","effective_from":"2026-01-01T00:00:00Z","per_hour":"3.5"},` +
		`{"gpu_type":"H100-SXM-80GB","pool":"on-demand","region":"us-east-1","effective_from":"2026-01-01T00:00:00Z","per_hour":"4.1"}],` +
		`"token_prices":[{"model":"llama-3.1-70b","effective_from":"2026-01-01T00:00:00Z","input_per_1m":"0.6","cached_input_per_1m":"0.3","output_per_1m":"1.8"}],` +
		`"allocation":{"busy_policy":"tokens","idle_policy":"separate","weighted_tokens":{"input_weight":"1","cached_input_weight":"1","output_weight":"3"}}}`
	if string(ja) != want {
		t.Errorf("canonical JSON:\ngot  %s\nwant %s", ja, want)
	}
	// The canonical form parses back to the same version.
	if c := mustBook(t, string(ja)); c.Version() != a.Version() {
		t.Errorf("canonical form re-parsed: version %s, want %s", c.Version(), a.Version())
	}
	// encoding/json round trip through MarshalJSON and UnmarshalJSON.
	var d PriceBook
	if err := json.Unmarshal(ja, &d); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(mustBook(t, string(ja)), &d); diff != "" {
		t.Errorf("json.Unmarshal of the canonical form (-want +got):\n%s", diff)
	}
	if err := json.Unmarshal([]byte(`{"gpu_prices":[{"gpu_type":"x","effective_from":"2026-01-01T00:00:00Z","per_hour":"1e3"}]}`), &d); !errors.Is(err, ErrInvalidMoney) {
		t.Errorf("json.Unmarshal of a bad amount: got %v, want ErrInvalidMoney", err)
	}
	// A different price is a different version.
	a.GPUPrices[0].PerHour++
	if a.Version() == b.Version() {
		t.Error("a changed price kept the version")
	}
}

func mustBook(t testing.TB, s string) *PriceBook {
	t.Helper()
	b, err := ParsePriceBook([]byte(s))
	if err != nil {
		t.Fatalf("ParsePriceBook: %v", err)
	}
	return b
}

func TestPolicyParse(t *testing.T) {
	for _, p := range BusyPolicies() {
		if got, err := ParseBusyPolicy(string(p)); err != nil || got != p {
			t.Errorf("ParseBusyPolicy(%s) = %s, %v", p, got, err)
		}
	}
	for _, p := range IdlePolicies() {
		if got, err := ParseIdlePolicy(string(p)); err != nil || got != p {
			t.Errorf("ParseIdlePolicy(%s) = %s, %v", p, got, err)
		}
	}
	for _, s := range []string{"", "Tokens", "weighted", "gpu_memory"} {
		if _, err := ParseBusyPolicy(s); !errors.Is(err, ErrUnknownPolicy) {
			t.Errorf("ParseBusyPolicy(%q): got %v, want ErrUnknownPolicy", s, err)
		}
		if _, err := ParseIdlePolicy(s); !errors.Is(err, ErrUnknownPolicy) {
			t.Errorf("ParseIdlePolicy(%q): got %v, want ErrUnknownPolicy", s, err)
		}
	}
	p := Policy{Busy: BusyWeightedTokens, Idle: IdleSeparate}
	if err := p.Validate(); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("weighted_tokens with zero weights: got %v, want ErrUnknownPolicy", err)
	}
	p.Busy = BusyTokens
	if err := p.Validate(); err != nil {
		t.Errorf("tokens ignores weights: %v", err)
	}
	if !strings.Contains(IdleTenant, "idle") {
		t.Errorf("IdleTenant = %q", IdleTenant)
	}
}
