// Package closing closes billing periods into stored statements: for each
// tenant, in its own time zone, it checks that the period may close (ended,
// a grace delay passed, ingest caught up), reads the period's usage cut at
// the price changes, computes the statement (package billing) and stores it
// once. A closed statement never changes: closing again returns it as
// stored.
package closing

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"tokenmeter/billing"
	"tokenmeter/query"
)

// UsageReader reads a tenant's usage of a range per model and deployment,
// cut at the given instants; *query.Service implements it.
type UsageReader interface {
	StatementUsage(ctx context.Context, tenant string, start, end time.Time, cuts []time.Time) ([]billing.StatementUsage, error)
}

// Store keeps closed statements, each written once, and lists the hours
// that inserts touched since an instant (late events); *chstore.Store
// implements it.
type Store interface {
	Statement(ctx context.Context, tenant, period string) (billing.StoredStatement, bool, error)
	SaveStatement(ctx context.Context, st billing.Statement, closedAt time.Time) (billing.StoredStatement, error)
	DirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	// ServerNow is the clock that stamps inserts (and so DirtyHours): a
	// statement's close is stamped with it too.
	ServerNow(ctx context.Context) (time.Time, error)
	// TenantStatements returns tenant's closed statements.
	TenantStatements(ctx context.Context, tenant string) ([]billing.StoredStatement, error)
	// PriceBookVersion returns a stored price book by version: the one a
	// closed statement was priced with.
	PriceBookVersion(ctx context.Context, version string) (book string, ok bool, err error)
}

// DefaultLookback is how many closed periods before the one being closed
// are checked for late usage.
const DefaultLookback = 12

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
	// it may close (zero: at once; Service passes its --billing-grace);
	// CaughtUp the instant up to which ingest has every event.
	Now, CaughtUp time.Time
	Grace         time.Duration
	// Book prices the usage; ByDeployment splits lines per deployment.
	Book         *billing.PriceBook
	ByDeployment bool
	// Lookback is how many periods before Period are checked for late
	// usage (DefaultLookback when zero).
	Lookback int
	// SkipEmpty leaves out, unstored, the statements without lines of
	// tenants that have no closed statement before.
	SkipEmpty bool
	// Reprice lists closed periods before Period to reprice with Book: the
	// difference their usage makes under Book to what was billed for them
	// becomes repricing lines (an admin's explicit request).
	Reprice []string
}

// CostReader reads allocated cost; *query.Service implements it.
type CostReader interface {
	Cost(ctx context.Context, q query.CostQuery) ([]query.CostRow, error)
}

// Closer closes periods.
type Closer struct {
	usage UsageReader
	store Store
	cost  CostReader
}

// New returns a Closer reading usage from usage and storing statements in
// store. With cost not nil, statements carry their finance part
// (billing.AttachFinance) under the price book's allocation policies.
func New(usage UsageReader, store Store, cost CostReader) *Closer {
	return &Closer{usage: usage, store: store, cost: cost}
}

// Close closes req.Period for every tenant of req, returning each tenant's
// statement as stored, in tenant order. It checks every tenant first and
// closes none when one may not close yet (errors wrap
// billing.ErrPeriodNotEnded or billing.ErrIngestBehind); a tenant already
// closed keeps its statement. It closes up to closeWorkers tenants at once;
// on an error it returns the statements of the tenants before the first one
// not closed (later ones may be closed too: closing them again returns
// their statements).
func (c *Closer) Close(ctx context.Context, req Request) ([]billing.StoredStatement, error) {
	if req.Book == nil {
		return nil, errors.New("close: no price book")
	}
	grace := req.Grace
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
	type result struct {
		st  billing.StoredStatement
		ok  bool
		err error
	}
	results := make([]result, len(tenants))
	next := make(chan int)
	failed := make(chan struct{}) // closed at the first error: no tenant starts after it
	var (
		wg   sync.WaitGroup
		once sync.Once
	)
	for range min(closeWorkers, len(tenants)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				st, ok, err := c.closeOne(ctx, tenants[i].ID, periods[i], req)
				results[i] = result{st: st, ok: ok, err: err}
				if err != nil {
					once.Do(func() { close(failed) })
				}
			}
		}()
	}
	fed := 0
