package billing

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func bigs(ws ...int64) []*big.Int {
	out := make([]*big.Int, len(ws))
	for i, w := range ws {
		out[i] = big.NewInt(w)
	}
	return out
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name    string
		total   Money
		weights []int64
		keys    []string
		want    []Money
	}{
		{"exact", 100, []int64{1, 3}, []string{"a", "b"}, []Money{25, 75}},
		{"tie to the first key", 10, []int64{1, 1, 1}, []string{"a", "b", "c"}, []Money{4, 3, 3}},
		{"tie by key, not by position", 10, []int64{1, 1, 1}, []string{"c", "b", "a"}, []Money{3, 3, 4}},
		{"two left over", 11, []int64{1, 1, 1}, []string{"a", "b", "c"}, []Money{4, 4, 3}},
		{"tie by index without keys", 10, []int64{1, 1, 1}, nil, []Money{4, 3, 3}},
		// 2e9 × 4/9 = 888888888.89, × 2/9 = 444444444.44, × 3/9 = 666666666.67:
		// the 2 left over go to the largest remainders, not to the first keys.
		{"larger remainder first", 2_000_000_000, []int64{4000, 2000, 3000}, []string{"a", "b", "c"}, []Money{888888889, 444444444, 666666667}},
		{"zero weight gets nothing", 7, []int64{0, 1, 0}, []string{"a", "b", "c"}, []Money{0, 7, 0}},
		{"zero total", 0, []int64{1, 2}, []string{"a", "b"}, []Money{0, 0}},
		{"zero total, zero weights", 0, []int64{0, 0}, []string{"a", "b"}, []Money{0, 0}},
		{"nothing to split", 0, nil, nil, []Money{}},
		{"max total", math.MaxInt64, []int64{1, 1}, []string{"a", "b"}, []Money{math.MaxInt64/2 + 1, math.MaxInt64 / 2}},
		{"max weights", 3, []int64{math.MaxInt64, math.MaxInt64, 1}, []string{"a", "b", "c"}, []Money{2, 1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Allocate(tt.total, bigs(tt.weights...), tt.keys)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Allocate(%d, %v) (-want +got):\n%s", tt.total, tt.weights, diff)
			}
		})
	}
}

func TestAllocateErrors(t *testing.T) {
	tests := []struct {
		name    string
		total   Money
		weights []*big.Int
		keys    []string
		want    error
	}{
		{"zero weights", 1, bigs(0, 0), []string{"a", "b"}, ErrZeroWeights},
		{"no weights", 1, nil, nil, ErrZeroWeights},
		{"negative weight", 1, bigs(1, -1), []string{"a", "b"}, ErrInvalidUsage},
		{"nil weight", 1, []*big.Int{nil}, []string{"a"}, ErrInvalidUsage},
		{"negative total", -1, bigs(1), []string{"a"}, ErrInvalidUsage},
		{"keys mismatch", 1, bigs(1, 1), []string{"a"}, ErrInvalidUsage},
	}
	for _, tt := range tests {
		if _, err := Allocate(tt.total, tt.weights, tt.keys); !errors.Is(err, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestAllocateBigWeights checks the big.Int path against the 64-bit path:
// scaling every weight by 2^80 must not change the shares.
func TestAllocateBigWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	scale := new(big.Int).Lsh(big.NewInt(1), 80)
	for range 500 {
		n := 1 + rng.IntN(20)
		ws := make([]*big.Int, n)
		scaled := make([]*big.Int, n)
		keys := make([]string, n)
		for i := range ws {
			ws[i] = big.NewInt(rng.Int64N(1000))
			scaled[i] = new(big.Int).Mul(ws[i], scale)
			keys[i] = string(rune('a' + rng.IntN(26)))
		}
		ws[0].SetInt64(1 + ws[0].Int64())
		scaled[0].Mul(ws[0], scale)
		total := Money(rng.Int64N(1e12))
		a, err := Allocate(total, ws, keys)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Allocate(total, scaled, keys)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("weights %v total %d: fast and big paths differ (-fast +big):\n%s", ws, total, diff)
		}
		checkHamilton(t, total, ws, a)
	}
}

// checkHamilton checks that shares add up to total and that each is the
// floor or the ceiling of its exact quota.
func checkHamilton(t *testing.T, total Money, weights []*big.Int, shares []Money) {
	t.Helper()
	sum := new(big.Int)
	for _, w := range weights {
		sum.Add(sum, w)
	}
	var got Money
	for i, s := range shares {
		got += s
		q := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(int64(total)), weights[i]), sum)
		floor := new(big.Int).Quo(q.Num(), q.Denom()).Int64()
		if int64(s) != floor && int64(s) != floor+1 {
			t.Fatalf("share %d = %d, quota %s", i, s, q.FloatString(3))
		}
		if q.IsInt() && int64(s) != floor {
			t.Fatalf("share %d = %d, exact quota %s", i, s, q.FloatString(0))
		}
	}
	if got != total {
		t.Fatalf("shares add up to %d, want %d", got, total)
	}
}

