package billing

import (
	"errors"
	"testing"

	"tokenmeter/internal/ident"
)

// TestPriceBookNamesAreIdentifiers: the names a price book prices follow the
// identifier rule of the events and samples they price.
func TestPriceBookNamesAreIdentifiers(t *testing.T) {
	file := `{
  "gpu_prices": [
    {"gpu_type": "H100\u200b", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"},
    {"gpu_type": "H100", "pool": "spot\u0000", "region": "eu\u2060", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"},
    {"gpu_type": "A100", "pool": "on demand", "region": "eu west", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "1"}
  ],
  "token_prices": [
    {"model": "\ufeffllama", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "2"},
    {"model": "llama ", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "2"},
    {"model": "ll\u202ema", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "2"}
  ]
}`
	_, err := ParsePriceBook([]byte(file))
	got := fieldErrs(t, err)
	want := []string{"gpu_prices[0].gpu_type", "gpu_prices[1].pool", "gpu_prices[1].region",
		"token_prices[0].model", "token_prices[1].model", "token_prices[2].model"}
	for _, path := range want {
		g, ok := got[path]
		if !ok {
			t.Errorf("no error at %s, want one wrapping ident.ErrInvalid", path)
			continue
		}
		if !errors.Is(g, ErrInvalidField) || !errors.Is(g, ident.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalidField and ident.ErrInvalid", path, g)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d errors, want %d: %v", len(got), len(want), err)
	}
}