feed:
	for ; fed < len(tenants); fed++ {
		select {
		case next <- fed:
		case <-failed:
			break feed
		}
	}
	close(next)
	wg.Wait()
	// As one at a time: the statements of the tenants before the first that
	// failed (every one before it was started, and finished), and its error.
	out := make([]billing.StoredStatement, 0, len(tenants))
	for _, r := range results[:fed] {
		if r.err != nil {
			return out, r.err
		}
		if r.ok {
			out = append(out, r.st)
		}
	}
	return out, nil
}

// closeWorkers is how many tenants a close closes at once. A tenant's close
// is a dozen small queries one after the other, so one at a time meterd and
// ClickHouse mostly waited on each other: closing 1,000 tenants' month took
// 80 s on the 2-core bench machine (meterbench billing), four at a time 48 s
// (ClickHouse busy on both cores: 78 s of CPU). Saves are still serialized
// (chstore.Store.SaveStatement).
const closeWorkers = 4

// closeOne closes one tenant's period; ok is false for an empty statement
// left out (Request.SkipEmpty).
func (c *Closer) closeOne(ctx context.Context, tenant string, p billing.Period, req Request) (_ billing.StoredStatement, ok bool, _ error) {
	if cur, ok, err := c.store.Statement(ctx, tenant, p.Key); err != nil || ok {
		return cur, ok, err
	}
	// The close is stamped before the usage is read: an event inserted
	// later is late usage of p (the next close's comparison is exact, so
	// an event both read here and stamped after is not billed twice).
	closedAt, err := c.store.ServerNow(ctx)
	if err != nil {
		return billing.StoredStatement{}, false, fmt.Errorf("close %s for %s: %w", p, tenant, err)
	}
	st, closedBefore, err := c.statement(ctx, tenant, p, req, c.cost != nil)
	if err != nil {
		return billing.StoredStatement{}, false, fmt.Errorf("close %s for %s: %w", p, tenant, err)
	}
	if req.SkipEmpty && len(st.Lines) == 0 && !closedBefore {
		return billing.StoredStatement{}, false, nil
	}
	stored, err := c.store.SaveStatement(ctx, st, closedAt)
	return stored, err == nil, err
}

// compute is tenant's statement of p as it would close now, not stored,
// with its finance part when finance.
func (c *Closer) compute(ctx context.Context, tenant string, p billing.Period, req Request, finance bool) (billing.Statement, error) {
	st, _, err := c.statement(ctx, tenant, p, req, finance && c.cost != nil)
	return st, err
}

// statement computes tenant's statement of p: its usage, the late usage of
// its closed periods before, and with finance the allocated cost.
// closedBefore tells whether the tenant has a closed period in the
// lookback.
func (c *Closer) statement(ctx context.Context, tenant string, p billing.Period, req Request, finance bool) (_ billing.Statement, closedBefore bool, _ error) {
	usage, err := c.usage.StatementUsage(ctx, tenant, p.Start, p.End, priceCuts(req.Book, p))
	if err != nil {
		return billing.Statement{}, false, err
	}
	late, closedBefore, err := c.lateUsage(ctx, tenant, p, req)
	if err != nil {
		return billing.Statement{}, false, err
	}
	rep, err := c.repricings(ctx, tenant, p, req, late)
	if err != nil {
		return billing.Statement{}, false, err
	}
	st, err := billing.ComputeStatement(tenant, p, req.Book, slices.Concat(usage, late, rep), req.ByDeployment)
	if err != nil || !finance {
		return st, closedBefore, err
	}
	return st, closedBefore, c.attachFinance(ctx, &st, p, req.Book)
}