func TestAllocateHourErrors(t *testing.T) {
	cost := GPUCost{GPUSeconds: 3600, Cost: 100, BusyCost: 60, IdleCost: 40}
	p := DefaultPolicy()
	tests := []struct {
		name  string
		usage []TenantUsage
		p     Policy
		want  error
	}{
		{"empty tenant", []TenantUsage{{Tenant: "", Requests: 1}}, p, ErrInvalidUsage},
		{"reserved tenant", []TenantUsage{{Tenant: IdleTenant, Requests: 1}}, p, ErrInvalidUsage},
		{"repeated tenant", []TenantUsage{{Tenant: "a", Requests: 1}, {Tenant: "b"}, {Tenant: "a"}}, p, ErrInvalidUsage},
		{"negative tokens", []TenantUsage{{Tenant: "a", OutputTokens: -1}}, p, ErrInvalidUsage},
		{"cached above input", []TenantUsage{{Tenant: "a", InputTokens: 1, CachedInputTokens: 2}}, p, ErrInvalidUsage},
		{"unknown busy policy", nil, Policy{Busy: "gpu_memory", Idle: IdleSeparate}, ErrUnknownPolicy},
		{"unknown idle policy", nil, Policy{Busy: BusyTokens, Idle: "shared"}, ErrUnknownPolicy},
		{"empty policy", nil, Policy{}, ErrUnknownPolicy},
	}
	for _, tt := range tests {
		if _, err := AllocateHour(cost, tt.usage, tt.p); !errors.Is(err, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestAllocateHourNoGPUNoTenants(t *testing.T) {
	a, err := AllocateHour(GPUCost{}, nil, DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if a.Unattributed || len(a.Lines) != 0 {
		t.Errorf("got %+v, want no lines and not unattributed", a)
	}
}

func TestAllocateHourWeightedFractionalBasis(t *testing.T) {
	// Weights 0.5 (input), 0.25 (cached input), 1.5 (output): a's basis is
	// 0.5×3 + 0.25×1 + 1.5×1 = 3.25, b's 1.5×2 = 3; busy 625 splits 325:300
	// exactly: 325 and 300.
	p := Policy{Busy: BusyWeightedTokens, Idle: IdleSeparate, Weights: TokenWeights{
		Input: 500_000_000, CachedInput: 250_000_000, Output: 1_500_000_000,
	}}
	cost := GPUCost{GPUSeconds: 1, Cost: 1000, BusyCost: 625, IdleCost: 375}
	a, err := AllocateHour(cost, []TenantUsage{
		{Tenant: "b", OutputTokens: 2, Requests: 1},
		{Tenant: "a", InputTokens: 4, CachedInputTokens: 1, OutputTokens: 1, Requests: 1},
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Tenant, Basis string
		Busy, Idle    Money
	}
	var got []row
	for _, l := range a.Lines {
		got = append(got, row{l.Tenant, l.Basis.String(), l.Busy, l.Idle})
	}
	want := []row{{"a", "3.25", 325, 0}, {"b", "3", 300, 0}, {IdleTenant, "0", 0, 375}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestAmountString(t *testing.T) {
	huge, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	tests := []struct {
		a    Amount
		want string
		rat  *big.Rat
	}{
		{Amount{}, "0", big.NewRat(0, 1)},
		{Amount{u: 1234}, "1234", big.NewRat(1234, 1)},
		{Amount{u: 3_702_500_000_000, nano: true}, "3702.5", big.NewRat(7405, 2)},
		{Amount{u: 1, nano: true}, "0.000000001", big.NewRat(1, 1_000_000_000)},
		{Amount{u: 3_000_000_000, nano: true}, "3", big.NewRat(3, 1)},
		{Amount{u: 0, nano: true}, "0", big.NewRat(0, 1)},
		{Amount{n: huge}, "123456789012345678901234567890", new(big.Rat).SetInt(huge)},
		{Amount{n: huge, nano: true}, "123456789012345678901.23456789", new(big.Rat).SetFrac(huge, big.NewInt(1_000_000_000))},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.a, got, tt.want)
		}
		if got := tt.a.Rat(); got.Cmp(tt.rat) != 0 {
			t.Errorf("%+v.Rat() = %s, want %s", tt.a, got, tt.rat)
		}
		if got, want := tt.a.Sign(), tt.rat.Sign(); got != want {
			t.Errorf("%+v.Sign() = %d, want %d", tt.a, got, want)
		}
	}
}

func TestAllocateHourHugeWeightedBasis(t *testing.T) {
	// Bases beyond 64 bits take the big.Int path and still add up.
	p := Policy{Busy: BusyWeightedTokens, Idle: IdleSharedWeighted, Weights: TokenWeights{
		Input: 9_000_000_000_000_000_000, CachedInput: 1, Output: 9_000_000_000_000_000_000,
	}}
	cost := GPUCost{GPUSeconds: 1, Cost: 1_000_000_001, BusyCost: 600_000_001, IdleCost: 400_000_000}
	a, err := AllocateHour(cost, []TenantUsage{
		{Tenant: "a", InputTokens: 1 << 40, OutputTokens: 1 << 40, Requests: 1},
		{Tenant: "b", InputTokens: 1 << 41, OutputTokens: 1 << 40, Requests: 1},
		{Tenant: "c", InputTokens: 3, CachedInputTokens: 3, Requests: 1},
	}, p)
	if err != nil {
		t.Fatal(err)
	}
	checkReconciles(t, cost, a)
	if got, want := a.Lines[2].Basis.String(), "0.000000003"; got != want {
		t.Errorf("c's basis %s, want %s", got, want)
	}
}

func TestCostPer1K(t *testing.T) {
	tests := []struct {
		cost   Money
		tokens int64
		want   Money
		ok     bool
	}{
		{1_000_000_000, 1000, 1_000_000_000, true}, // 1.00 for 1k tokens
		{1_000_000_000, 3000, 333_333_333, true},   // 0.333333333 1/3
		{2_000_000_000, 3000, 666_666_667, true},   // 0.666666666 2/3 rounds up
		{1, 2000, 0, true},                         // 0.5 nano rounds half to even: 0
		{3, 2000, 2, true},                         // 1.5 nano rounds to 2
		{5, 0, 0, false},                           // no tokens: no figure
		{5, -1, 0, false},
		{math.MaxInt64, 1, 0, false}, // out of range
	}
	for _, tt := range tests {
		got, ok := CostPer1K(tt.cost, tt.tokens)
		if got != tt.want || ok != tt.ok {
			t.Errorf("CostPer1K(%s, %d) = %s, %v; want %s, %v", tt.cost, tt.tokens, got, ok, tt.want, tt.ok)
		}
	}
	if got, ok := TokensPerGPUHour(1000, 1800); !ok || got != 2000 {
		t.Errorf("TokensPerGPUHour(1000, 1800) = %v, %v; want 2000", got, ok)
	}
	if _, ok := TokensPerGPUHour(1000, 0); ok {
		t.Error("TokensPerGPUHour over 0 GPU-seconds: ok")
	}
}
