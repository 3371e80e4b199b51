package billing

// Contract is a tenant's contract: what it pays instead of list prices
// (rate card overrides, discounts, free allowances, volume tiers), a
// committed monthly spend, and dedicated capacity billed per GPU-hour. The
// pricing of a statement under a contract lives in this file.
//
// SKELETON: the fields and rules are being written (issue 32, contracts).
type Contract struct{}

// validate returns every problem of c, each naming its field.
func (c *Contract) validate() []error { return nil }