// attachFinance adds the allocated cost of the hours starting in p.
func (c *Closer) attachFinance(ctx context.Context, st *billing.Statement, p billing.Period, book *billing.PriceBook) error {
	q := query.CostQuery{TenantID: st.Tenant, Start: ceilHour(p.Start), End: ceilHour(p.End), Step: "hour",
		GroupBy: []string{"model", "deployment"}}.WithDefaults(book)
	rows, err := c.cost.Cost(ctx, q)
	if err != nil {
		return fmt.Errorf("allocated cost: %w", err)
	}
	costs := make([]billing.HourCost, 0, len(rows))
	for _, r := range rows {
		costs = append(costs, billing.HourCost{Hour: r.Start, Model: r.Group["model"], Deployment: r.Group["deployment"],
			Cost: billing.Money(r.CostNanos), Busy: billing.Money(r.BusyNanos)})
	}
	return billing.AttachFinance(st, q.Busy, q.Idle, costs)
}

// ceilHour is the first whole UTC hour at or after t.
func ceilHour(t time.Time) time.Time {
	h := t.UTC().Truncate(time.Hour)
	if h.Before(t) {
		h = h.Add(time.Hour)
	}
	return h
}

// priceCuts are the instants inside p at which a token price changes.
func priceCuts(book *billing.PriceBook, p billing.Period) []time.Time {
	var cuts []time.Time
	for _, tp := range book.TokenPrices {
		if tp.EffectiveFrom.After(p.Start) && tp.EffectiveFrom.Before(p.End) {
			cuts = append(cuts, tp.EffectiveFrom)
		}
	}
	return cuts
}

// lineKey identifies what a line bills, whatever its kind.
type lineKey struct{ model, deployment, price string }

// lateUsage is the usage of tenant's closed periods before p (up to
// req.Lookback of them) that their statements and the adjustments since do
// not bill: events that arrived after the close. Only periods whose hours
// inserts touched since their close are read again. Each period's usage is
// recomputed as its statement would be now and compared line by line (model,
// deployment, price) with what was billed; what is more becomes late usage
// of that period, at its line's price. (Usage never shrinks: events are
// deduplicated and never deleted, so a line billed more than it now has is
// left as billed.)
func (c *Closer) lateUsage(ctx context.Context, tenant string, p billing.Period, req Request) (_ []billing.StatementUsage, closedBefore bool, _ error) {
	lookback := req.Lookback
	if lookback <= 0 {
		lookback = DefaultLookback
	}
	var (
		out    []billing.StatementUsage
		closed []billing.Statement // the closed periods after q, newest first
	)
	// One read of the tenant's closed statements, not one per period.
	all, err := c.store.TenantStatements(ctx, tenant)
	if err != nil {
		return nil, false, err
	}
	byPeriod := make(map[string]billing.StoredStatement, len(all))
	for _, st := range all {
		byPeriod[st.Period] = st
	}
	q := p
	for range lookback {
		q = billing.PeriodOf(q.Start.Add(-time.Nanosecond), p.Zone)
		stored, ok := byPeriod[q.Key]
		if !ok {
			continue
		}
		var billed billing.Statement
		if err := json.Unmarshal(stored.Content, &billed); err != nil {
			return nil, false, fmt.Errorf("statement of %s for %s: %w", tenant, q.Key, err)
		}
		if !billed.PeriodEnd.Equal(q.End) || !billed.PeriodStart.Equal(q.Start) {
			return nil, false, fmt.Errorf("%w: %s's %s was closed in zone %s (%s to %s), its zone is now %s: periods would overlap or leave a gap; keep the zone, or change it only at a boundary the closed periods share",
				ErrZoneChanged, tenant, q.Key, billed.Zone, billed.PeriodStart.Format(time.RFC3339), billed.PeriodEnd.Format(time.RFC3339), p.Zone)
		}
		closedBefore = true
		touched, err := c.touchedSince(ctx, q, stored.ClosedAt)
		if err != nil {
			return nil, false, err
		}
		if touched {
			// q is read again under the book it was billed with: the same
			// cuts and price ids as its lines, and late usage priced as
			// then, whatever the book in force says now.
			book, err := c.bookOf(ctx, billed.PriceBook, req.Book)
			if err != nil {
				return nil, false, fmt.Errorf("statement of %s for %s: %w", tenant, q.Key, err)
			}
			now, err := c.usage.StatementUsage(ctx, tenant, q.Start, q.End, priceCuts(book, q))
			if err != nil {
				return nil, false, err
			}
			current, err := billing.ComputeStatement(tenant, q, book, now, req.ByDeployment)
			if err != nil {
				return nil, false, err
			}
			for _, u := range unbilled(q.Key, current, append([]billing.Statement{billed}, closed...)) {
				u.Book = book
				out = append(out, u)
			}
		}
		closed = append(closed, billed)
	}
	return out, closedBefore, nil
}

