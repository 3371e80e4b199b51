package billing

import (
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// TenantUsage is one tenant's usage in one deployment-hour.
type TenantUsage struct {
	// Tenant names the tenant; it may not be empty or IdleTenant. A caller
	// that wants finer lines (tenant and model) may pass a composite name.
	Tenant string `json:"tenant"`
	// InputTokens includes CachedInputTokens.
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	Requests          int64 `json:"requests"`
	// E2EMillis is Σ end-to-end latency of the requests in milliseconds, the
	// basis of BusyRequestTime.
	E2EMillis int64 `json:"e2e_ms"`
}

// hasTraffic reports whether the tenant sent anything in the hour.
func (u TenantUsage) hasTraffic() bool {
	return u.Requests > 0 || u.InputTokens > 0 || u.OutputTokens > 0 || u.E2EMillis > 0
}

func (u TenantUsage) validate() error {
	switch {
	case u.Tenant == "":
		return fmt.Errorf("%w: empty tenant", ErrInvalidUsage)
	case u.Tenant == IdleTenant:
		return fmt.Errorf("%w: tenant name %q is reserved", ErrInvalidUsage, IdleTenant)
	case u.InputTokens < 0 || u.CachedInputTokens < 0 || u.OutputTokens < 0 || u.Requests < 0 || u.E2EMillis < 0:
		return fmt.Errorf("%w: tenant %q: negative usage", ErrInvalidUsage, u.Tenant)
	case u.CachedInputTokens > u.InputTokens:
		return fmt.Errorf("%w: tenant %q: cached input tokens %d > input tokens %d", ErrInvalidUsage, u.Tenant, u.CachedInputTokens, u.InputTokens)
	}
	return nil
}

// basis returns the tenant's busy basis under p: tokens, milliseconds, or
// weighted tokens in nano-units of weight. ok is false when it does not fit
// in 64 bits (only possible for weighted tokens); basisBig then has it.
func (u TenantUsage) basis(p Policy) (v uint64, ok bool) {
	switch p.Busy {
	case BusyWeightedTokens:
		var hiSum, loSum uint64
		for _, x := range [3][2]uint64{
			{uint64(u.InputTokens - u.CachedInputTokens), uint64(p.Weights.Input)},
			{uint64(u.CachedInputTokens), uint64(p.Weights.CachedInput)},
			{uint64(u.OutputTokens), uint64(p.Weights.Output)},
		} {
			hi, lo := bits.Mul64(x[0], x[1])
			var c uint64
			loSum, c = bits.Add64(loSum, lo, 0)
			hiSum += hi + c
		}
		return loSum, hiSum == 0
	case BusyRequestTime:
		return uint64(u.E2EMillis), true
	default:
		return uint64(u.InputTokens) + uint64(u.OutputTokens), true // < 2^64: both < 2^63
	}
}

// basisBig is basis as a big.Int, whatever its size.
func (u TenantUsage) basisBig(p Policy) *big.Int {
	if v, ok := u.basis(p); ok {
		return new(big.Int).SetUint64(v)
	}
	b, t := new(big.Int), new(big.Int)
	for _, x := range [3][2]int64{
		{u.InputTokens - u.CachedInputTokens, int64(p.Weights.Input)},
		{u.CachedInputTokens, int64(p.Weights.CachedInput)},
		{u.OutputTokens, int64(p.Weights.Output)},
	} {
		b.Add(b, t.Mul(t.SetInt64(x[0]), big.NewInt(x[1])))
	}
	return b
}

// Amount is an exact non-negative quantity: a busy basis in tokens,
// milliseconds or weighted tokens (which may have up to 9 decimals). Its
// text form is an exact decimal without trailing zeros ("1234", "3702.5").
// The zero value is 0.
type Amount struct {
	u    uint64   // the value, when n is nil
	n    *big.Int // the value, when it does not fit in u; never modified
	nano bool     // the value is in units of 1e-9
}

func (a Amount) bigInt() *big.Int {
	if a.n != nil {
		return new(big.Int).Set(a.n)
	}
	return new(big.Int).SetUint64(a.u)
}

// Rat returns the amount as a new big.Rat.
func (a Amount) Rat() *big.Rat {
	r := new(big.Rat).SetInt(a.bigInt())
	if a.nano {
		r.Quo(r, big.NewRat(nanosPerUnit, 1))
	}
	return r
}

// Sign returns 0 for zero and +1 otherwise.
func (a Amount) Sign() int {
	if a.u == 0 && (a.n == nil || a.n.Sign() == 0) {
		return 0
	}
	return 1
}

// String writes the amount as an exact decimal with no trailing zeros.
func (a Amount) String() string {
	if a.n == nil && !a.nano {
		return strconv.FormatUint(a.u, 10)
	}
	s := a.bigInt().String()
	if !a.nano {
		return s
	}
	if len(s) <= 9 {
		s = strings.Repeat("0", 10-len(s)) + s
	}
	units, frac := s[:len(s)-9], strings.TrimRight(s[len(s)-9:], "0")
	if frac == "" {
		return units
	}
	return units + "." + frac
}

// MarshalText writes the amount as String does.
func (a Amount) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Line is one line of an allocation: a tenant's share of a deployment-hour's
// GPU cost, or the IdleTenant line.
type Line struct {
	Tenant string `json:"tenant"`
	// Basis is the tenant's busy basis under the busy policy (0 for the
	// IdleTenant line).
	Basis Amount `json:"basis"`
	// Busy is the line's share of the busy cost, Idle its share of the idle
	// cost; Total = Busy + Idle.
	Busy  Money `json:"busy"`
	Idle  Money `json:"idle"`
	Total Money `json:"total"`
	// Usage is the tenant's usage as given (zero for the IdleTenant line).
	Usage TenantUsage `json:"usage"`
}

// Allocation is a deployment-hour's GPU cost split into lines. Σ Total over
// Lines = Cost, Σ Busy = the hour's BusyCost, Σ Idle = its IdleCost, exactly.
type Allocation struct {
	BusyPolicy BusyPolicy `json:"busy_policy"`
	IdlePolicy IdlePolicy `json:"idle_policy"`
	// Cost is the deployment-hour's GPU cost (GPUCost.Cost).
	Cost Money `json:"cost"`
	// Lines holds one line per tenant given, sorted by tenant, then, when the
	// hour has GPU time, the IdleTenant line (possibly zero) last.
	Lines []Line `json:"lines"`
	// Unattributed is set when tenants have usage but the deployment-hour
	// has no GPU time: the lines carry the usage and zero money because the
	// cost is unknown, not because it is zero.
	Unattributed bool `json:"unattributed"`
	// ZeroBasis is set when tenants have traffic but their busy basis is 0
	// in total (e.g. only failed requests with no tokens under the tokens
	// policy): the busy cost could not be split by usage and was handled like
	// idle cost (see AllocateHour).
	ZeroBasis bool `json:"zero_basis"`
	// UnpricedSeconds is GPUCost.UnpricedSeconds: GPU time whose cost is
	// unknown and therefore in no line.
	UnpricedSeconds float64 `json:"unpriced_seconds"`
}

// AllocateHour splits one deployment-hour's GPU cost among its tenants by
// policy p (OpenCost's semantics, exact to the nano-unit):
//
//   - Busy cost: in proportion to each tenant's basis under p.Busy.
//   - Idle cost: IdleSeparate keeps it on the IdleTenant line;
//     IdleSharedWeighted splits it in proportion to the busy basis;
//     IdleSharedEven splits it equally among the tenants with traffic
//     (requests, tokens or latency above zero).
//   - Each split is by Allocate (largest remainder; ties to the tenant name
//     that sorts first), so Σ Busy, Σ Idle and Σ Total over the lines equal
//     the hour's BusyCost, IdleCost and Cost exactly.
//
// Edge cases:
//
//   - No GPU time (no samples) but tenants: the lines carry the usage, zero
//     money, and Unattributed is set; there is no IdleTenant line. No GPU
//     time and no tenants: no lines.
//   - GPU time but no tenant with traffic: the whole cost (busy part and
//     idle part) goes to the IdleTenant line whatever the idle policy, since
//     there is nobody to charge.
//   - Tenants with traffic but a total basis of 0 (only failed requests
//     without tokens under tokens or weighted_tokens; E2E of 0 under
//     request_time): usage explains none of the busy cost, so, as OpenCost
//     does with unexplained cost, it is treated as idle: IdleSeparate puts it
//     on the IdleTenant line, the shared policies split busy and idle cost
//     equally among the tenants with traffic. ZeroBasis is set.
//   - A tenant with traffic but a zero basis (failed requests among others'
//     successful ones) pays no busy cost, no idle cost under
//     IdleSharedWeighted, and an equal share under IdleSharedEven.
//   - Unpriced GPU time is in no line; UnpricedSeconds says how much.
//
// The result does not depend on the order of usage. Errors wrap
// ErrUnknownPolicy or ErrInvalidUsage (an invalid, repeated or reserved
// tenant).
func AllocateHour(cost GPUCost, usage []TenantUsage, p Policy) (Allocation, error) {
	if err := p.Validate(); err != nil {
		return Allocation{}, err
	}
	tenants := sortedByTenant(usage)
	n := len(tenants)
	a := Allocation{
		BusyPolicy:      p.Busy,
		IdlePolicy:      p.Idle,
		Cost:            cost.Cost,
		Lines:           make([]Line, n, n+1),
		UnpricedSeconds: cost.UnpricedSeconds,
	}
	basis := make([]uint64, n)
	even := make([]uint64, n)
	var basisSum, active uint64
	fits := true // every basis and their sum fit in 64 bits
	nano := p.Busy == BusyWeightedTokens
	for i, u := range tenants {
		if err := u.validate(); err != nil {
			return Allocation{}, err
		}
		if i > 0 && tenants[i-1].Tenant == u.Tenant {
			return Allocation{}, fmt.Errorf("%w: tenant %q appears twice", ErrInvalidUsage, u.Tenant)
		}
		if u.hasTraffic() {
			even[i] = 1
			active++
		}
		line := Line{Tenant: u.Tenant, Usage: u}
		v, ok := u.basis(p)
		if ok {
			basis[i] = v
			line.Basis = Amount{u: v, nano: nano}
			var carry uint64
			basisSum, carry = bits.Add64(basisSum, v, 0)
			fits = fits && carry == 0
		} else {
			line.Basis = Amount{n: u.basisBig(p), nano: nano}
			fits = false
		}
		a.Lines[i] = line
	}

	if cost.GPUSeconds == 0 && cost.Cost == 0 {
		a.Unattributed = n > 0
		return a, nil
	}

	// The lines are sorted by tenant and the names are unique, so breaking
	// ties by index is breaking them by name: no keys needed.
	//
	// byBasis splits amount in proportion to the busy basis.
	byBasis := func(amount Money) ([]Money, error) {
		if fits {
			return allocateUint64(amount, basis, basisSum, nil)
		}
		w := make([]*big.Int, n)
		for i, l := range a.Lines {
			w[i] = l.Basis.bigInt()
		}
		return Allocate(amount, w, nil)
	}
	evenly := func(amount Money) ([]Money, error) { return allocateUint64(amount, even, active, nil) }
	zeroBasis := fits && basisSum == 0

	idle := Line{Tenant: IdleTenant}
	var busyShares, idleShares []Money
	var errBusy, errIdle error
	switch {
	case active == 0:
		idle.Busy, idle.Idle = cost.BusyCost, cost.IdleCost
	case zeroBasis:
		a.ZeroBasis = true
		if p.Idle == IdleSeparate {
			idle.Busy, idle.Idle = cost.BusyCost, cost.IdleCost
			break
		}
		busyShares, errBusy = evenly(cost.BusyCost)
		idleShares, errIdle = evenly(cost.IdleCost)
	default:
		busyShares, errBusy = byBasis(cost.BusyCost)
		switch p.Idle {
		case IdleSeparate:
			idle.Idle = cost.IdleCost
		case IdleSharedWeighted:
			idleShares, errIdle = byBasis(cost.IdleCost)
		case IdleSharedEven:
			idleShares, errIdle = evenly(cost.IdleCost)
		}
	}
	if err := errors.Join(errBusy, errIdle); err != nil { // only for a hand-made GPUCost with negative money
		return Allocation{}, fmt.Errorf("allocate deployment-hour: %w", err)
	}
	for i := range a.Lines {
		l := &a.Lines[i]
		if busyShares != nil {
			l.Busy = busyShares[i]
		}
		if idleShares != nil {
			l.Idle = idleShares[i]
		}
		l.Total = l.Busy + l.Idle
	}
	idle.Total = idle.Busy + idle.Idle
	a.Lines = append(a.Lines, idle)
	return a, nil
}

// sortedByTenant returns a copy of usage sorted by tenant name.
func sortedByTenant(usage []TenantUsage) []TenantUsage {
	byName := func(a, b TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) }
	if slices.IsSortedFunc(usage, byName) {
		return slices.Clone(usage)
	}
	// Sort indexes rather than the 64-byte records.
	idx := make([]int32, len(usage))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(i, j int32) int { return strings.Compare(usage[i].Tenant, usage[j].Tenant) })
	out := make([]TenantUsage, len(usage))
	for i, j := range idx {
		out[i] = usage[j]
	}
	return out
}
