// Package closing closes billing periods into stored statements: for each
// tenant, in its own time zone, it checks that the period may close (ended,
// a grace delay passed, ingest caught up), reads the period's usage cut at
// the price changes, computes the statement (package billing) and stores it
// once. A closed statement never changes: closing again returns it as
// stored.
package closing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
)

// UsageReader reads a tenant's usage of a range per model and deployment,
// cut at the given instants; *query.Service implements it.
type UsageReader interface {
	StatementUsage(ctx context.Context, tenant string, start, end time.Time, cuts []time.Time) ([]billing.StatementUsage, error)
}

// Store keeps closed statements, each written once; *chstore.Store
// implements it.
type Store interface {
	Statement(ctx context.Context, tenant, period string) (billing.StoredStatement, bool, error)
	SaveStatement(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error)
}

// Tenant is a tenant to bill and its time zone.
type Tenant struct {
	ID   string
	Zone *time.Location
}

// Request is one close.
type Request struct {
	// Period is the month to close, "2026-11", in each tenant's zone.
	Period  string
	Tenants []Tenant
	// Now is the time of the close; Grace how long after a period's end
	// it may close (billing.DefaultGrace when zero); CaughtUp the instant up
	// to which ingest has every event.
	Now, CaughtUp time.Time
	Grace         time.Duration
	// Book prices the usage; ByDeployment splits lines per deployment.
	Book         *billing.PriceBook
	ByDeployment bool
}

// Closer closes periods.
type Closer struct {
	usage UsageReader
	store Store
}

// New returns a Closer reading usage from usage and storing statements in
// store.
func New(usage UsageReader, store Store) *Closer { return &Closer{usage: usage, store: store} }

// Close closes req.Period for every tenant of req, returning each tenant's
// statement as stored, in tenant order. It checks every tenant first and
// closes none when one may not close yet (errors wrap
// billing.ErrPeriodNotEnded or billing.ErrIngestBehind); a tenant already
// closed keeps its statement.
func (c *Closer) Close(ctx context.Context, req Request) ([]billing.StoredStatement, error) {
	if req.Book == nil {
		return nil, errors.New("close: no price book")
	}
	grace := req.Grace
	if grace == 0 {
		grace = billing.DefaultGrace
	}
	tenants := slices.Clone(req.Tenants)
	slices.SortFunc(tenants, func(a, b Tenant) int { return strings.Compare(a.ID, b.ID) })
	periods := make([]billing.Period, len(tenants))
	var errs []error
	for i, t := range tenants {
		p, err := billing.ParsePeriod(req.Period, t.Zone)
		if err == nil {
			err = p.CheckClose(req.Now, grace, req.CaughtUp)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t.ID, err))
		}
		periods[i] = p
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := make([]billing.StoredStatement, 0, len(tenants))
	for i, t := range tenants {
		st, err := c.closeOne(ctx, t.ID, periods[i], req)
		if err != nil {
			return out, err
		}
		out = append(out, st)
	}
	return out, nil
}

// closeOne closes one tenant's period.
func (c *Closer) closeOne(ctx context.Context, tenant string, p billing.Period, req Request) (billing.StoredStatement, error) {
	if cur, ok, err := c.store.Statement(ctx, tenant, p.Key); err != nil || ok {
		return cur, err
	}
	var cuts []time.Time
	for _, tp := range req.Book.TokenPrices {
		if tp.EffectiveFrom.After(p.Start) && tp.EffectiveFrom.Before(p.End) {
			cuts = append(cuts, tp.EffectiveFrom)
		}
	}
	usage, err := c.usage.StatementUsage(ctx, tenant, p.Start, p.End, cuts)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("close %s for %s: %w", p, tenant, err)
	}
	st, err := billing.ComputeStatement(tenant, p, req.Book, usage, req.ByDeployment)
	if err != nil {
		return billing.StoredStatement{}, fmt.Errorf("close %s for %s: %w", p, tenant, err)
	}
	return c.store.SaveStatement(ctx, st, req.Now)
}