// ErrZoneChanged marks a tenant whose zone changed since its last close.
var ErrZoneChanged = errors.New("billing time zone changed")

// repricings are the repricing items of tenant's closed periods
// req.Reprice: for each model (and deployment), the charge of the period's
// usage now under req.Book less everything billed for it (its usage lines,
// the adjustment and repricing lines for it of later statements, and the
// late usage of it this close adds, late).
func (c *Closer) repricings(ctx context.Context, tenant string, p billing.Period, req Request, late []billing.StatementUsage) ([]billing.StatementUsage, error) {
	type key struct{ model, deployment string }
	keyOf := func(model, dep string) key {
		if !req.ByDeployment {
			dep = ""
		}
		return key{model, dep}
	}
	var out []billing.StatementUsage
	for _, name := range req.Reprice {
		q, err := billing.ParsePeriod(name, p.Zone)
		if err != nil {
			return nil, err
		}
		if !q.Start.Before(p.Start) {
			return nil, fmt.Errorf("%w: repricing %s in %s: only periods before it can be repriced", ErrInvalidRequest, q.Key, p.Key)
		}
		charges := map[key]billing.Money{} // now − billed, per key
		add := func(k key, m billing.Money) error {
			sum := charges[k] + m
			if (m > 0 && sum < charges[k]) || (m < 0 && sum > charges[k]) {
				return fmt.Errorf("%w: repricing of %s: out of range", billing.ErrInvalidStatement, q.Key)
			}
			charges[k] = sum
			return nil
		}
		usage, err := c.usage.StatementUsage(ctx, tenant, q.Start, q.End, priceCuts(req.Book, q))
		if err != nil {
			return nil, err
		}
		now, err := billing.ComputeStatement(tenant, q, req.Book, usage, req.ByDeployment)
		if err != nil {
			return nil, err
		}
		var billed []billing.StatementLine
		for r := q; r.Start.Before(p.Start); r = r.Next() {
			stored, ok, err := c.store.Statement(ctx, tenant, r.Key)
			if err != nil {
				return nil, err
			}
			if !ok {
				if r.Key == q.Key {
					return nil, fmt.Errorf("%w: %s of tenant %s is not closed: there is nothing to reprice", ErrNotClosed, q.Key, tenant)
				}
				continue
			}
			var st billing.Statement
			if err := json.Unmarshal(stored.Content, &st); err != nil {
				return nil, fmt.Errorf("statement of %s for %s: %w", tenant, r.Key, err)
			}
			for _, l := range st.Lines {
				if (r.Key == q.Key && l.Kind == billing.LineUsage) || (r.Key != q.Key && l.Kind != billing.LineUsage && l.OriginalPeriod == q.Key) {
					billed = append(billed, l)
				}
			}
		}
		var lateOfQ []billing.StatementUsage
		for _, u := range late {
			if u.OriginalPeriod == q.Key {
				lateOfQ = append(lateOfQ, u)
			}
		}
		if len(lateOfQ) > 0 {
			// Priced as this close's statement prices them: the same lines.
			lateSt, err := billing.ComputeStatement(tenant, p, req.Book, lateOfQ, req.ByDeployment)
			if err != nil {
				return nil, err
			}
			billed = append(billed, lateSt.Lines...)
		}
		for _, l := range now.Lines {
			if err := add(keyOf(l.Model, l.Deployment), l.Charge); err != nil {
				return nil, err
			}
		}
		for _, l := range billed {
			if err := add(keyOf(l.Model, l.Deployment), -l.Charge); err != nil {
				return nil, err
			}
		}
		keys := slices.SortedFunc(maps.Keys(charges), func(a, b key) int {
			return cmp.Or(strings.Compare(a.model, b.model), strings.Compare(a.deployment, b.deployment))
		})
		for _, k := range keys {
			if d := charges[k]; d != 0 {
				out = append(out, billing.StatementUsage{Start: q.Start, End: q.End, Model: k.model, Deployment: k.deployment,
					OriginalPeriod: q.Key, Repricing: &d})
			}
		}
	}
	return out, nil
}

