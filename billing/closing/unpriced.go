package closing

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"tokenmeter/billing"
)

// ErrUnpricedUsage marks a close refused because a tenant's usage has no
// list price: billed at zero, it would be lost revenue that no one
// decided. Price the models (put a price book that prices them from the
// period's start) and close again, or close with FlagUnpriced to bill the
// rest and flag the unpriced requests on the statement.
var ErrUnpricedUsage = errors.New("unpriced usage")

// UnpricedError is a tenant's close refused for unpriced usage; it wraps
// ErrUnpricedUsage.
type UnpricedError struct {
	Tenant, Period string
	// Models are the models without a list price and their requests, by
	// model name.
	Models []UnpricedModel
}

// UnpricedModel is a model without a list price in a statement.
type UnpricedModel struct {
	Model    string
	Requests uint64
}

func (e *UnpricedError) Error() string {
	parts := make([]string, len(e.Models))
	for i, m := range e.Models {
		parts[i] = fmt.Sprintf("model %q: %d requests", m.Model, m.Requests)
	}
	return fmt.Sprintf("%s: tenant %s's %s has usage without a list price (%s): price the models from the period's start and close again, or close with flag_unpriced to bill the rest and flag these requests on the statement",
		ErrUnpricedUsage, e.Tenant, e.Period, strings.Join(parts, ", "))
}

// Is makes errors.Is(err, ErrUnpricedUsage) hold.
func (e *UnpricedError) Is(target error) bool { return target == ErrUnpricedUsage }

// unpricedOf is the UnpricedError of st: its usage and late-usage lines
// without a list price, or nil when it has none.
func unpricedOf(st *billing.Statement) *UnpricedError {
	requests := map[string]uint64{}
	for _, l := range st.Lines {
		if !l.Priced && (l.Kind == billing.LineUsage || l.Kind == billing.LineAdjustment) {
			requests[l.Model] += l.Requests
		}
	}
	if len(requests) == 0 {
		return nil
	}
	e := &UnpricedError{Tenant: st.Tenant, Period: st.Period}
	for _, m := range slices.Sorted(maps.Keys(requests)) {
		e.Models = append(e.Models, UnpricedModel{Model: m, Requests: requests[m]})
	}
	return e
}
