package billing

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"time"

	"tokenmeter/internal/ident"
)

// DefaultCurrency is the currency of a price book that names none.
const DefaultCurrency = "USD"

// GPUPrice is one effective-dated hourly price of a GPU type, optionally
// limited to a pool and a region.
type GPUPrice struct {
	// GPUType is matched exactly against the samples' gpu_type.
	GPUType string
	// Pool limits the price to one pool (e.g. "on-demand", "spot",
	// "reserved"); empty matches any pool.
	Pool string
	// Region limits the price to one region; empty matches any region.
	Region string
	// EffectiveFrom is the first instant the price is in force.
	EffectiveFrom time.Time
	// PerHour is the price of one whole GPU for one hour.
	PerHour Money
}

// ID is the entry's stable id, e.g.
// "gpu:H100-SXM-80GB|on-demand|*@2026-01-01T00:00:00Z".
func (p GPUPrice) ID() string {
	return "gpu:" + p.GPUType + "|" + orStar(p.Pool) + "|" + orStar(p.Region) + "@" + formatTime(p.EffectiveFrom)
}

// specificity ranks how narrowly an entry matches: pool and region 3, pool
// 2, region 1, neither 0.
func (p GPUPrice) specificity() int {
	s := 0
	if p.Pool != "" {
		s += 2
	}
	if p.Region != "" {
		s++
	}
	return s
}

func (p GPUPrice) matches(gpuType, pool, region string) bool {
	return p.GPUType == gpuType && (p.Pool == "" || p.Pool == pool) && (p.Region == "" || p.Region == region)
}

// TokenPrice is one effective-dated list price of a model's tokens.
type TokenPrice struct {
	Model         string
	EffectiveFrom time.Time
	// InputPer1M is the price of one million input tokens not served from a
	// prefix cache.
	InputPer1M Money
	// CachedInputPer1M is the price of one million cached input tokens.
	CachedInputPer1M Money
	// OutputPer1M is the price of one million output tokens.
	OutputPer1M Money
}

// ID is the entry's stable id, e.g. "token:llama-3.1-70b@2026-01-01T00:00:00Z".
func (p TokenPrice) ID() string {
	return "token:" + p.Model + "@" + formatTime(p.EffectiveFrom)
}

// PriceBook is a set of effective-dated prices in one currency, plus the
// default allocation policy. Its JSON form is the price file described in
// the package documentation; MarshalJSON writes the canonical form.
//
// A PriceBook is plain data: build one with ParsePriceBook (which validates)
// or by hand followed by Validate. Methods do not modify it and may be called
// concurrently.
type PriceBook struct {
	// Currency is an ISO 4217 code; all money of the book is in it.
	Currency    string
	GPUPrices   []GPUPrice
	TokenPrices []TokenPrice
	// Allocation is the default allocation policy.
	Allocation Policy
}

