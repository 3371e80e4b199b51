package billing

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func mp(s string) *Money {
	m, err := ParseMoney(s)
	if err != nil {
		panic(err)
	}
	return &m
}

func pctW(s string) Weight {
	w, err := ParseWeight(s)
	if err != nil {
		panic(err)
	}
	return w
}

// TestContractParse reads a contract from an accounts file and reports
// bad fields by path, wrapping ErrInvalidAccounts.
func TestContractParse(t *testing.T) {
	good := `{"operator": {"seller": {}}, "tenants": [{"id": "acme", "buyer": {}, "contract": {
	  "discount_percent": "5",
	  "rate_card": [{"model": "m", "effective_from": "2026-11-01T00:00:00Z", "input_per_1m": "1.5", "discount_percent": "10"}],
	  "allowances": [{"model": "m", "token_kind": "input", "tokens": 1000}],
	  "tiers": [{"model": "m", "tiers": [{"up_to": 100}, {"discount_percent": "20"}]}],
	  "commitment": {"monthly_spend": "100"},
	  "dedicated": [{"deployment": "d", "effective_from": "2026-11-01T00:00:00Z", "per_gpu_hour": "2.4"}]}}]}`
	a, err := ParseAccounts([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	c := a.Tenant("acme").Contract
	if c == nil || *c.RateCard[0].InputPer1M != 1_500_000_000 || c.DiscountPercent != pctW("5") || c.Tiers[0].Tiers[1].DiscountPercent != pctW("20") ||
		c.Commitment.MonthlySpend != 100_000_000_000 || c.Dedicated[0].PerGPUHour != 2_400_000_000 || c.Allowances[0].Tokens != 1000 {
		t.Fatalf("contract = %+v", c)
	}
	bad := `{"operator": {"seller": {}}, "tenants": [{"id": "acme", "buyer": {}, "contract": {
	  "discount_percent": "101",
	  "rate_card": [{"model": "", "effective_from": "2026-11-01T00:00:00Z"},
	                {"model": "m", "effective_from": "2026-11-01T00:00:00Z", "output_per_1m": "-1"}],
	  "allowances": [{"model": "m", "token_kind": "reasoning", "tokens": 0}],
	  "tiers": [{"model": "m", "tiers": [{"up_to": 100}, {"up_to": 50}, {}]}],
	  "commitment": {"monthly_spend": "0"},
	  "dedicated": [{"deployment": "d", "per_gpu_hour": "1"}]}}]}`
	_, err = ParseAccounts([]byte(bad))
	if !errors.Is(err, ErrInvalidAccounts) {
		t.Fatalf("err = %v, want ErrInvalidAccounts", err)
	}
	for _, path := range []string{
		"contract: discount_percent", "contract: rate_card[0].model", "contract: rate_card[0]: ", "contract: rate_card[1].output_per_1m",
		"contract: allowances[0].token_kind", "contract: allowances[0].tokens", "contract: tiers[0].tiers[1].up_to",
		"contract: commitment.monthly_spend", "contract: dedicated[0].effective_from",
	} {
		if !strings.Contains(err.Error(), "tenants[0]."+path) {
			t.Errorf("error does not name %s:\n%v", path, err)
		}
	}
}

// contractBook prices model m at 2 / 0.5 / 8 per 1M and model n at 1 / 1 / 3.
func contractBook(t *testing.T) *PriceBook {
	t.Helper()
	b, err := ParsePriceBook([]byte(`{"currency": "USD", "gpu_prices": [], "token_prices": [
	  {"model": "m", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "2", "cached_input_per_1m": "0.5", "output_per_1m": "8"},
	  {"model": "n", "effective_from": "2026-01-01T00:00:00Z", "input_per_1m": "1", "output_per_1m": "3"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestContractWorkedExample prices a month by hand: a rate card with a
// discount, an allowance, tiers, a dedicated deployment and a commitment.
func TestContractWorkedExample(t *testing.T) {
	book := contractBook(t)
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	at := func(day, hour int) time.Time { return time.Date(2026, 11, day, hour, 0, 0, 0, time.UTC) }
	usage := []StatementUsage{
		// m on d1: 3M input (1M cached), 1M output on the 2nd; 2M input on the 20th.
		{Start: at(2, 0), End: at(2, 1), Model: "m", Deployment: "d1", Requests: 10, InputTokens: 3_000_000, CachedInputTokens: 1_000_000, OutputTokens: 1_000_000},
		{Start: at(20, 0), End: at(20, 1), Model: "m", Deployment: "d1", Requests: 5, InputTokens: 2_000_000},
		// n on the dedicated deployment.
		{Start: at(3, 0), End: at(3, 1), Model: "n", Deployment: "ded", Requests: 7, InputTokens: 5_000_000, OutputTokens: 1_000_000},
	}
	c := &Contract{
		// Rate card for m from the 15th: input 1.5, less 10%.
		RateCard: []RateCardEntry{{Model: "m", EffectiveFrom: at(15, 0), InputPer1M: mp("1.5"), DiscountPercent: pctW("10")}},
		// 500k free output tokens of m.
		Allowances: []Allowance{{Model: "m", TokenKind: TokenOutput, Tokens: 500_000}},
		// m's tokens past 4M: 50% off.
		Tiers:      []TierSchedule{{Model: "m", Tiers: []Tier{{UpTo: 4_000_000}, {DiscountPercent: pctW("50")}}}},
		Dedicated:  []DedicatedDeployment{{Deployment: "ded", EffectiveFrom: at(1, 0), PerGPUHour: 2_000_000_000}},
		Commitment: &Commitment{MonthlySpend: 100_000_000_000},
	}
	hours := []DedicatedHour{{Deployment: "ded", Hour: at(3, 0), MicroHours: 1_500_000}, {Deployment: "ded", Hour: at(3, 1), MicroHours: 2_000_000},
		{Deployment: "other", Hour: at(3, 0), MicroHours: 9_000_000}, {Deployment: "ded", Hour: at(1, 0).Add(-time.Hour), MicroHours: 9_000_000}}
	st, err := ComputeContractStatement("acme", p, book, usage, false, c, hours)
	if err != nil {
		t.Fatal(err)
	}
	// Lines (per deployment: the contract names deployments): m/d1 on the
	// 2nd, m/d1 on the 20th (cut at the rate card's start), n/ded.
	if len(st.Lines) != 3 || st.Lines[0].ChargeStart != at(2, 0) || st.Lines[1].ChargeStart != at(20, 0) || st.Lines[2].Deployment != "ded" {
		t.Fatalf("lines = %+v", st.Lines)
	}
	// Line 0: list 2×2 + 1×0.5 + 1×8 = 12.5. Input 2M: tokens 0-2M of m, tier 1, list. Cached 1M: 2M-3M, list.
	// Output 1M: 500k allowance (free, positions 3M-3.5M), 500k at 3.5M-4M tier 1, list. Contracted 12.5 − 4 = 8.5.
	// Line 1: list 2×2 = 4. Input 2M at positions 4M-6M: tier 2 on rate card 1.5: 1.5 × 0.5 × 0.9 = 0.675 → 1.35.
	// Line 2: dedicated: list 5 + 3 = 8, contracted 0.
	want := []Charge{
		{Kind: ChargeDiscount, Line: 0, TokenKind: TokenOutput, Quantity: "500000", UnitPrice: "0", Rule: "allowance:m/output", Amount: -4_000_000_000},
		{Kind: ChargeDiscount, Line: 1, TokenKind: TokenInput, Quantity: "2000000", UnitPrice: "0.675", Rule: "tier:m#2+rate_card:m@2026-11-15T00:00:00Z", Amount: -2_650_000_000},
		{Kind: ChargeDiscount, Line: 2, TokenKind: TokenInput, Quantity: "5000000", UnitPrice: "0", Rule: "dedicated:ded@2026-11-01T00:00:00Z", Amount: -5_000_000_000},
		{Kind: ChargeDiscount, Line: 2, TokenKind: TokenOutput, Quantity: "1000000", UnitPrice: "0", Rule: "dedicated:ded@2026-11-01T00:00:00Z", Amount: -3_000_000_000},
		// 3.5 GPU-hours × 2.
		{Kind: ChargeDedicated, Line: -1, Quantity: "3.5", UnitPrice: "2", Rule: "dedicated:ded@2026-11-01T00:00:00Z", Amount: 7_000_000_000},
		// Spend 8.5 + 1.35 + 0 + 7 = 16.85: 83.15 short of 100.
		{Kind: ChargeCommitment, Line: -1, Quantity: "1", UnitPrice: "83.15", Rule: "commitment", Amount: 83_150_000_000},
	}
	if len(st.Charges) != len(want) {
		t.Fatalf("charges = %+v", st.Charges)
	}
	for i, w := range want {
		g := st.Charges[i]
		if g.Kind != w.Kind || g.Line != w.Line || g.TokenKind != w.TokenKind || g.Quantity != w.Quantity || g.UnitPrice != w.UnitPrice || g.Rule != w.Rule || g.Amount != w.Amount {
			t.Errorf("charge %d = %+v\nwant %+v", i, g, w)
		}
	}
	if cc := st.Lines[0].ContractedCharge; cc == nil || *cc != 8_500_000_000 || *st.Lines[0].Discount != -4_000_000_000 {
		t.Errorf("line 0 contracted %v discount %v", cc, st.Lines[0].Discount)
	}
	if cc := st.Lines[2].ContractedCharge; cc == nil || *cc != 0 {
		t.Errorf("dedicated line contracted %v, want 0", cc)
	}
	if st.Charge != 100_000_000_000 || st.Total != 100_000_000_000 {
		t.Errorf("charge %s total %s, want 100 (the commitment)", st.Charge, st.Total)
	}
	if !strings.Contains(st.Rounding, "charges' amounts") {
		t.Errorf("rounding = %q", st.Rounding)
	}
	if h, _ := st.ContentHash(); h != st.Hash {
		t.Error("hash is not the content's")
	}
}

// TestContractNilKeepsStatements: without a contract a statement is the
// one ComputeStatement always gave, byte for byte and hash for hash (the
// JSON and hash below are those of the code before contracts).
func TestContractNilKeepsStatements(t *testing.T) {
	book := contractBook(t)
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	usage := []StatementUsage{
		{Start: time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), End: time.Date(2026, 11, 2, 1, 0, 0, 0, time.UTC), Model: "m", Deployment: "d1",
			Requests: 3, InputTokens: 1234567, CachedInputTokens: 1000, OutputTokens: 7654321},
	}
	old, err := ComputeStatement("acme", p, book, usage, false)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ComputeContractStatement("acme", p, book, usage, false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(old)
	b, _ := json.Marshal(st)
	if string(a) != string(b) {
		t.Fatalf("nil contract changed the statement:\n%s\n%s", a, b)
	}
	if err := st.Settle(); err != nil {
		t.Fatal(err)
	}
	if c, _ := json.Marshal(st); string(c) != string(a) {
		t.Fatalf("Settle changed a statement without charges:\n%s\n%s", a, c)
	}
	const wantHash = "65d9699087952a622f33218022b8ef7368443a44977e0c234396b96eb668cdfd"
	if st.Hash != wantHash {
		t.Errorf("hash = %s, want %s (the code before contracts)\n%s", st.Hash, wantHash, a)
	}
}

// TestContractBruteForce prices generated months with random contracts
// and checks every figure against a token-by-token computation in exact
// rationals: each token's contracted price by the rules written in
// Contract's documentation, each line's contracted charge rounded once,
// each discount charge's tokens and amount, the dedicated and commitment
// charges, the statement's charge to the nano-unit and its total to the
// cent.
func TestContractBruteForce(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 60
	}
	for seed := range n {
		rng := rand.New(rand.NewPCG(uint64(seed), 32))
		t.Run(fmt.Sprint(seed), func(t *testing.T) { bruteForceMonth(t, rng) })
	}
}

func bruteForceMonth(t *testing.T, rng *rand.Rand) {
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"m", "n", "o"}[:1+rng.IntN(3)]
	deps := []string{"d1", "d2", "d3"}
	hour := func(h int) time.Time { return p.Start.Add(time.Duration(h) * time.Hour) }
	price := func() Money {
		if rng.IntN(3) == 0 {
			return Money(rng.Int64N(20)) * 250_000_000
		}
		return Money(rng.Int64N(15_000_000_000))
	}
	optPrice := func() *Money {
		if rng.IntN(2) == 0 {
			return nil
		}
		m := price()
		return &m
	}
	pct := func() Weight {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return Weight(rng.Int64N(101)) * nanosPerUnit
		}
		return Weight(rng.Int64N(int64(hundredPercent) + 1))
	}
	book := &PriceBook{Currency: "USD", Allocation: DefaultPolicy()}
	for _, m := range models {
		book.TokenPrices = append(book.TokenPrices, TokenPrice{Model: m, EffectiveFrom: hour(-600), InputPer1M: price(), CachedInputPer1M: price(), OutputPer1M: price()})
		if rng.IntN(2) == 0 {
			book.TokenPrices = append(book.TokenPrices, TokenPrice{Model: m, EffectiveFrom: hour(1 + rng.IntN(700)), InputPer1M: price(), CachedInputPer1M: price(), OutputPer1M: price()})
		}
	}
	c := &Contract{}
	if rng.IntN(2) == 0 {
		c.DiscountPercent = pct()
	}
	for range rng.IntN(5) {
		e := RateCardEntry{Model: models[rng.IntN(len(models))], EffectiveFrom: hour(rng.IntN(800) - 100),
			InputPer1M: optPrice(), CachedInputPer1M: optPrice(), OutputPer1M: optPrice(), DiscountPercent: pct()}
		if rng.IntN(3) == 0 {
			e.Deployment = deps[rng.IntN(3)]
		}
		if e.InputPer1M == nil && e.CachedInputPer1M == nil && e.OutputPer1M == nil && e.DiscountPercent == 0 {
			e.DiscountPercent = nanosPerUnit
		}
		if !slices.ContainsFunc(c.RateCard, func(o RateCardEntry) bool { return o.ID() == e.ID() }) {
			c.RateCard = append(c.RateCard, e)
		}
	}
	for _, m := range models {
		for _, kind := range []string{"", TokenInput, TokenCachedInput, TokenOutput} {
			if rng.IntN(4) == 0 {
				c.Allowances = append(c.Allowances, Allowance{Model: m, TokenKind: kind, Tokens: 1 + uint64(rng.IntN(20_000))})
			}
		}
		if rng.IntN(2) == 0 {
			s := TierSchedule{Model: m}
			var up uint64
			for j := range 1 + rng.IntN(4) {
				up += 1 + uint64(rng.IntN(15_000))
				tr := Tier{UpTo: up, InputPer1M: optPrice(), CachedInputPer1M: optPrice(), OutputPer1M: optPrice(), DiscountPercent: pct()}
				if j > 0 && rng.IntN(3) == 0 {
					tr.UpTo = 0
					s.Tiers = append(s.Tiers, tr)
					break
				}
				s.Tiers = append(s.Tiers, tr)
			}
			c.Tiers = append(c.Tiers, s)
		}
	}
	if rng.IntN(2) == 0 {
		c.Commitment = &Commitment{MonthlySpend: 1 + Money(rng.Int64N(2_000_000_000))}
	}
	var hours []DedicatedHour
	if rng.IntN(2) == 0 {
		d := deps[rng.IntN(3)]
		c.Dedicated = append(c.Dedicated, DedicatedDeployment{Deployment: d, EffectiveFrom: hour(rng.IntN(300) - 50), PerGPUHour: price()})
		if rng.IntN(2) == 0 {
			c.Dedicated = append(c.Dedicated, DedicatedDeployment{Deployment: d, EffectiveFrom: hour(300 + rng.IntN(300)), PerGPUHour: price()})
		}
		for range rng.IntN(30) {
			hours = append(hours, DedicatedHour{Deployment: deps[rng.IntN(3)], Hour: hour(rng.IntN(740) - 10), MicroHours: rng.Int64N(8_000_000)})
		}
	}
	if errs := c.validate(); len(errs) > 0 {
		t.Fatalf("generated an invalid contract: %v", errs)
	}
	var usage []StatementUsage
	for range 1 + rng.IntN(25) {
		h := rng.IntN(720)
		in := uint64(rng.IntN(6_000))
		u := StatementUsage{Start: hour(h), End: hour(h + 1), Model: models[rng.IntN(len(models))], Deployment: deps[rng.IntN(3)],
			Requests: 1 + uint64(rng.IntN(5)), InputTokens: in, CachedInputTokens: uint64(rng.IntN(int(in) + 1)), OutputTokens: uint64(rng.IntN(6_000))}
		usage = append(usage, u)
	}
	octUsage := func(late bool) StatementUsage {
		h := -1 - rng.IntN(700)
		in := uint64(rng.IntN(6_000))
		u := StatementUsage{Start: hour(h), End: hour(h + 1), Model: models[rng.IntN(len(models))], Deployment: deps[rng.IntN(3)],
			Requests: 1, InputTokens: in, CachedInputTokens: uint64(rng.IntN(int(in) + 1)), OutputTokens: uint64(rng.IntN(6_000))}
		if late {
			u.OriginalPeriod = "2026-10"
		}
		return u
	}
	for range rng.IntN(6) { // late usage of October: adjustment lines
		usage = append(usage, octUsage(true))
	}
	// What October billed before: its statement's usage lines, the
	// adjustment lines of a statement in between, what is left of its
	// true-up (the test's input: the lines are at list, as computed).
	var basis []LateBasis
	if rng.IntN(4) != 0 {
		oct, err := ParsePeriod("2026-10", time.UTC)
		if err != nil {
			t.Fatal(err)
		}
		var own, between []StatementUsage
		for range rng.IntN(8) {
			own = append(own, octUsage(false))
		}
		for range rng.IntN(3) {
			between = append(between, octUsage(true))
		}
		b := LateBasis{Period: "2026-10"}
		ost, err := ComputeStatementCut("t", oct, book, own, true, c.Cuts(oct.Start, oct.End))
		if err != nil {
			t.Fatal(err)
		}
		b.Usage = ost.Lines
		if len(between) > 0 {
			bst, err := ComputeStatement("t", p, book, between, true)
			if err != nil {
				t.Fatal(err)
			}
			b.Adjustments = [][]StatementLine{bst.Lines}
		}
		if rng.IntN(2) == 0 {
			b.TrueUp = Money(rng.Int64N(60_000_000))
		}
		basis = append(basis, b)
	}
	if rng.IntN(3) == 0 { // a repricing of October, with what the contract changes in it
		in := uint64(rng.IntN(50_000))
		r := Repriced{InputTokens: in, CachedInputTokens: uint64(rng.IntN(int(in) + 1)), OutputTokens: uint64(rng.IntN(50_000)),
			InputCharge: Money(rng.Int64N(2_000_000)) - 1_000_000, CachedInputCharge: Money(rng.Int64N(2_000_000)) - 1_000_000, OutputCharge: Money(rng.Int64N(2_000_000)) - 1_000_000}
		d := r.InputCharge + r.CachedInputCharge + r.OutputCharge
		k := KindAmounts{Input: -r.InputCharge / 2, CachedInput: -r.CachedInputCharge, Output: Money(rng.Int64N(1_000_000))}
		usage = append(usage, StatementUsage{Start: hour(-720), End: hour(0), Model: models[rng.IntN(len(models))], Deployment: deps[rng.IntN(3)],
			OriginalPeriod: "2026-10", Repricing: &d, Repriced: &r, RepricingDiscount: &k})
	}
	st, err := ComputeContractStatementLate("t", p, book, usage, rng.IntN(2) == 0, c, hours, basis)
	if err != nil {
		t.Fatal(err)
	}
	checkBruteForce(t, st, c, usage, hours, basis)
}

// roundHalfEvenRat rounds r half to even to an integer (written apart from
// the package's roundRat).
func roundHalfEvenRat(r *big.Rat) int64 {
	fl := new(big.Int).Div(r.Num(), r.Denom()) // Euclidean: floor for a positive denominator
	frac := new(big.Rat).Sub(r, new(big.Rat).SetInt(fl))
	switch frac.Cmp(big.NewRat(1, 2)) {
	case 1:
		fl.Add(fl, big.NewInt(1))
	case 0:
		if fl.Bit(0) == 1 {
			fl.Add(fl, big.NewInt(1))
		}
	}
	return fl.Int64()
}

func checkBruteForce(t *testing.T, st Statement, c *Contract, usage []StatementUsage, hours []DedicatedHour, basis []LateBasis) {
	t.Helper()
	// The lines hold the usage: tokens per model add up.
	type sums struct{ in, cached, out uint64 }
	byModel := map[string]sums{}
	for _, u := range usage {
		s := byModel[u.Model]
		byModel[u.Model] = sums{s.in + u.InputTokens, s.cached + u.CachedInputTokens, s.out + u.OutputTokens}
	}
	for _, l := range st.Lines {
		s := byModel[l.Model]
		byModel[l.Model] = sums{s.in - l.InputTokens, s.cached - l.CachedInputTokens, s.out - l.OutputTokens}
		for _, cut := range c.Cuts(l.ChargeStart, l.ChargeEnd) {
			// Late usage is cut at the entries too (its hours lie under
			// one); a repricing spans its period.
			if l.Kind != LineRepricing {
				t.Fatalf("line %+v spans %s", l, cut)
			}
		}
		if l.Deployment == "" && c.NamesDeployments() {
			t.Fatalf("line %+v has no deployment under a contract naming deployments", l)
		}
	}
	for m, s := range byModel {
		if s != (sums{}) {
			t.Fatalf("model %s: lines and usage differ by %+v", m, s)
		}
	}
	// Token by token, in the documented order.
	order := make([]int, 0, len(st.Lines))
	for i := range st.Lines {
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int {
		la, lb := st.Lines[a], st.Lines[b]
		return cmp.Or(la.ChargeStart.Compare(lb.ChargeStart), strings.Compare(la.Deployment, lb.Deployment), a-b)
	})
	// Each period's allowances and tier positions: November's, and
	// October's, which its late usage continues.
	allowances := map[string]map[[2]string]uint64{}
	positions := map[string]map[string]uint64{}
	type bucket struct {
		line  int
		kind  string
		price int64
	}
	want := map[bucket]uint64{} // tokens not at list price
	exactLine := map[int]*big.Rat{}
	spend := new(big.Rat)
	// priceLine prices l token by token; it returns the exact contracted
	// cost and the tokens off list by (kind, price).
	priceLine := func(l StatementLine) (*big.Rat, map[[2]string]uint64) {
		if allowances[l.OriginalPeriod] == nil {
			allowances[l.OriginalPeriod] = map[[2]string]uint64{}
			for _, a := range c.Allowances {
				allowances[l.OriginalPeriod][[2]string{a.Model, a.TokenKind}] = a.Tokens
			}
			positions[l.OriginalPeriod] = map[string]uint64{}
		}
		allowance, pos := allowances[l.OriginalPeriod], positions[l.OriginalPeriod]
		off := map[[2]string]uint64{}
		// The rate-card entry and dedicated entry, by a plain scan.
		var entry *RateCardEntry
		for j := range c.RateCard {
			e := &c.RateCard[j]
			if e.Model != l.Model || e.EffectiveFrom.After(l.ChargeStart) || (e.Deployment != "" && e.Deployment != l.Deployment) {
				continue
			}
			better := entry == nil || (e.Deployment != "" && entry.Deployment == "") ||
				((e.Deployment != "") == (entry.Deployment != "") && e.EffectiveFrom.After(entry.EffectiveFrom))
			if better {
				entry = e
			}
		}
		dedicated := false
		for _, d := range c.Dedicated {
			if d.Deployment == l.Deployment && !d.EffectiveFrom.After(l.ChargeStart) {
				dedicated = true
			}
		}
		var sched []Tier
		for _, s := range c.Tiers {
			if s.Model == l.Model {
				sched = s.Tiers
			}
		}
		exact := new(big.Rat)
		for _, kind := range []string{TokenInput, TokenCachedInput, TokenOutput} {
			var n uint64
			var list Money
			pick := func(in, cached, out *Money) *Money {
				return map[string]*Money{TokenInput: in, TokenCachedInput: cached, TokenOutput: out}[kind]
			}
			switch kind {
			case TokenInput:
				n, list = l.InputTokens-l.CachedInputTokens, l.InputPer1M
			case TokenCachedInput:
				n, list = l.CachedInputTokens, l.CachedInputPer1M
			default:
				n, list = l.OutputTokens, l.OutputPer1M
			}
			counts := map[int64]uint64{}
			memo := map[*Tier]int64{}
			for range n {
				var priceOf int64
				switch {
				case dedicated:
					priceOf = 0
				case allowance[[2]string{l.Model, kind}] > 0:
					allowance[[2]string{l.Model, kind}]--
					pos[l.Model]++
				case allowance[[2]string{l.Model, ""}] > 0:
					allowance[[2]string{l.Model, ""}]--
					pos[l.Model]++
				default:
					var tier *Tier
					for j := range sched {
						if sched[j].UpTo == 0 || pos[l.Model] < sched[j].UpTo {
							tier = &sched[j]
							break
						}
					}
					pos[l.Model]++
					if p, ok := memo[tier]; ok {
						priceOf = p
						break
					}
					r := new(big.Rat).SetInt64(int64(list))
					if entry != nil && pick(entry.InputPer1M, entry.CachedInputPer1M, entry.OutputPer1M) != nil {
						r.SetInt64(int64(*pick(entry.InputPer1M, entry.CachedInputPer1M, entry.OutputPer1M)))
					}
					off := func(w Weight) {
						r.Mul(r, new(big.Rat).Sub(big.NewRat(1, 1), new(big.Rat).SetFrac64(int64(w), 100*nanosPerUnit)))
					}
					if tier != nil {
						if tp := pick(tier.InputPer1M, tier.CachedInputPer1M, tier.OutputPer1M); tp != nil {
							r.SetInt64(int64(*tp))
						}
						off(tier.DiscountPercent)
					}
					if entry != nil {
						off(entry.DiscountPercent)
					}
					off(c.DiscountPercent)
					priceOf = roundHalfEvenRat(r)
					memo[tier] = priceOf
				}
				counts[priceOf]++
			}
			for priceOf, k := range counts {
				exact.Add(exact, new(big.Rat).Mul(new(big.Rat).SetInt64(priceOf), big.NewRat(int64(k), 1_000_000)))
				if priceOf != int64(list) {
					off[[2]string{kind, fmt.Sprint(priceOf)}] += k
				}
			}
		}
		return exact, off
	}
	// October's lines billed before, in the order they were billed.
	for _, b := range basis {
		billedOrder := func(ls []StatementLine) {
			idx := make([]int, len(ls))
			for i := range idx {
				idx[i] = i
			}
			slices.SortStableFunc(idx, func(a, b int) int {
				return cmp.Or(ls[a].ChargeStart.Compare(ls[b].ChargeStart), strings.Compare(ls[a].Deployment, ls[b].Deployment), a-b)
			})
			for _, i := range idx {
				l := ls[i]
				if !l.Priced {
					continue
				}
				l.OriginalPeriod = b.Period // counted in October's allowances and tiers
				priceLine(l)
			}
		}
		billedOrder(b.Usage)
		for _, adj := range b.Adjustments {
			billedOrder(adj)
		}
	}
	// A repricing's contracted difference: its list difference and what
	// the contract changes in it (by kind, from the input).
	repricingKinds := map[int]map[string]Money{}
	for i, l := range st.Lines {
		if l.Kind != LineRepricing {
			continue
		}
		exactLine[i] = new(big.Rat).SetInt64(int64(l.Charge))
		repricingKinds[i] = map[string]Money{}
		for _, u := range usage {
			if u.Repricing != nil && u.Model == l.Model && (l.Deployment == "" || l.Deployment == u.Deployment) {
				k := u.RepricingDiscount
				exactLine[i].Add(exactLine[i], new(big.Rat).SetInt64(int64(k.Input+k.CachedInput+k.Output)))
				repricingKinds[i][TokenInput] += k.Input
				repricingKinds[i][TokenCachedInput] += k.CachedInput
				repricingKinds[i][TokenOutput] += k.Output
			}
		}
	}
	for _, i := range order {
		l := st.Lines[i]
		if !l.Priced || l.Kind == LineRepricing {
			continue
		}
		exact, off := priceLine(l)
		for k, n := range off {
			var pr int64
			fmt.Sscan(k[1], &pr)
			want[bucket{i, k[0], pr}] += n
		}
		exactLine[i] = exact
		if l.Kind == LineUsage {
			spend.Add(spend, new(big.Rat).SetInt64(roundHalfEvenRat(exact)))
		}
	}
	// The discount charges: their tokens by (line, kind, price), their
	// amounts, the lines' contracted charges.
	got := map[bucket]uint64{}
	discountOf := map[int]Money{}
	lastOf := map[int]int{}
	for ci, ch := range st.Charges {
		if ch.Kind != ChargeDiscount {
			continue
		}
		if ch.Rule == "contract_repricing" {
			if st.Lines[ch.Line].Kind != LineRepricing || repricingKinds[ch.Line][ch.TokenKind] != ch.Amount {
				t.Errorf("repricing charge %d %+v, want %s", ci, ch, repricingKinds[ch.Line][ch.TokenKind])
			}
			delete(repricingKinds[ch.Line], ch.TokenKind)
			discountOf[ch.Line] += ch.Amount
			continue
		}
		up, err := ParseMoney(ch.UnitPrice)
		if err != nil {
			t.Fatal(err)
		}
		var q uint64
		fmt.Sscan(ch.Quantity, &q)
		got[bucket{ch.Line, ch.TokenKind, int64(up)}] += q
		discountOf[ch.Line] += ch.Amount
		lastOf[ch.Line] = ci
	}
	for i, left := range repricingKinds {
		for kind, a := range left {
			if a != 0 {
				t.Errorf("repricing line %d: no %s charge of %s", i, kind, a)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("discounted tokens by (line, kind, price):\ngot  %v\nwant %v\ncontract %+v", got, want, c)
	}
	for ci, ch := range st.Charges {
		if ch.Kind != ChargeDiscount || lastOf[ch.Line] == ci || ch.Rule == "contract_repricing" {
			continue
		}
		up, _ := ParseMoney(ch.UnitPrice)
		l := st.Lines[ch.Line]
		list := map[string]Money{TokenInput: l.InputPer1M, TokenCachedInput: l.CachedInputPer1M, TokenOutput: l.OutputPer1M}[ch.TokenKind]
		var q int64
		fmt.Sscan(ch.Quantity, &q)
		if w := roundHalfEvenRat(big.NewRat(q*int64(up-list), 1_000_000)); Money(w) != ch.Amount {
			t.Errorf("charge %d amount %s, want %s", ci, ch.Amount, Money(w))
		}
	}
	for i, l := range st.Lines {
		if !l.Priced {
			if l.ContractedCharge != nil || discountOf[i] != 0 {
				t.Errorf("unpriced line %d has a contracted charge or discounts", i)
			}
			continue
		}
		want := Money(roundHalfEvenRat(exactLine[i]))
		if l.ContractedCharge == nil || *l.ContractedCharge != want || *l.Discount != want-l.Charge || discountOf[i] != want-l.Charge {
			t.Errorf("line %d: contracted %v discount %v (charges %s), want %s − %s", i, l.ContractedCharge, l.Discount, discountOf[i], want, l.Charge)
		}
	}
	// Dedicated: micro-hours per deployment and entry in force at the hour.
	type dk struct {
		dep  string
		from time.Time
	}
	micro := map[dk]int64{}
	rate := map[dk]Money{}
	for _, h := range hours {
		if h.Hour.Before(st.PeriodStart) || !h.Hour.Before(st.PeriodEnd) {
			continue
		}
		var in *DedicatedDeployment
		for j := range c.Dedicated {
			d := &c.Dedicated[j]
			if d.Deployment == h.Deployment && !d.EffectiveFrom.After(h.Hour) && (in == nil || d.EffectiveFrom.After(in.EffectiveFrom)) {
				in = d
			}
		}
		if in != nil && h.MicroHours > 0 {
			micro[dk{in.Deployment, in.EffectiveFrom}] += h.MicroHours
			rate[dk{in.Deployment, in.EffectiveFrom}] = in.PerGPUHour
		}
	}
	var dedicatedN int
	for _, ch := range st.Charges {
		if ch.Kind != ChargeDedicated {
			continue
		}
		dedicatedN++
		var k dk
		for key := range micro {
			if key.dep == ch.Deployment && ch.Rule == (DedicatedDeployment{Deployment: key.dep, EffectiveFrom: key.from}).ID() {
				k = key
			}
		}
		w := roundHalfEvenRat(new(big.Rat).Mul(big.NewRat(micro[k], 1_000_000), new(big.Rat).SetInt64(int64(rate[k]))))
		if Money(w) != ch.Amount {
			t.Errorf("dedicated %s: amount %s, want %s", ch.Rule, ch.Amount, Money(w))
		}
		if q, ok := new(big.Rat).SetString(ch.Quantity); !ok || q.Cmp(big.NewRat(micro[k], 1_000_000)) != 0 {
			t.Errorf("dedicated %s: quantity %s, want %d micro-hours", ch.Rule, ch.Quantity, micro[k])
		}
		spend.Add(spend, new(big.Rat).SetInt64(w))
	}
	if dedicatedN != len(micro) {
		t.Errorf("%d dedicated charges, want %d", dedicatedN, len(micro))
	}
	// Commitment.
	var commitment Money
	if c.Commitment != nil {
		if short := new(big.Rat).Sub(new(big.Rat).SetInt64(int64(c.Commitment.MonthlySpend)), spend); short.Sign() > 0 {
			commitment = Money(short.Num().Int64())
		}
	}
	var gotCommitment, gotAbsorbed Money
	for _, ch := range st.Charges {
		switch {
		case ch.Kind == ChargeCommitment && ch.OriginalPeriod == "":
			gotCommitment += ch.Amount
		case ch.Kind == ChargeCommitment:
			if ch.OriginalPeriod != "2026-10" {
				t.Errorf("a true-up absorbed for %q", ch.OriginalPeriod)
			}
			gotAbsorbed += ch.Amount
		}
	}
	if gotCommitment != commitment {
		t.Errorf("commitment %s, want %s", gotCommitment, commitment)
	}
	// Late usage of October absorbs what is left of October's true-up:
	// October is billed max(commitment, usage) in all.
	var absorbed Money
	for _, b := range basis {
		lateSpend := new(big.Rat)
		for i, l := range st.Lines {
			if l.Kind == LineAdjustment && l.Priced && l.OriginalPeriod == b.Period {
				lateSpend.Add(lateSpend, new(big.Rat).SetInt64(roundHalfEvenRat(exactLine[i])))
			}
		}
		if b.TrueUp > 0 && lateSpend.Sign() > 0 {
			absorbed = -min(Money(lateSpend.Num().Int64()), b.TrueUp)
		}
	}
	if gotAbsorbed != absorbed {
		t.Errorf("October's true-up absorbed %s, want %s", gotAbsorbed, absorbed)
	}
	// The statement: Σ list + Σ (contracted − list) + dedicated + commitment.
	total := new(big.Rat)
	for i, l := range st.Lines {
		if l.Priced {
			total.Add(total, new(big.Rat).SetInt64(roundHalfEvenRat(exactLine[i])))
		}
	}
	total.Add(total, spend.Sub(spend, usageContracted(st, exactLine)))
	total.Add(total, new(big.Rat).SetInt64(int64(commitment+absorbed)))
	if !total.IsInt() || Money(total.Num().Int64()) != st.Charge {
		t.Fatalf("statement charge %s, want %s", st.Charge, total.FloatString(9))
	}
	// To the cent, half away from zero.
	cents := new(big.Rat).Mul(total, big.NewRat(100, nanosPerUnit))
	abs := new(big.Rat).Abs(cents)
	fl := new(big.Int).Div(abs.Num(), abs.Denom())
	if new(big.Rat).Sub(abs, new(big.Rat).SetInt(fl)).Cmp(big.NewRat(1, 2)) >= 0 {
		fl.Add(fl, big.NewInt(1))
	}
	if cents.Sign() < 0 {
		fl.Neg(fl)
	}
	if st.Total != Money(fl.Int64()*10_000_000) {
		t.Fatalf("total %s, want %s cents", st.Total, fl)
	}
	var sum Money
	for _, l := range st.Lines {
		sum += l.Charge
	}
	for _, ch := range st.Charges {
		sum += ch.Amount
	}
	if sum != st.Charge {
		t.Fatalf("Σ lines + Σ charges = %s, charge %s", sum, st.Charge)
	}
}

// usageContracted is the sum of the usage lines' contracted charges (the
// spend without dedicated charges).
func usageContracted(st Statement, exactLine map[int]*big.Rat) *big.Rat {
	s := new(big.Rat)
	for i, l := range st.Lines {
		if l.Kind == LineUsage && l.Priced {
			s.Add(s, new(big.Rat).SetInt64(roundHalfEvenRat(exactLine[i])))
		}
	}
	return s
}

// BenchmarkContractStatement computes one tenant's month under a contract
// (the pure part of a close: 4 models, 2 deployments, a price change, 720
// hourly usage slices, a rate card changing mid-month, tiers, allowances,
// a discount, a commitment and a dedicated deployment's 720 GPU-hours),
// next to the same month at list prices.
func BenchmarkContractStatement(b *testing.B) {
	p, err := ParsePeriod("2026-11", time.UTC)
	if err != nil {
		b.Fatal(err)
	}
	hour := func(h int) time.Time { return p.Start.Add(time.Duration(h) * time.Hour) }
	models := []string{"m1", "m2", "m3", "m4"}
	book := &PriceBook{Currency: "USD", Allocation: DefaultPolicy()}
	c := &Contract{DiscountPercent: 5 * nanosPerUnit, Commitment: &Commitment{MonthlySpend: 1_000_000 * nanosPerUnit},
		Dedicated: []DedicatedDeployment{{Deployment: "ded", EffectiveFrom: hour(-24), PerGPUHour: 2_500_000_000}}}
	price := Money(400_000_000)
	for _, m := range models {
		book.TokenPrices = append(book.TokenPrices, TokenPrice{Model: m, EffectiveFrom: hour(-24), InputPer1M: 600_000_000, CachedInputPer1M: 300_000_000, OutputPer1M: 1_800_000_000},
			TokenPrice{Model: m, EffectiveFrom: hour(14 * 24), InputPer1M: 700_000_000, CachedInputPer1M: 350_000_000, OutputPer1M: 2_100_000_000})
		c.RateCard = append(c.RateCard, RateCardEntry{Model: m, EffectiveFrom: hour(-24), DiscountPercent: 10 * nanosPerUnit},
			RateCardEntry{Model: m, EffectiveFrom: hour(15 * 24), InputPer1M: &price})
		c.Allowances = append(c.Allowances, Allowance{Model: m, TokenKind: TokenInput, Tokens: 1_000_000})
		c.Tiers = append(c.Tiers, TierSchedule{Model: m, Tiers: []Tier{{UpTo: 10_000_000}, {UpTo: 100_000_000, DiscountPercent: 10 * nanosPerUnit}, {DiscountPercent: 20 * nanosPerUnit}}})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var usage []StatementUsage
	var hours []DedicatedHour
	for h := range 720 {
		for _, dep := range []string{"d1", "ded"} {
			in := uint64(rng.IntN(2_000_000))
			usage = append(usage, StatementUsage{Start: hour(h), End: hour(h + 1), Model: models[h%4], Deployment: dep, Requests: 100,
				InputTokens: in, CachedInputTokens: in / 3, OutputTokens: uint64(rng.IntN(500_000))})
		}
		hours = append(hours, DedicatedHour{Deployment: "ded", Hour: hour(h), MicroHours: 8_000_000})
	}
	for _, tc := range []struct {
		name     string
		contract *Contract
	}{{"list", nil}, {"contract", c}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ComputeContractStatement("acme", p, book, usage, false, tc.contract, hours); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
