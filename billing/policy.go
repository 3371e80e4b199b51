package billing

import "fmt"

// BusyPolicy says how the busy cost of a deployment-hour is split among its
// tenants: in proportion to a basis computed from each tenant's usage.
type BusyPolicy string

// Busy policies.
const (
	// BusyTokens: basis = input tokens + output tokens (cached input tokens
	// are part of input tokens). The default.
	BusyTokens BusyPolicy = "tokens"
	// BusyWeightedTokens: basis = input_weight × uncached input tokens +
	// cached_input_weight × cached input tokens + output_weight × output
	// tokens, with the weights of Policy.Weights.
	BusyWeightedTokens BusyPolicy = "weighted_tokens"
	// BusyRequestTime: basis = Σ end-to-end latency of the tenant's requests
	// in milliseconds (TenantUsage.E2EMillis).
	BusyRequestTime BusyPolicy = "request_time"
)

// IdlePolicy says what happens to the idle cost of a deployment-hour.
type IdlePolicy string

// Idle policies.
const (
	// IdleSeparate: the idle cost is a line of its own, tenant IdleTenant.
	// The default (OpenCost's default too).
	IdleSeparate IdlePolicy = "separate"
	// IdleSharedWeighted: the idle cost is split among the tenants in
	// proportion to the busy basis.
	IdleSharedWeighted IdlePolicy = "shared_weighted"
	// IdleSharedEven: the idle cost is split equally among the tenants with
	// traffic in the deployment-hour.
	IdleSharedEven IdlePolicy = "shared_even"
)

// IdleTenant is the tenant of the line that holds the cost charged to no
// tenant: the idle cost under IdleSeparate, and all the cost of a
// deployment-hour without traffic. It is reserved: no tenant may have this
// name.
const IdleTenant = "__idle__"

// BusyPolicies lists every busy policy, the default first.
func BusyPolicies() []BusyPolicy {
	return []BusyPolicy{BusyTokens, BusyWeightedTokens, BusyRequestTime}
}

// IdlePolicies lists every idle policy, the default first.
func IdlePolicies() []IdlePolicy {
	return []IdlePolicy{IdleSeparate, IdleSharedWeighted, IdleSharedEven}
}

// ParseBusyPolicy returns the busy policy named s; errors wrap
// ErrUnknownPolicy.
func ParseBusyPolicy(s string) (BusyPolicy, error) {
	for _, p := range BusyPolicies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: busy policy %q (want tokens, weighted_tokens or request_time)", ErrUnknownPolicy, s)
}

// ParseIdlePolicy returns the idle policy named s; errors wrap
// ErrUnknownPolicy.
func ParseIdlePolicy(s string) (IdlePolicy, error) {
	for _, p := range IdlePolicies() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: idle policy %q (want separate, shared_weighted or shared_even)", ErrUnknownPolicy, s)
}

// TokenWeights are the weights of BusyWeightedTokens.
type TokenWeights struct {
	// Input weighs input tokens that were not served from a prefix cache.
	Input Weight `json:"input_weight"`
	// CachedInput weighs cached input tokens. In a price book it defaults to
	// Input.
	CachedInput Weight `json:"cached_input_weight"`
	// Output weighs output tokens.
	Output Weight `json:"output_weight"`
}

// Policy is how a deployment-hour's cost is allocated: one busy policy, one
// idle policy, and the weights of BusyWeightedTokens. Its JSON form is the
// "allocation" section of a price book.
type Policy struct {
	Busy    BusyPolicy   `json:"busy_policy"`
	Idle    IdlePolicy   `json:"idle_policy"`
	Weights TokenWeights `json:"weighted_tokens"`
}

// DefaultPolicy is tokens / separate with all weights 1 (weighted_tokens is
// then the same as tokens).
func DefaultPolicy() Policy {
	one := Weight(nanosPerUnit)
	return Policy{
		Busy:    BusyTokens,
		Idle:    IdleSeparate,
		Weights: TokenWeights{Input: one, CachedInput: one, Output: one},
	}
}

// Validate checks that both policies are known and, for BusyWeightedTokens,
// that the weights are not negative and input and output weights are not
// both zero. Errors wrap ErrUnknownPolicy.
func (p Policy) Validate() error {
	if _, err := ParseBusyPolicy(string(p.Busy)); err != nil {
		return err
	}
	if _, err := ParseIdlePolicy(string(p.Idle)); err != nil {
		return err
	}
	if p.Busy == BusyWeightedTokens {
		return p.Weights.validate()
	}
	return nil
}

func (w TokenWeights) validate() error {
	if w.Input < 0 || w.CachedInput < 0 || w.Output < 0 {
		return fmt.Errorf("%w: negative token weight", ErrUnknownPolicy)
	}
	if w.Input == 0 && w.Output == 0 {
		return fmt.Errorf("%w: input_weight and output_weight are both 0", ErrUnknownPolicy)
	}
	return nil
}
