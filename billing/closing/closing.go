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

	"golang.org/x/sync/errgroup"
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
	// FirstClosedPeriod is the earliest period of any closed statement.
	FirstClosedPeriod(ctx context.Context) (period string, ok bool, err error)
	// PriceBookVersion returns a stored price book by version: the one a
	// closed statement was priced with.
	PriceBookVersion(ctx context.Context, version string) (book string, ok bool, err error)
}

// DefaultLookback is how many closed periods before the one being closed
// are checked for late usage.
const DefaultLookback = 12

// Tenant is a tenant to bill, its time zone and its contract.
type Tenant struct {
	ID   string
	Zone *time.Location
	// Contract prices the tenant's statements (billing.Contract); nil:
	// list prices.
	Contract *billing.Contract
}

// contractOf is tenant's contract in req (nil: none).
func (req Request) contractOf(tenant string) *billing.Contract {
	for _, t := range req.Tenants {
		if t.ID == tenant {
			return t.Contract
		}
	}
	return nil
}

// GPUReader reads GPU usage per hour and deployment, for dedicated
// deployments billed per GPU-hour; *query.Service implements it.
type GPUReader interface {
	GPUUsage(ctx context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error)
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
	// firstClosed is the earliest period any tenant has closed (empty: none):
	// billing started there, so a tenant's open periods before it are not
	// gaps to bill. Close and compute fill it.
	firstClosed string
	// Reprice lists closed periods before Period to reprice with Book: the
	// difference their usage makes under Book to what was billed for them
	// becomes repricing lines (an admin's explicit request).
	Reprice []string
	// FlagUnpriced closes tenants whose usage has no list price, their
	// statements flagging the unpriced requests; without it such a tenant
	// is refused (UnpricedError) and the others close.
	FlagUnpriced bool
	// closing is set by closeOne: the statement is to be stored, so its
	// credit balances are read after the ledger is reconciled.
	closing bool
	// ledger is the credit grants and ledger a close reads once and the
	// ledger entries it writes once (credits.go); nil for a draft.
	ledger *closeLedger
	// voiding is, in a reissue, what voiding the revision in force gives
	// back (its ledger where missing, and its returns): counted in the
	// balances the new revision draws on, written once it is stored.
	voiding []billing.CreditEntry
	// closed, when set (by statement), reads the tenant's closed
	// statements once for earlier and the credits.
	closed func() ([]billing.StoredStatement, error)
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
	// credits, when not nil, keeps the credit grants statements draw on
	// (credits.go); tenantLocks serialize each tenant's closes.
	credits     Credits
	lockMu      sync.Mutex
	tenantLocks map[string]*sync.Mutex
	// regionsSeen keeps the deployments' regions of recent ranges: a
	// close records each line's region (recordRegions) with one read per
	// zone's month.
	regionsSeen regionCache
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
// their statements). A tenant with usage without a list price is not
// closed unless req.FlagUnpriced: the others close, and the error (an
// UnpricedError per tenant refused, joined) names the models and requests.
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
	first, _, err := c.store.FirstClosedPeriod(ctx)
	if err != nil {
		return nil, err
	}
	req.firstClosed = first
	if c.credits != nil {
		if req.ledger, err = c.readLedger(ctx); err != nil {
			return nil, err
		}
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
				if err != nil && !errors.Is(err, ErrUnpricedUsage) {
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
	// The ledger of every statement this close stored (or found stored
	// without one), in one insert.
	if err := req.ledger.write(ctx, c.credits); err != nil {
		return nil, err
	}
	// As one at a time: the statements of the tenants before the first that
	// failed (every one before it was started, and finished), and its error.
	// A tenant refused for unpriced usage does not stop the others: the
	// error names every one refused.
	out := make([]billing.StoredStatement, 0, len(tenants))
	var refused []error
	for _, r := range results[:fed] {
		if r.err != nil {
			if errors.Is(r.err, ErrUnpricedUsage) {
				refused = append(refused, r.err)
				continue
			}
			return out, errors.Join(append(refused, r.err)...)
		}
		if r.ok {
			out = append(out, r.st)
		}
	}
	return out, errors.Join(refused...)
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
	defer c.tenantLock(tenant)()
	req.closing = true
	if cur, ok, err := c.store.Statement(ctx, tenant, p.Key); err != nil || ok {
		if ok && len(req.Reprice) > 0 {
			return billing.StoredStatement{}, false, fmt.Errorf("%w: %s is already closed for %s, so it can no longer carry a repricing: name the periods to reprice in the next close",
				ErrInvalidRequest, p.Key, tenant)
		}
		if ok {
			err = c.recordStored(ctx, cur, req)
		}
		return cur, ok && err == nil, err
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
	// A tenant without usage is closed when its contract charges it
	// (a commitment's true-up, a dedicated deployment's GPU-hours).
	if len(st.Lines) == 0 && len(st.Charges) == 0 && !closedBefore {
		if req.SkipEmpty {
			return billing.StoredStatement{}, false, nil
		}
		return billing.StoredStatement{}, false, fmt.Errorf("%w: tenant %q has no usage in %s and no closed periods: nothing to close", ErrNotFound, tenant, p)
	}
	if u := unpricedOf(&st); u != nil && !req.FlagUnpriced {
		return billing.StoredStatement{}, false, u
	}
	stored, err := c.store.SaveStatement(ctx, st, closedAt)
	if err == nil {
		err = c.recordStored(ctx, stored, req)
	}
	return stored, err == nil, err
}

// compute is tenant's statement of p as it would close now, not stored,
// with its finance part when finance.
func (c *Closer) compute(ctx context.Context, tenant string, p billing.Period, req Request, finance bool) (billing.Statement, error) {
	first, _, err := c.store.FirstClosedPeriod(ctx)
	if err != nil {
		return billing.Statement{}, err
	}
	req.firstClosed = first
	st, _, err := c.statement(ctx, tenant, p, req, finance && c.cost != nil)
	return st, err
}

// statement computes tenant's statement of p: its usage, what its earlier
// periods add (late usage, repricings) and, with finance, the allocated
// cost. The three reads run at once. closedBefore tells whether the tenant
// has a closed period in the lookback.
func (c *Closer) statement(ctx context.Context, tenant string, p billing.Period, req Request, finance bool) (_ billing.Statement, closedBefore bool, _ error) {
	var (
		usage, late, rep []billing.StatementUsage
		basis            []billing.LateBasis
		costs            []billing.HourCost
		costQ            query.CostQuery
	)
	contract := req.contractOf(tenant)
	var hours []billing.DedicatedHour
	g, gctx := errgroup.WithContext(ctx)
	// earlier and the credits both read the tenant's closed statements:
	// one read.
	req.closed = sync.OnceValues(func() ([]billing.StoredStatement, error) { return c.store.TenantStatements(gctx, tenant) })
	g.Go(func() (err error) {
		usage, err = c.usage.StatementUsage(gctx, tenant, p.Start, p.End, append(priceCuts(req.Book, p), contract.Cuts(p.Start, p.End)...))
		return err
	})
	if contract != nil && len(contract.Dedicated) > 0 {
		g.Go(func() (err error) {
			hours, err = c.dedicatedHours(gctx, p)
			return err
		})
	}
	g.Go(func() (err error) {
		late, rep, basis, closedBefore, err = c.earlier(gctx, tenant, p, req)
		return err
	})
	var credit creditReads
	if c.credits != nil {
		g.Go(func() (err error) {
			credit, err = c.readCredits(gctx, tenant, req)
			return err
		})
	}
	if finance {
		costQ = query.CostQuery{TenantID: tenant, Start: ceilHour(p.Start), End: ceilHour(p.End), Step: "hour",
			GroupBy: []string{"model", "deployment"}}.WithDefaults(req.Book)
		g.Go(func() (err error) {
			costs, err = c.hourCosts(gctx, costQ)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return billing.Statement{}, false, err
	}
	st, err := billing.ComputeContractStatementLate(tenant, p, req.Book, slices.Concat(usage, late, rep), req.ByDeployment, contract, hours, basis)
	if err == nil {
		// The lines' regions are part of the statement (export.go).
		err = c.recordRegions(ctx, &st)
	}
	if err == nil {
		// Credits draw on what is left after the contract's charges.
		err = c.applyCredits(ctx, &st, p, req, credit)
	}
	if err != nil || !finance {
		return st, closedBefore, err
	}
	return st, closedBefore, billing.AttachFinance(&st, costQ.Busy, costQ.Idle, costs)
}

// dedicatedHours reads the GPU time of every deployment per UTC hour that
// starts in p (the hours whose cost a statement of p holds), from the GPU
// usage rollups the allocation costs: billing.GPUMicroHours of each hour's
// GPU seconds.
func (c *Closer) dedicatedHours(ctx context.Context, p billing.Period) ([]billing.DedicatedHour, error) {
	r, ok := c.usage.(GPUReader)
	if !ok {
		if r, ok = c.cost.(GPUReader); !ok {
			return nil, errors.New("dedicated deployments: the closer has no GPU usage reader")
		}
	}
	rows, err := r.GPUUsage(ctx, query.GPUUsageQuery{Start: ceilHour(p.Start), End: ceilHour(p.End), Step: "hour",
		GroupBy: []string{"deployment"}, NoTokens: true})
	if err != nil {
		return nil, fmt.Errorf("dedicated GPU-hours: %w", err)
	}
	out := make([]billing.DedicatedHour, 0, len(rows))
	for _, row := range rows {
		out = append(out, billing.DedicatedHour{Deployment: row.Group["deployment"], Hour: row.Start,
			MicroHours: billing.GPUMicroHours(row.GPUSeconds)})
	}
	return out, nil
}

// hourCosts reads the allocated cost of q (a tenant's hours that start in
// a period, per model and deployment).
func (c *Closer) hourCosts(ctx context.Context, q query.CostQuery) ([]billing.HourCost, error) {
	rows, err := c.cost.Cost(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("allocated cost: %w", err)
	}
	costs := make([]billing.HourCost, 0, len(rows))
	for _, r := range rows {
		costs = append(costs, billing.HourCost{Hour: r.Start, Model: r.Group["model"], Deployment: r.Group["deployment"],
			Cost: billing.Money(r.CostNanos), Busy: billing.Money(r.BusyNanos)})
	}
	return costs, nil
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

// ErrZoneChanged marks a tenant whose zone changed since its last close.
var ErrZoneChanged = errors.New("billing time zone changed")

// ErrLaterClosed marks a period that may no longer close: a later period of
// the tenant is closed, and has billed (or will bill) its usage as late
// usage.
var ErrLaterClosed = errors.New("a later billing period is closed")

// earlier is what tenant's periods before p (up to req.Lookback of them)
// add to p's statement: late usage, and the repricings req.Reprice asks
// for. closedBefore tells whether the tenant has a closed period in the
// lookback.
//
// Each earlier period q is compared with what was billed for it: its own
// usage lines when it is closed, and the adjustment lines for it of later
// statements. A closed q, or one billed through adjustments, is read again
// only when inserts touched its hours since the close that billed it; an
// open q after the tenant's last close (a gap: the tenant had nothing to
// bill when q closed for the others, or q was never closed) is read when
// the tenant has usage in the gap. Open periods before the first period any
// tenant closed are before billing started, and not billed. So closing p closes everything before
// it: usage of an open earlier period is billed here, and that period may
// not close after (ErrLaterClosed).
//
// q is read again under the book that billed it (the same cuts and price
// ids as its lines, late usage priced as then) and compared line by line
// (model, deployment, price; deployment only when q was billed per
// deployment); what is more becomes late usage of q. Usage never shrinks
// (events are deduplicated and never deleted), so a line billed more than
// it now has is left as billed. A repricing of q prices that same read with
// req.Book, so that late usage and repricing agree on what q holds.
//
// Under a contract, q is also read and compared per part between its
// contract entries (so that late usage is cut there, each part priced by
// its entry), unless a line billed for q spans one (the entry was written
// after q was billed: then whole lines, as before); and basis says, for
// each q with late usage, what was billed for it (billing.LateBasis: its
// usage lines, the later adjustments for it, what is left of its
// commitment true-up), which the late usage's contract pricing continues.
func (c *Closer) earlier(ctx context.Context, tenant string, p billing.Period, req Request) (late, rep []billing.StatementUsage, basis []billing.LateBasis, closedBefore bool, _ error) {
	lookback := req.Lookback
	if lookback <= 0 {
		lookback = DefaultLookback
	}
	contract := req.contractOf(tenant)
	reprice := map[string]bool{}
	for _, r := range req.Reprice {
		reprice[r] = true
	}
	// One read of the tenant's closed statements, not one per period.
	all, err := req.tenantStatements(ctx, c.store, tenant)
	if err != nil {
		return nil, nil, nil, false, err
	}
	byPeriod := make(map[string]billing.StoredStatement, len(all))
	var lastClosedEnd time.Time // the end of the tenant's last closed period before p
	for _, stored := range all {
		var st billing.Statement
		if err := json.Unmarshal(stored.Content, &st); err != nil {
			return nil, nil, nil, false, fmt.Errorf("statement of %s for %s: %w", tenant, stored.Period, err)
		}
		if !st.PeriodStart.Before(p.End) {
			return nil, nil, nil, false, fmt.Errorf("%w: %s of tenant %s is closed, so %s may not close: its usage is billed as late usage of the later closes",
				ErrLaterClosed, stored.Period, tenant, p.Key)
		}
		byPeriod[stored.Period] = stored
		lastClosedEnd = maxTime(lastClosedEnd, st.PeriodEnd)
	}
	type billedStatement struct {
		st       billing.Statement
		closedAt time.Time
	}
	var (
		after      []billedStatement // the closed statements after q, newest first
		gapChecked bool
		gapUsage   bool
	)
	q := p
	for range lookback {
		q = billing.PeriodOf(q.Start.Add(-time.Nanosecond), p.Zone)
		stored, closed := byPeriod[q.Key]
		var (
			billed []billing.StatementLine
			own    billing.Statement
			book   = req.Book
			since  time.Time // inserts stamped since are late; zero: a gap
		)
		if closed {
			if err := json.Unmarshal(stored.Content, &own); err != nil {
				return nil, nil, nil, false, fmt.Errorf("statement of %s for %s: %w", tenant, q.Key, err)
			}
			if !own.PeriodEnd.Equal(q.End) || !own.PeriodStart.Equal(q.Start) {
				return nil, nil, nil, false, fmt.Errorf("%w: %s's %s was closed in zone %s (%s to %s), its zone is now %s: periods would overlap or leave a gap; keep the zone, or change it only at a boundary the closed periods share",
					ErrZoneChanged, tenant, q.Key, own.Zone, own.PeriodStart.Format(time.RFC3339), own.PeriodEnd.Format(time.RFC3339), p.Zone)
			}
			closedBefore = true
			for _, l := range own.Lines {
				if l.Kind == billing.LineUsage {
					billed = append(billed, l)
				}
			}
			if book, err = c.bookOf(ctx, own.PriceBook, req.Book); err != nil {
				return nil, nil, nil, false, fmt.Errorf("statement of %s for %s: %w", tenant, q.Key, err)
			}
			since = stored.ClosedAt
		}
		// Adjustments for q of later statements, oldest first: for an open
		// q, the first one says which book and close billed it.
		for i := len(after) - 1; i >= 0; i-- {
			for _, l := range after[i].st.Lines {
				if l.Kind == billing.LineAdjustment && l.OriginalPeriod == q.Key {
					if !closed && since.IsZero() {
						since = after[i].closedAt
						if book, err = c.bookOf(ctx, cmp.Or(l.PriceBook, after[i].st.PriceBook), req.Book); err != nil {
							return nil, nil, nil, false, err
						}
					}
					billed = append(billed, l)
				}
			}
		}
		if !closed && since.IsZero() && (req.firstClosed == "" || q.Key < req.firstClosed) {
			if reprice[q.Key] {
				started := "no period is closed yet"
				if req.firstClosed != "" {
					started = "billing started with " + req.firstClosed
				}
				return nil, nil, nil, false, fmt.Errorf("%w: repricing %s in %s: %s was never closed (%s), so nothing was billed for it to reprice",
					ErrNotClosed, q.Key, p.Key, q.Key, started)
			}
			continue // before billing started: not billed
		}
		if !closed && since.IsZero() && len(after) > 0 {
			// Open, nothing billed, a later period closed: what was inserted
			// since the oldest later close is late (before it, q was a gap
			// of that close and billed there).
			since = after[len(after)-1].closedAt
		}
		var read bool
		if since.IsZero() {
			if !gapChecked {
				// One read for the whole gap: does the tenant have usage
				// between its last close and p?
				u, err := c.usage.StatementUsage(ctx, tenant, gapStart(p, lookback, lastClosedEnd), p.Start, nil)
				if err != nil {
					return nil, nil, nil, false, err
				}
				gapChecked, gapUsage = true, len(u) > 0
			}
			read = gapUsage
		} else if read, err = c.touchedSince(ctx, q, since); err != nil {
			return nil, nil, nil, false, err
		}
		if read || (reprice[q.Key] && len(billed) > 0) {
			byDep := req.ByDeployment
			if len(billed) > 0 {
				byDep = slices.ContainsFunc(billed, func(l billing.StatementLine) bool { return l.Deployment != "" })
			}
			cuts := priceCuts(book, q)
			if reprice[q.Key] {
				cuts = append(cuts, priceCuts(req.Book, q)...)
			}
			// The contract's entries in q: late usage is cut there
			// unless what was billed was not.
			entryCuts := contract.Cuts(q.Start, q.End)
			if slices.ContainsFunc(billed, func(l billing.StatementLine) bool {
				return slices.ContainsFunc(entryCuts, func(t time.Time) bool { return t.After(l.ChargeStart) && t.Before(l.ChargeEnd) })
			}) {
				entryCuts = nil
			}
			cuts = append(cuts, contract.Cuts(q.Start, q.End)...)
			now, err := c.usage.StatementUsage(ctx, tenant, q.Start, q.End, cuts)
			if err != nil {
				return nil, nil, nil, false, err
			}
			current, err := billing.ComputeStatementCut(tenant, q, book, now, byDep, entryCuts)
			if err != nil {
				return nil, nil, nil, false, err
			}
			lateQ := unbilled(q.Key, current, billed, byDep, entryCuts)
			for i := range lateQ {
				lateQ[i].Book = book
			}
			late = append(late, lateQ...)
			if len(lateQ) > 0 {
				b := billing.LateBasis{Period: q.Key}
				if closed {
					b.Usage = own.Lines
					b.TrueUp = trueUpOf(own, "")
				}
				for i := len(after) - 1; i >= 0; i-- {
					b.Adjustments = append(b.Adjustments, after[i].st.Lines)
					b.TrueUp += trueUpOf(after[i].st, q.Key)
				}
				basis = append(basis, b)
			}
			if reprice[q.Key] && len(billed) > 0 {
				r, err := repricing(tenant, p, q, req, book, now, billed, lateQ, byDep)
				if err != nil {
					return nil, nil, nil, false, err
				}
				rep = append(rep, r...)
			}
		}
		delete(reprice, q.Key)
		if closed {
			after = append(after, billedStatement{st: own, closedAt: stored.ClosedAt})
		}
	}
	for r := range reprice {
		if r < p.Key {
			return nil, nil, nil, false, fmt.Errorf("%w: repricing %s in %s: only the %d periods before it can be repriced", ErrInvalidRequest, r, p.Key, lookback)
		}
		return nil, nil, nil, false, fmt.Errorf("%w: repricing %s in %s: only periods before it can be repriced", ErrInvalidRequest, r, p.Key)
	}
	return late, rep, basis, closedBefore, nil
}

// tenantStatements is tenant's closed statements: req.closed's read when
// set, else one of its own.
func (req Request) tenantStatements(ctx context.Context, store Store, tenant string) ([]billing.StoredStatement, error) {
	if req.closed != nil {
		return req.closed()
	}
	return store.TenantStatements(ctx, tenant)
}

// gapStart is where the tenant's unbilled gap before p starts: the end of
// its last closed period, or the start of the lookback.
func gapStart(p billing.Period, lookback int, lastClosedEnd time.Time) time.Time {
	start := p
	for range lookback {
		start = billing.PeriodOf(start.Start.Add(-time.Nanosecond), p.Zone)
	}
	return maxTime(start.Start, lastClosedEnd)
}

// trueUpOf is st's commitment charges for period q (q empty: st's own
// true-up; else what late usage of q absorbed of q's, negative).
func trueUpOf(st billing.Statement, q string) billing.Money {
	var m billing.Money
	for _, ch := range st.Charges {
		if ch.Kind == billing.ChargeCommitment && ch.OriginalPeriod == q {
			m += ch.Amount
		}
	}
	return m
}

// repricing is the repricing of q in p's statement: per model (and
// deployment, when q was billed per deployment), the charge of q's usage
// now under req.Book less everything billed for it (billed) and the late
// usage of it this close adds (lateQ, priced as p's statement prices it).
// Under a contract each also carries what the contract changes in it
// (billing.StatementUsage.RepricingDiscount): the contract's discounts of
// q's usage now under req.Book less those under book, the book that
// billed q, per token kind.
func repricing(tenant string, p, q billing.Period, req Request, book *billing.PriceBook, now []billing.StatementUsage, billed []billing.StatementLine, lateQ []billing.StatementUsage, byDep bool) ([]billing.StatementUsage, error) {
	type key struct{ model, deployment string }
	keyOf := func(model, dep string) key {
		if !byDep {
			dep = ""
		}
		return key{model, dep}
	}
	underNew, err := billing.ComputeStatement(tenant, q, req.Book, now, byDep)
	if err != nil {
		return nil, err
	}
	lines := slices.Clone(billed)
	if len(lateQ) > 0 {
		lateSt, err := billing.ComputeStatement(tenant, p, req.Book, lateQ, req.ByDeployment)
		if err != nil {
			return nil, err
		}
		lines = append(lines, lateSt.Lines...)
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
	for _, l := range underNew.Lines {
		if err := add(keyOf(l.Model, l.Deployment), l.Charge); err != nil {
			return nil, err
		}
	}
	for _, l := range lines {
		if err := add(keyOf(l.Model, l.Deployment), -l.Charge); err != nil {
			return nil, err
		}
	}
	keys := slices.SortedFunc(maps.Keys(charges), func(a, b key) int {
		return cmp.Or(strings.Compare(a.model, b.model), strings.Compare(a.deployment, b.deployment))
	})
	var out []billing.StatementUsage
	linesOf := func(ls []billing.StatementLine, k key) []billing.StatementLine {
		var out []billing.StatementLine
		for _, l := range ls {
			if keyOf(l.Model, l.Deployment) == k {
				out = append(out, l)
			}
		}
		return out
	}
	// The contract's discounts of q's usage under each book, per key.
	var discounts map[key]*billing.KindAmounts
	if contract := req.contractOf(tenant); contract != nil {
		discounts = map[key]*billing.KindAmounts{}
		for _, b := range []struct {
			book *billing.PriceBook
			sign billing.Money
		}{{req.Book, 1}, {book, -1}} {
			st, err := billing.ComputeContractStatement(tenant, q, b.book, now, byDep, contract, nil)
			if err != nil {
				return nil, fmt.Errorf("repricing of %s under the contract: %w", q.Key, err)
			}
			for _, ch := range st.Charges {
				if ch.Kind != billing.ChargeDiscount || ch.Line < 0 {
					continue
				}
				l := st.Lines[ch.Line]
				k := keyOf(l.Model, l.Deployment)
				if discounts[k] == nil {
					discounts[k] = &billing.KindAmounts{}
				}
				switch a := b.sign * ch.Amount; ch.TokenKind {
				case billing.TokenInput:
					discounts[k].Input += a
				case billing.TokenCachedInput:
					discounts[k].CachedInput += a
				default:
					discounts[k].Output += a
				}
			}
		}
	}
	for _, k := range keys {
		if d := charges[k]; d != 0 {
			u := billing.StatementUsage{Start: q.Start, End: q.End, Model: k.model, Deployment: k.deployment,
				OriginalPeriod: q.Key, Repricing: &d, Repriced: repricedKinds(d, linesOf(underNew.Lines, k), linesOf(lines, k))}
			if discounts != nil {
				u.RepricingDiscount = &billing.KindAmounts{}
				if dk := discounts[k]; dk != nil {
					u.RepricingDiscount = dk
				}
			}
			out = append(out, u)
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

// unbilled is what current's usage lines hold beyond billed (everything
// billed for q: its usage lines and the adjustment lines for it), as late
// usage of q. Lines are matched by model, price, the part between cuts
// (a contract's entries) their start lies in and, with byDep, deployment.
func unbilled(q string, current billing.Statement, billed []billing.StatementLine, byDep bool, cuts []time.Time) []billing.StatementUsage {
	type sums struct{ requests, input, cached, output uint64 }
	type partKey struct {
		lineKey
		part int
	}
	keyOf := func(l billing.StatementLine) partKey {
		k := partKey{lineKey: lineKey{l.Model, l.Deployment, l.PriceID}}
		if !byDep {
			k.deployment = ""
		}
		for _, t := range cuts {
			if !t.After(l.ChargeStart) {
				k.part++
			}
		}
		return k
	}
	was := map[partKey]sums{}
	for _, l := range billed {
		k := keyOf(l)
		b := was[k]
		was[k] = sums{b.requests + l.Requests, b.input + l.InputTokens, b.cached + l.CachedInputTokens, b.output + l.OutputTokens}
	}
	more := func(now, then uint64) uint64 {
		if now > then {
			return now - then
		}
		return 0
	}
	var out []billing.StatementUsage
	for _, l := range current.Lines {
		b := was[keyOf(l)]
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

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