// ParsePriceBook decodes a price file and validates it. The error joins every
// problem found (each a *FieldError with its path, wrapping
// ErrInvalidPriceBook), except for JSON syntax errors and unknown fields,
// which stop the decoding and wrap ErrInvalidPriceBook alone.
func ParsePriceBook(data []byte) (*PriceBook, error) {
	b, bad, err := decodePriceBook(data)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, fe := range bad {
		errs = append(errs, fe)
	}
	reported := make(map[string]bool, len(bad))
	for _, fe := range bad {
		reported[fe.Path] = true
	}
	for _, fe := range b.problems() {
		if !reported[fe.Path] { // a field that did not decode is reported once
			errs = append(errs, fe)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return b, nil
}

// Validate reports every problem of the book, joined with errors.Join; each is
// a *FieldError whose Path names the field (e.g. "gpu_prices[3].per_hour").
func (b *PriceBook) Validate() error {
	var errs []error
	for _, fe := range b.problems() {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

func (b *PriceBook) problems() []*FieldError {
	var out []*FieldError
	add := func(path string, err error) { out = append(out, &FieldError{Path: path, Err: err}) }

	if !isCurrency(b.Currency) {
		add("currency", fmt.Errorf("%w: %q is not three upper-case letters", ErrInvalidField, b.Currency))
	}

	type gpuKey struct {
		gpuType, pool, region, from string
	}
	seenGPU := map[gpuKey]int{}
	for i, p := range b.GPUPrices {
		path := fmt.Sprintf("gpu_prices[%d]", i)
		checkName(add, path+".gpu_type", p.GPUType, true)
		checkName(add, path+".pool", p.Pool, false)
		checkName(add, path+".region", p.Region, false)
		checkEffectiveFrom(add, path+".effective_from", p.EffectiveFrom)
		if p.PerHour < 0 {
			add(path+".per_hour", fmt.Errorf("%w: %s", ErrNegativePrice, p.PerHour))
		}
		k := gpuKey{p.GPUType, p.Pool, p.Region, formatTime(p.EffectiveFrom)}
		if j, ok := seenGPU[k]; ok {
			add(path, fmt.Errorf("%w: same gpu_type, pool, region and effective_from as gpu_prices[%d]", ErrDuplicatePrice, j))
		} else {
			seenGPU[k] = i
		}
	}

	type tokenKey struct{ model, from string }
	seenToken := map[tokenKey]int{}
	for i, p := range b.TokenPrices {
		path := fmt.Sprintf("token_prices[%d]", i)
		checkName(add, path+".model", p.Model, true)
		checkEffectiveFrom(add, path+".effective_from", p.EffectiveFrom)
		for _, f := range []struct {
			name string
			v    Money
		}{{"input_per_1m", p.InputPer1M}, {"cached_input_per_1m", p.CachedInputPer1M}, {"output_per_1m", p.OutputPer1M}} {
			if f.v < 0 {
				add(path+"."+f.name, fmt.Errorf("%w: %s", ErrNegativePrice, f.v))
			}
		}
		k := tokenKey{p.Model, formatTime(p.EffectiveFrom)}
		if j, ok := seenToken[k]; ok {
			add(path, fmt.Errorf("%w: same model and effective_from as token_prices[%d]", ErrDuplicatePrice, j))
		} else {
			seenToken[k] = i
		}
	}

	if _, err := ParseBusyPolicy(string(b.Allocation.Busy)); err != nil {
		add("allocation.busy_policy", err)
	}
	if _, err := ParseIdlePolicy(string(b.Allocation.Idle)); err != nil {
		add("allocation.idle_policy", err)
	}
	if err := b.Allocation.Weights.validate(); err != nil {
		add("allocation.weighted_tokens", err)
	}
	return out
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// checkEffectiveFrom checks that t is set and that its canonical (UTC)
// form is an RFC 3339 time, years 0001 to 9999: "9999-12-31T23:59:59-01:00"
// is year 10000 in UTC, and a book holding it would be stored in a form
// that no longer parses.
func checkEffectiveFrom(add func(string, error), path string, t time.Time) {
	if t.IsZero() {
		add(path, ErrMissingField)
		return
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		add(path, fmt.Errorf("%w: %s is outside the years 0001 to 9999 in UTC", ErrInvalidField, t.Format(time.RFC3339Nano)))
	}
}

// checkName checks a gpu_type, pool, region or model: an identifier by the
// rule of the events and GPU samples it prices (ident.Check: no control or
// invisible characters, no surrounding spaces), with no '|' (the separator
// of price ids), and not "*" (the wildcard of price ids).
func checkName(add func(string, error), path, s string, required bool) {
	if s == "" {
		if required {
			add(path, ErrMissingField)
		}
		return
	}
	if s == "*" {
		add(path, fmt.Errorf("%w: \"*\" is not a wildcard here; leave the field empty to match any", ErrInvalidField))
		return
	}
	if err := ident.Check("", s); err != nil {
		add(path, fmt.Errorf("%w: %w", ErrInvalidField, err))
		return
	}
	if strings.Contains(s, "|") {
		add(path, fmt.Errorf("%w: %q contains '|'", ErrInvalidField, s))
	}
}

// GPUPrice returns the price in force at `at` for a GPU of gpuType in pool
// and region: among the matching entries with EffectiveFrom ≤ at, the most
// specific, then the latest. false when no entry applies.
func (b *PriceBook) GPUPrice(gpuType, pool, region string, at time.Time) (GPUPrice, bool) {
	i := b.gpuPriceIndex(gpuType, pool, region, at)
	if i < 0 {
		return GPUPrice{}, false
	}
	return b.GPUPrices[i], true
}

// gpuPriceIndex returns the index of the entry GPUPrice would return, or -1.
// Ties (only possible in an invalid book) go to the lowest index.
func (b *PriceBook) gpuPriceIndex(gpuType, pool, region string, at time.Time) int {
	best := -1
	for i, p := range b.GPUPrices {
		if !p.matches(gpuType, pool, region) || p.EffectiveFrom.After(at) {
			continue
		}
		if best < 0 || gpuPriceBefore(p, b.GPUPrices[best]) {
			best = i
		}
	}
	return best
}

// gpuPriceBefore reports whether a outranks b among entries in force: more
// specific first, then later.
func gpuPriceBefore(a, b GPUPrice) bool {
	if sa, sb := a.specificity(), b.specificity(); sa != sb {
		return sa > sb
	}
	return a.EffectiveFrom.After(b.EffectiveFrom)
}

// GPUPriceChanges returns the instants t with from < t < to at which the
// GPU price in force for (gpuType, pool, region) changes to another entry,
// ascending: a sample taken at t or later pays the new price, one taken
// before t the old. Nil when one price (or none) holds throughout.
func (b *PriceBook) GPUPriceChanges(gpuType, pool, region string, from, to time.Time) []time.Time {
	var starts []time.Time
	for _, p := range b.GPUPrices {
		if p.matches(gpuType, pool, region) && p.EffectiveFrom.After(from) && p.EffectiveFrom.Before(to) {
			starts = append(starts, p.EffectiveFrom)
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	starts = slices.CompactFunc(starts, time.Time.Equal)
	var out []time.Time
	prev := b.gpuPriceIndex(gpuType, pool, region, from)
	for _, t := range starts {
		cur := b.gpuPriceIndex(gpuType, pool, region, t)
		if cur != prev {
			out = append(out, t)
		}
		prev = cur
	}
	return out
}

// TokenPrice returns the model's token price in force at `at`: the entry
// with the latest EffectiveFrom ≤ at. false when none applies.
func (b *PriceBook) TokenPrice(model string, at time.Time) (TokenPrice, bool) {
	best := -1
	for i, p := range b.TokenPrices {
		if p.Model != model || p.EffectiveFrom.After(at) {
			continue
		}
		if best < 0 || p.EffectiveFrom.After(b.TokenPrices[best].EffectiveFrom) {
			best = i
		}
	}
	if best < 0 {
		return TokenPrice{}, false
	}
	return b.TokenPrices[best], true
}

// ListCharge returns the list-price charge of one model's tokens at `at`:
// (input − cachedInput) × input_per_1m + cachedInput × cached_input_per_1m +
// output × output_per_1m, divided by 1,000,000 and rounded half to even to a
// nano-unit once (not per term), with the id of the price used. ok is false
// when the model has no price at `at`, when a count is negative or
// cachedInput > input, or when the charge is out of the range of Money.
func (b *PriceBook) ListCharge(model string, at time.Time, input, cachedInput, output int64) (charge Money, priceID string, ok bool) {
	if input < 0 || cachedInput < 0 || output < 0 || cachedInput > input {
		return 0, "", false
	}
	p, found := b.TokenPrice(model, at)
	if !found {
		return 0, "", false
	}
	sum := new(big.Int)
	term := new(big.Int)
	for _, t := range [3][2]int64{
		{input - cachedInput, int64(p.InputPer1M)},
		{cachedInput, int64(p.CachedInputPer1M)},
		{output, int64(p.OutputPer1M)},
	} {
		term.SetInt64(t[0])
		sum.Add(sum, term.Mul(term, big.NewInt(t[1])))
	}
	m, err := moneyFromRat(new(big.Rat).SetFrac(sum, big.NewInt(1_000_000)))
	if err != nil {
		return 0, "", false
	}
	return m, p.ID(), true
}

// Version is the book's content hash: the first 12 hex digits of the SHA-256
// of its canonical JSON. Books that differ only in the order of entries, the
// spelling of amounts ("4.10" or "4.1") or of times, or in defaults written
// out or left implicit, have the same version.
func (b *PriceBook) Version() string {
	data, _ := b.MarshalJSON() // cannot fail: every field has a plain JSON form
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:12]
}

// The JSON form. Money and weights are decoded from raw values so that a
// bad amount is reported at its path and decoding goes on; times as strings
// for the same reason.

type priceBookJSON struct {
	Currency    string           `json:"currency"`
	GPUPrices   []gpuPriceJSON   `json:"gpu_prices"`
	TokenPrices []tokenPriceJSON `json:"token_prices"`
	Allocation  *policyJSON      `json:"allocation,omitempty"`
}

type gpuPriceJSON struct {
	GPUType       string          `json:"gpu_type"`
	Pool          string          `json:"pool,omitempty"`
	Region        string          `json:"region,omitempty"`
	EffectiveFrom string          `json:"effective_from"`
	PerHour       json.RawMessage `json:"per_hour"`
}

type tokenPriceJSON struct {
	Model            string          `json:"model"`
	EffectiveFrom    string          `json:"effective_from"`
	InputPer1M       json.RawMessage `json:"input_per_1m"`
	CachedInputPer1M json.RawMessage `json:"cached_input_per_1m,omitempty"`
	OutputPer1M      json.RawMessage `json:"output_per_1m"`
}

type policyJSON struct {
	BusyPolicy     string       `json:"busy_policy,omitempty"`
	IdlePolicy     string       `json:"idle_policy,omitempty"`
	WeightedTokens *weightsJSON `json:"weighted_tokens,omitempty"`
}

type weightsJSON struct {
	InputWeight       json.RawMessage `json:"input_weight,omitempty"`
	CachedInputWeight json.RawMessage `json:"cached_input_weight,omitempty"`
	OutputWeight      json.RawMessage `json:"output_weight,omitempty"`
}

// decodePriceBook decodes data strictly. Problems with single values are
// returned as FieldErrors (the value is left zero); a syntax error or an
// unknown field is returned as err.
func decodePriceBook(data []byte) (*PriceBook, []*FieldError, error) {
	var raw priceBookJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, nil, fmt.Errorf("%w: decode: %w", ErrInvalidPriceBook, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, fmt.Errorf("%w: decode: data after the top-level object", ErrInvalidPriceBook)
	}
	var bad []*FieldError
	add := func(path string, err error) { bad = append(bad, &FieldError{Path: path, Err: err}) }
	money := func(path string, v json.RawMessage, required bool) Money {
		if v == nil {
			if required {
				add(path, ErrMissingField)
			}
			return 0
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			add(path, fmt.Errorf("%w: %s is not a JSON string (write amounts as \"4.10\")", ErrInvalidMoney, v))
			return 0
		}
		m, err := ParseMoney(s)
		if err != nil {
			add(path, err)
		}
		return m
	}
	weight := func(path string, v json.RawMessage, def Weight) Weight {
		if v == nil {
			return def
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			add(path, fmt.Errorf("%w: %s is not a JSON string", ErrInvalidWeight, v))
			return def
		}
		w, err := ParseWeight(s)
		if err != nil {
			add(path, err)
			return def
		}
		return w
	}
	timeAt := func(path, s string) time.Time {
		if s == "" {
			return time.Time{} // Validate reports the missing field
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			add(path, fmt.Errorf("%w: %q is not an RFC 3339 time", ErrInvalidField, s))
			return time.Time{}
		}
		return t.UTC()
	}

	b := &PriceBook{Currency: raw.Currency, Allocation: DefaultPolicy()}
	if b.Currency == "" {
		b.Currency = DefaultCurrency
	}
	for i, p := range raw.GPUPrices {
		path := fmt.Sprintf("gpu_prices[%d]", i)
		b.GPUPrices = append(b.GPUPrices, GPUPrice{
			GPUType:       p.GPUType,
			Pool:          p.Pool,
			Region:        p.Region,
			EffectiveFrom: timeAt(path+".effective_from", p.EffectiveFrom),
			PerHour:       money(path+".per_hour", p.PerHour, true),
		})
	}
	for i, p := range raw.TokenPrices {
		path := fmt.Sprintf("token_prices[%d]", i)
		in := money(path+".input_per_1m", p.InputPer1M, true)
		cached := in
		if p.CachedInputPer1M != nil {
			cached = money(path+".cached_input_per_1m", p.CachedInputPer1M, true)
		}
		b.TokenPrices = append(b.TokenPrices, TokenPrice{
			Model:            p.Model,
			EffectiveFrom:    timeAt(path+".effective_from", p.EffectiveFrom),
			InputPer1M:       in,
			CachedInputPer1M: cached,
			OutputPer1M:      money(path+".output_per_1m", p.OutputPer1M, true),
		})
	}
	if a := raw.Allocation; a != nil {
		if a.BusyPolicy != "" {
			b.Allocation.Busy = BusyPolicy(a.BusyPolicy)
		}
		if a.IdlePolicy != "" {
			b.Allocation.Idle = IdlePolicy(a.IdlePolicy)
		}
		if w := a.WeightedTokens; w != nil {
			const path = "allocation.weighted_tokens"
			one := Weight(nanosPerUnit)
			in := weight(path+".input_weight", w.InputWeight, one)
			b.Allocation.Weights = TokenWeights{
				Input:       in,
				CachedInput: weight(path+".cached_input_weight", w.CachedInputWeight, in),
				Output:      weight(path+".output_weight", w.OutputWeight, one),
			}
		}
	}
	return b, bad, nil
}

// UnmarshalJSON decodes a price file without validating it (ParsePriceBook
// also validates). Defaults are filled in: currency USD, cached input price =
// input price, the default policy and weights.
func (b *PriceBook) UnmarshalJSON(data []byte) error {
	nb, bad, err := decodePriceBook(data)
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		errs := make([]error, len(bad))
		for i, fe := range bad {
			errs[i] = fe
		}
		return errors.Join(errs...)
	}
	*b = *nb
	return nil
}

// MarshalJSON writes the canonical form: compact, entries sorted (GPU prices
// by gpu_type, pool, region, effective_from; token prices by model,
// effective_from), times in UTC, amounts in their shortest decimal form,
// every default written out.
func (b PriceBook) MarshalJSON() ([]byte, error) {
	type gpuOut struct {
		GPUType       string `json:"gpu_type"`
		Pool          string `json:"pool,omitempty"`
		Region        string `json:"region,omitempty"`
		EffectiveFrom string `json:"effective_from"`
		PerHour       Money  `json:"per_hour"`
	}
	type tokenOut struct {
		Model            string `json:"model"`
		EffectiveFrom    string `json:"effective_from"`
		InputPer1M       Money  `json:"input_per_1m"`
		CachedInputPer1M Money  `json:"cached_input_per_1m"`
		OutputPer1M      Money  `json:"output_per_1m"`
	}
	type bookOut struct {
		Currency    string     `json:"currency"`
		GPUPrices   []gpuOut   `json:"gpu_prices"`
		TokenPrices []tokenOut `json:"token_prices"`
		Allocation  Policy     `json:"allocation"`
	}
	gpu := slices.Clone(b.GPUPrices)
	slices.SortStableFunc(gpu, func(x, y GPUPrice) int {
		return cmp.Or(
			strings.Compare(x.GPUType, y.GPUType),
			strings.Compare(x.Pool, y.Pool),
			strings.Compare(x.Region, y.Region),
			x.EffectiveFrom.Compare(y.EffectiveFrom),
		)
	})
	tok := slices.Clone(b.TokenPrices)
	slices.SortStableFunc(tok, func(x, y TokenPrice) int {
		return cmp.Or(strings.Compare(x.Model, y.Model), x.EffectiveFrom.Compare(y.EffectiveFrom))
	})
	out := bookOut{
		Currency:    b.Currency,
		GPUPrices:   make([]gpuOut, 0, len(gpu)),
		TokenPrices: make([]tokenOut, 0, len(tok)),
		Allocation:  b.Allocation,
	}
	for _, p := range gpu {
		out.GPUPrices = append(out.GPUPrices, gpuOut{p.GPUType, p.Pool, p.Region, formatTime(p.EffectiveFrom), p.PerHour})
	}
	for _, p := range tok {
		out.TokenPrices = append(out.TokenPrices, tokenOut{p.Model, formatTime(p.EffectiveFrom), p.InputPer1M, p.CachedInputPer1M, p.OutputPer1M})
	}
	return json.Marshal(out)
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func orStar(s string) string {
	if s == "" {
		return "*"
	}
	return s
}