// bookOf is the price book of version: inForce when it is that version,
// else the stored one.
func (c *Closer) bookOf(ctx context.Context, version string, inForce *billing.PriceBook) (*billing.PriceBook, error) {
	if inForce.Version() == version {
		return inForce, nil
	}
	if empty := billing.EmptyPriceBook(); empty.Version() == version {
		return empty, nil
	}
	doc, ok, err := c.store.PriceBookVersion(ctx, version)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("price book version %s is not stored", version)
	}
	return billing.ParsePriceBook([]byte(doc))
}

// touchedSince reports whether inserts stamped since closedAt (both by the
// server's clock; a minute earlier, for inserts in flight at the close)
// touched hours of q.
func (c *Closer) touchedSince(ctx context.Context, q billing.Period, closedAt time.Time) (bool, error) {
	hours, err := c.store.DirtyHours(ctx, closedAt.Add(-time.Minute), time.Unix(1<<32-1, 0))
	if err != nil {
		return false, err
	}
	for _, h := range hours {
		if h.Add(time.Hour).After(q.Start) && h.Before(q.End) {
			return true, nil
		}
	}
	return false, nil
}

// unbilled is what current's usage lines hold beyond the usage lines of
// q's statement and the adjustment lines for q of later statements, as late
// usage of q.
func unbilled(q string, current billing.Statement, statements []billing.Statement) []billing.StatementUsage {
	type sums struct{ requests, input, cached, output uint64 }
	billed := map[lineKey]sums{}
	for _, st := range statements {
		for _, l := range st.Lines {
			if (l.Kind == billing.LineUsage && st.Period == q) || (l.Kind == billing.LineAdjustment && l.OriginalPeriod == q) {
				k := lineKey{l.Model, l.Deployment, l.PriceID}
				b := billed[k]
				billed[k] = sums{b.requests + l.Requests, b.input + l.InputTokens, b.cached + l.CachedInputTokens, b.output + l.OutputTokens}
			}
		}
	}
	more := func(now, then uint64) uint64 {
		if now > then {
			return now - then
		}
		return 0
	}
	var out []billing.StatementUsage
	for _, l := range current.Lines {
		b := billed[lineKey{l.Model, l.Deployment, l.PriceID}]
		u := billing.StatementUsage{Start: l.ChargeStart, End: l.ChargeEnd, Model: l.Model, Deployment: l.Deployment, OriginalPeriod: q,
			Requests: more(l.Requests, b.requests), InputTokens: more(l.InputTokens, b.input),
			CachedInputTokens: more(l.CachedInputTokens, b.cached), OutputTokens: more(l.OutputTokens, b.output)}
		if u.CachedInputTokens > u.InputTokens {
			u.InputTokens = u.CachedInputTokens // cached input is input: never bill less input than cached
		}
		if u.Requests+u.InputTokens+u.OutputTokens > 0 {
			out = append(out, u)
		}
	}
	return out
}
