package closing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/ident"
	"tokenmeter/query"
	"tokenmeter/rollup"
)

// Errors of the service, besides billing.ErrInvalidPeriod,
// billing.ErrPeriodNotEnded and billing.ErrIngestBehind.
var (
	// ErrNotFound marks a tenant or statement that does not exist: a
	// tenant without usage or statements in the period asked.
	ErrNotFound = errors.New("not found")
	// ErrNotClosed marks a period that must be closed for what was asked
	// (an export of statements, a repricing).
	ErrNotClosed = errors.New("billing period not closed")
	// ErrRollupBehind marks a close asked before the rollup job has costed
	// the period: the allocated cost would be incomplete.
	ErrRollupBehind = errors.New("rollups have not caught up")
	// ErrInvalidRequest marks a request with a bad field.
	ErrInvalidRequest = errors.New("invalid billing request")
)

// Reads are the queries the service makes besides statement usage;
// *query.Service implements them.
type Reads interface {
	UsageReader
	Usage(ctx context.Context, q query.UsageQuery) ([]query.UsageRow, error)
	Cost(ctx context.Context, q query.CostQuery) ([]query.CostRow, error)
	EachUsageCost(ctx context.Context, q query.CostQuery, row func(*query.UsageCostRow) error) error
}

// Statements keeps closed statements; *chstore.Store implements it.
type Statements interface {
	Store
	EachStatement(ctx context.Context, period, tenant string, fn func(billing.StoredStatement) error) error
	// The rollup job's progress (rollup.Costed): its watermark, and the
	// inserts of events and GPU samples since.
	rollup.ProgressStore
	// StalePriceHours lists the hours at or after from whose cost rows
	// were computed with a price book other than version.
	StalePriceHours(ctx context.Context, version string, from time.Time) ([]time.Time, error)
	// Statement revisions and invoice documents (invoices.go).
	InvoiceStore
}

// Locker serializes closes: Lock returns once the caller holds the lock
// named, and unlock releases it. Closes on several replicas must share one
// (a Kafka lease); in one process a mutex does.
type Locker interface {
	Lock(ctx context.Context, name string) (unlock func(), err error)
}

// Deps are what a Service reads and writes.
type Deps struct {
	Reads Reads
	Store Statements
	// Prices returns the price book in force.
	Prices func(ctx context.Context) (*billing.PriceBook, error)
	// CaughtUp returns the instant up to which ingest has every event
	// (now, when the consumer group has no lag), or an error wrapping
	// billing.ErrIngestBehind while it lags; nil: now.
	CaughtUp func(ctx context.Context) (time.Time, error)
	// Lock serializes closes; nil: a mutex of this Service.
	Lock Locker
	// Credits keeps credit grants and their ledger; nil: no credits
	// (statements draw on none, credit requests are ErrCreditsOff).
	Credits Credits
	// Notify, when not nil, is told of the statements each close stored
	// (or found stored) once their invoices are issued, to send them out
	// (package notify); it must not block.
	Notify Notifier
}

// Notifier is told of closed statements; *notify.Notifier implements it.
type Notifier interface {
	Closed(sts []billing.StoredStatement)
}

// Config tunes a Service.
type Config struct {
	// Zones maps tenants to their billing time zone; DefaultZone (UTC when
	// nil) is everyone else's.
	Zones       map[string]*time.Location
	DefaultZone *time.Location
	// Grace is how long after its end a period may close (DefaultGrace
	// when zero); a close request may ask for another.
	Grace time.Duration
	// Lookback is how many closed periods are checked for late usage.
	Lookback int
	// ByDeployment splits statement lines per deployment.
	ByDeployment bool
	// CatchUpWait is how long a close waits for ingest to catch up before
	// it gives up (DefaultCatchUpWait when zero; negative: no wait).
	CatchUpWait time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Accounts is the billing accounts file (meterd --billing-accounts):
	// operator names, tenants' display names, buyers, tax rates and
	// contracts; nil: none (list prices, default names).
	Accounts *billing.Accounts
}

// DefaultCatchUpWait is how long a close waits for ingest to catch up.
const DefaultCatchUpWait = 30 * time.Second

// Service is the billing side of the API: periods, closes, statements and
// exports.
type Service struct {
	d      Deps
	cfg    Config
	closer *Closer
	mu     sync.Mutex
	// regionsSeen keeps the deployments' regions of recent ranges, so
	// that an export of a period's statements reads them once (export.go).
	regionsSeen regionCache
}

// NewService returns a Service.
func NewService(d Deps, cfg Config) (*Service, error) {
	if d.Reads == nil || d.Store == nil || d.Prices == nil {
		return nil, errors.New("billing service: Reads, Store and Prices are required")
	}
	if cfg.DefaultZone == nil {
		cfg.DefaultZone = time.UTC
	}
	if cfg.Grace == 0 {
		cfg.Grace = billing.DefaultGrace
	}
	if cfg.Grace < 0 {
		return nil, fmt.Errorf("billing service: negative grace %s", cfg.Grace)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CatchUpWait == 0 {
		cfg.CatchUpWait = DefaultCatchUpWait
	}
	for tenant := range cfg.Zones {
		if err := ident.Check("tenant_id", tenant); err != nil {
			return nil, fmt.Errorf("billing service: zone of %w", err)
		}
	}
	s := &Service{d: d, cfg: cfg}
	s.closer = &Closer{usage: d.Reads, store: d.Store, cost: d.Reads, credits: d.Credits}
	return s, nil
}

// Zone is tenant's billing time zone.
func (s *Service) Zone(tenant string) *time.Location {
	if z, ok := s.cfg.Zones[tenant]; ok {
		return z
	}
	return s.cfg.DefaultZone
}

// Grace is the default grace delay of closes.
func (s *Service) Grace() time.Duration { return s.cfg.Grace }

// PeriodState is one billing period of a tenant and its state.
type PeriodState struct {
	Tenant, Period, Zone string
	Start, End           time.Time
	Closed               bool
	// ClosableAt is the end plus the grace delay: the first instant an
	// open period may close.
	ClosableAt time.Time
	// Of a closed period: its statement's hash, close time, currency and
	// total.
	Hash     string
	ClosedAt time.Time
	Currency string
	Total    billing.Money
}

// Periods lists tenant's billing periods, oldest first: the closed ones,
// then every open one from the first period after the last closed (or the
// first with usage in the last year, with none closed) to the current one.
func (s *Service) Periods(ctx context.Context, tenant string) ([]PeriodState, error) {
	if err := checkTenant(tenant); err != nil {
		return nil, err
	}
	zone := s.Zone(tenant)
	closed, err := s.d.Store.TenantStatements(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []PeriodState
	for _, st := range closed {
		var bill billing.Statement
		if err := json.Unmarshal(st.Content, &bill); err != nil {
			return nil, fmt.Errorf("statement of %s for %s: %w", tenant, st.Period, err)
		}
		out = append(out, PeriodState{Tenant: tenant, Period: st.Period, Zone: bill.Zone, Start: bill.PeriodStart, End: bill.PeriodEnd,
			Closed: true, ClosableAt: bill.PeriodEnd.Add(s.cfg.Grace), Hash: st.Hash, ClosedAt: st.ClosedAt,
			Currency: bill.Currency, Total: bill.Total})
	}
	now := s.cfg.Now()
	current := billing.PeriodOf(now, zone)
	var first billing.Period
	if len(out) > 0 {
		first = billing.PeriodOf(out[len(out)-1].End, zone)
	} else {
		first, err = s.firstUsed(ctx, tenant, current)
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 && first.Key == "" {
		return nil, fmt.Errorf("%w: tenant %q has no usage in the last year and no statements", ErrNotFound, tenant)
	}
	for p := first; !p.Start.After(current.Start); p = p.Next() {
		out = append(out, PeriodState{Tenant: tenant, Period: p.Key, Zone: zone.String(), Start: p.Start.UTC(), End: p.End.UTC(),
			ClosableAt: p.End.Add(s.cfg.Grace).UTC()})
	}
	return out, nil
}

// firstUsed is the first of the last twelve periods up to current in which
// tenant has usage; a zero Period when none.
func (s *Service) firstUsed(ctx context.Context, tenant string, current billing.Period) (billing.Period, error) {
	from := current
	for range 11 {
		from = billing.PeriodOf(from.Start.Add(-time.Nanosecond), current.Zone)
	}
	start, end := from.Start.UTC().Truncate(time.Hour), current.End.UTC().Truncate(time.Hour).Add(time.Hour)
	rows, err := s.d.Reads.Usage(ctx, query.UsageQuery{TenantID: tenant, Start: start, End: end, Granularity: "day"})
	if err != nil {
		return billing.Period{}, err
	}
	for _, r := range rows {
		if r.Requests > 0 {
			p := billing.PeriodOf(r.Start, current.Zone)
			if p.Start.Before(from.Start) {
				p = from
			}
			return p, nil
		}
	}
	return billing.Period{}, nil
}

// MaxCloseTenants bounds the tenants one close request names. A tenant's
// close is a dozen small queries (about 60 ms on the 2-core bench machine,
// four at a time: docs/performance.md), so a thousand take about a minute,
// inside the API's 2-minute write timeout; 50,000 took most of an hour and
// never answered.
const MaxCloseTenants = 1000

// CloseRequest is one close.
type CloseRequest struct {
	// Period is the month, "2026-11", in each tenant's zone.
	Period string
	// Tenants to close, at most MaxCloseTenants; empty: every tenant with
	// usage in or around the period, or a statement of the period before.
	Tenants []string
	// Grace overrides the default grace delay when not nil.
	Grace *time.Duration
	// Reprice lists closed periods before Period whose usage is to be
	// repriced with the book in force: the difference to what was billed
	// for them becomes repricing lines of Period's statements.
	Reprice []string
	// FlagUnpriced closes tenants whose usage has no list price (an
	// admin's explicit choice): their statements bill the rest and count
	// the unpriced requests. Without it those tenants are refused
	// (ErrUnpricedUsage, naming the models and requests) and the others
	// close.
	FlagUnpriced bool
}

// Close closes req.Period, returning each tenant's statement as stored.
// Closes run one at a time (Deps.Lock); a tenant already closed keeps its
// statement, so closing twice returns the same statements.
func (s *Service) Close(ctx context.Context, req CloseRequest) ([]billing.StoredStatement, error) {
	if _, err := billing.ParsePeriod(req.Period, time.UTC); err != nil {
		return nil, err
	}
	grace := s.cfg.Grace
	if req.Grace != nil {
		grace = *req.Grace
		if grace < 0 {
			return nil, fmt.Errorf("%w: grace %s is negative", ErrInvalidRequest, grace)
		}
	}
	if len(req.Tenants) > MaxCloseTenants {
		return nil, fmt.Errorf("%w: a close names at most %d tenants, this one names %d: split the list over several closes (each tenant's close is a dozen queries, about 60 ms), or name none to close every tenant with usage",
			ErrInvalidRequest, MaxCloseTenants, len(req.Tenants))
	}
	for _, t := range req.Tenants {
		if err := checkTenant(t); err != nil {
			return nil, err
		}
	}
	req.Tenants = slices.Compact(slices.Sorted(slices.Values(req.Tenants))) // a tenant named twice is closed once
	req.Reprice = slices.Compact(slices.Sorted(slices.Values(req.Reprice))) // a period named twice is repriced once
	for _, r := range req.Reprice {
		q, err := billing.ParsePeriod(r, time.UTC)
		if err != nil {
			return nil, err
		}
		if q.Key >= req.Period {
			return nil, fmt.Errorf("%w: repricing %s in %s: only periods before it can be repriced", ErrInvalidRequest, q.Key, req.Period)
		}
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	book, err := s.d.Prices(ctx)
	if err != nil {
		return nil, err
	}
	tenants := req.Tenants
	explicit := len(tenants) > 0
	if !explicit {
		if tenants, err = s.candidates(ctx, req.Period); err != nil {
			return nil, err
		}
	}
	caughtUp, err := s.caughtUp(ctx)
	if err != nil {
		return nil, fmt.Errorf("close %s: %w", req.Period, err)
	}
	now := s.cfg.Now()
	// Each tenant's period must be over (and ingest caught up) before the
	// cost rollups are asked about.
	zones := []*time.Location{time.UTC}
	if len(tenants) > 0 {
		zones = zones[:0]
		for _, t := range tenants {
			zones = append(zones, s.Zone(t))
		}
	}
	for _, z := range zones {
		p, err := billing.ParsePeriod(req.Period, z)
		if err == nil {
			err = p.CheckClose(now, grace, caughtUp)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := s.checkCosted(ctx, req.Period, tenants, caughtUp, book); err != nil {
		return nil, err
	}
	r := Request{Period: req.Period, Now: now, CaughtUp: caughtUp, Grace: grace, Book: book,
		ByDeployment: s.cfg.ByDeployment, Lookback: s.cfg.Lookback, SkipEmpty: !explicit, Reprice: req.Reprice,
		FlagUnpriced: req.FlagUnpriced}
	for _, t := range tenants {
		r.Tenants = append(r.Tenants, Tenant{ID: t, Zone: s.Zone(t), Contract: s.cfg.Accounts.Tenant(t).Contract})
	}
	stored, err := s.closer.Close(ctx, r)
	// The statements stored get their invoices, numbered under the lock.
	if ierr := s.issueInvoices(ctx, stored); ierr != nil {
		// Their events still go out, with their invoices: the notifier
		// issues them first (IssueInvoices) or waits for them.
		s.notify(stored)
		return stored, errors.Join(err, ierr)
	}
	s.notify(stored)
	return stored, err
}

// notify tells Deps.Notify of stored statements: their events go out.
func (s *Service) notify(stored []billing.StoredStatement) {
	if s.d.Notify != nil && len(stored) > 0 {
		s.d.Notify.Closed(stored)
	}
}

// caughtUp asks Deps.CaughtUp until ingest has caught up, for up to
// CatchUpWait (once a second): a close waits out a short lag.
func (s *Service) caughtUp(ctx context.Context) (time.Time, error) {
	if s.d.CaughtUp == nil {
		return s.cfg.Now(), nil
	}
	deadline := time.Now().Add(s.cfg.CatchUpWait)
	for {
		t, err := s.d.CaughtUp(ctx)
		if err == nil || !errors.Is(err, billing.ErrIngestBehind) || !time.Now().Before(deadline) {
			return t, err
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// lock takes the close lock.
func (s *Service) lock(ctx context.Context) (func(), error) {
	if s.d.Lock != nil {
		return s.d.Lock.Lock(ctx, "billing-close")
	}
	s.mu.Lock()
	return s.mu.Unlock, nil
}

// checkCosted waits (up to CatchUpWait) for every insert up to the latest
// end of the period among tenants' zones and, with an ingest check, up to
// the instant ingest caught up (events of the period inserted in the grace
// delay) to be rolled up and costed, with book: the statements' allocated
// cost comes from the cost rollups, and is stored for good. How far that
// is comes from rollup.Costed: the job's watermark, or the server's clock
// when nothing was inserted since it, so that a close on a quiet system
// does not wait for the job's once-a-minute idle watermark.
func (s *Service) checkCosted(ctx context.Context, period string, tenants []string, caughtUp time.Time, book *billing.PriceBook) error {
	var start, end time.Time
	for i, t := range tenants {
		p, err := billing.ParsePeriod(period, s.Zone(t))
		if err != nil {
			return err
		}
		if i == 0 || p.Start.Before(start) {
			start = p.Start
		}
		if p.End.After(end) {
			end = p.End
		}
	}
	if len(tenants) == 0 {
		return nil
	}
	if s.d.CaughtUp != nil && caughtUp.After(end) {
		end = caughtUp
	}
	deadline := time.Now().Add(s.cfg.CatchUpWait)
	for {
		behind, err := s.notCosted(ctx, start, end, book)
		if err != nil {
			return err
		}
		if behind == "" {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %s %s: retry once it has run", ErrRollupBehind, period, behind)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// notCosted says why the cost rollups of [start, end) are not complete
// under book yet; "" when they are.
func (s *Service) notCosted(ctx context.Context, start, end time.Time, book *billing.PriceBook) (string, error) {
	costed, ok, err := rollup.Costed(ctx, s.d.Store, rollup.DefaultSettle)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return "needs its usage rolled up and costed; the rollup job has not run yet", nil
	case costed.Before(end):
		return fmt.Sprintf("needs every insert up to %s rolled up and costed; the rollup job has reached %s",
			end.UTC().Format(time.RFC3339), costed.UTC().Format(time.RFC3339)), nil
	}
	// A price book put since the job's last run: the job recosts every
	// hour with it at its next run.
	stale, err := s.d.Store.StalePriceHours(ctx, book.Version(), start.Truncate(time.Hour))
	if err != nil {
		return "", err
	}
	for _, h := range stale {
		if h.Before(end) {
			return fmt.Sprintf("needs its cost computed with price book %s, the one in force; the rollup job has not recosted %s yet",
				book.Version(), h.UTC().Format(time.RFC3339)), nil
		}
	}
	return "", nil
}

// candidates are the tenants a close of period without a tenant list
// closes: those with usage from 15 hours before the UTC month before it to
// 15 hours after it (every zone's month lies in it, and late usage of the
// month before, of tenants that had none when it closed), and those with a
// statement of the month before (late usage of it becomes adjustments of
// this one), and the accounts file's tenants whose contract may charge
// without usage: a commitment, or a dedicated deployment in force before
// the period's end (its true-up or GPU-hours are billed though the tenant
// sent no token).
func (s *Service) candidates(ctx context.Context, period string) ([]string, error) {
	p, err := billing.ParsePeriod(period, time.UTC)
	if err != nil {
		return nil, err
	}
	prev := billing.PeriodOf(p.Start.Add(-time.Nanosecond), time.UTC)
	rows, err := s.d.Reads.Usage(ctx, query.UsageQuery{Start: prev.Start.Add(-15 * time.Hour), End: p.End.Add(15 * time.Hour), GroupBy: []string{"tenant_id"}})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rows {
		if r.TenantID != billing.IdleTenant {
			out = append(out, r.TenantID)
		}
	}
	err = s.d.Store.EachStatement(ctx, prev.Key, "", func(st billing.StoredStatement) error {
		out = append(out, st.Tenant)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if a := s.cfg.Accounts; a != nil {
		for _, t := range a.Tenants {
			if c := t.Contract; c != nil && t.ID != billing.IdleTenant && (c.Commitment != nil ||
				slices.ContainsFunc(c.Dedicated, func(d billing.DedicatedDeployment) bool { return d.EffectiveFrom.Before(p.End.Add(15 * time.Hour)) })) {
				out = append(out, t.ID)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// StatementView is a statement as one reader sees it: with the finance
// part for finance, without it for a tenant, and Content its JSON, the same
// bytes at every read of a closed statement.
type StatementView struct {
	Statement billing.Statement
	Content   []byte
	// Closed is false for an open period's draft, computed at the read
	// and never stored.
	Closed   bool
	ClosedAt time.Time
}

// Statement returns tenant's statement of period: the stored one when the
// period is closed, else a draft of the usage so far. finance keeps the
// finance part. A tenant with neither usage nor statements in the period
// is ErrNotFound.
func (s *Service) Statement(ctx context.Context, tenant, period string, finance bool) (StatementView, error) {
	p, err := s.tenantPeriod(tenant, period)
	if err != nil {
		return StatementView{}, err
	}
	stored, ok, err := s.d.Store.Statement(ctx, tenant, p.Key)
	if err != nil {
		return StatementView{}, err
	}
	if ok {
		return viewOf(stored, finance)
	}
	book, err := s.d.Prices(ctx)
	if err != nil {
		return StatementView{}, err
	}
	st, err := s.closer.compute(ctx, tenant, p, Request{Book: book, ByDeployment: s.cfg.ByDeployment, Lookback: s.cfg.Lookback,
		Tenants: []Tenant{{ID: tenant, Zone: p.Zone, Contract: s.cfg.Accounts.Tenant(tenant).Contract}}}, finance)
	if err != nil {
		return StatementView{}, err
	}
	if len(st.Lines) == 0 && len(st.Charges) == 0 { // a contract may charge without usage
		closed, err := s.d.Store.TenantStatements(ctx, tenant)
		if err != nil {
			return StatementView{}, err
		}
		if len(closed) == 0 {
			return StatementView{}, fmt.Errorf("%w: tenant %q has no usage in %s and no statements", ErrNotFound, tenant, p)
		}
	}
	// A draft changes as usage arrives: it has no hash, which names closed
	// statements only.
	st.Hash = ""
	content, err := json.Marshal(st)
	if err != nil {
		return StatementView{}, fmt.Errorf("encode statement: %w", err)
	}
	return StatementView{Statement: st, Content: content}, nil
}

// EachStatement calls fn with the closed statements of period (of tenant
// only, when not empty) in tenant order. A period no statement of which is
// closed is ErrNotClosed.
func (s *Service) EachStatement(ctx context.Context, period, tenant string, finance bool, fn func(StatementView) error) error {
	if _, err := billing.ParsePeriod(period, time.UTC); err != nil {
		return err
	}
	if tenant != "" {
		if err := checkTenant(tenant); err != nil {
			return err
		}
	}
	n := 0
	err := s.d.Store.EachStatement(ctx, period, tenant, func(st billing.StoredStatement) error {
		v, err := viewOf(st, finance)
		if err != nil {
			return err
		}
		n++
		return fn(v)
	})
	if err == nil && n == 0 {
		who := "any tenant"
		if tenant != "" {
			who = fmt.Sprintf("tenant %q", tenant)
		}
		err = fmt.Errorf("%w: %s is not closed for %s", ErrNotClosed, period, who)
	}
	return err
}

// viewOf is a stored statement as a reader sees it: the stored bytes for
// finance, the statement re-encoded without its finance part for a tenant
// (encoding is deterministic, so those bytes never change either).
func viewOf(st billing.StoredStatement, finance bool) (StatementView, error) {
	var bill billing.Statement
	if err := json.Unmarshal(st.Content, &bill); err != nil {
		return StatementView{}, fmt.Errorf("statement of %s for %s: %w", st.Tenant, st.Period, err)
	}
	v := StatementView{Statement: bill, Content: st.Content, Closed: true, ClosedAt: st.ClosedAt}
	if !finance && bill.Finance != nil {
		v.Statement.Finance = nil
		b, err := json.Marshal(v.Statement)
		if err != nil {
			return StatementView{}, fmt.Errorf("encode statement: %w", err)
		}
		v.Content = b
	}
	return v, nil
}

// UsageCostQuery selects detailed usage-and-cost rows.
type UsageCostQuery struct {
	// Tenant restricts to one tenant when not empty.
	Tenant string
	// Start (inclusive) and End (exclusive) lie on hour boundaries (day
	// boundaries for Step "day").
	Start, End time.Time
	// Step is "hour" (default) or "day".
	Step string
}

// EachUsageCost streams the usage-and-cost rows of q to fn, one per step,
// tenant, model and deployment. A row of an open period is priced with the
// book in force, one of a closed period with the book its statement was
// billed with; a row is split where a tenant's billing period ends inside
// it (zones like +05:30) and where its price changes (usageCostPricer), so
// a closed month's rows tie out to its statement. The book in force's
// policies allocate the cost. Rows come from the cost rollups: hours the
// rollup job has not costed yet are not in it.
func (s *Service) EachUsageCost(ctx context.Context, q UsageCostQuery, fn func(*export.UsageCostRow) error) error {
	if q.Tenant != "" {
		if err := checkTenant(q.Tenant); err != nil {
			return err
		}
	}
	step := q.Step
	if step == "" {
		step = "hour"
	}
	width := time.Hour
	if step == "day" {
		width = 24 * time.Hour
	}
	book, err := s.d.Prices(ctx)
	if err != nil {
		return err
	}
	cq := query.CostQuery{TenantID: q.Tenant, Start: q.Start, End: q.End, Step: step}.WithDefaults(book)
	regions, err := s.regions(ctx, q.Start, q.End)
	if err != nil {
		return err
	}
	pricer := newUsageCostPricer(s, book, cq, width)
	var out export.UsageCostRow
	return s.d.Reads.EachUsageCost(ctx, cq, func(r *query.UsageCostRow) error {
		t := pricer.tenantOf(r) // the tenant's billing period, cached
		p := &t.p
		out = export.UsageCostRow{
			ChargePeriodStart: r.Start, ChargePeriodEnd: r.Start.Add(width),
			BillingPeriod: p.Key, BillingPeriodStart: p.Start.UTC(), BillingPeriodEnd: p.End.UTC(),
			Tenant: r.Tenant, Model: r.Model, Deployment: r.Deployment, Region: regions.of(r.Deployment), Requests: r.Requests,
			InputTokens: r.InputTokens, CachedInputTokens: r.CachedInputTokens, OutputTokens: r.OutputTokens,
			Currency: book.Currency, ListCharge: billing.Money(r.ListCharge), AllocatedCost: billing.Money(r.CostNanos),
			PriceBook: strings.Join(r.PriceVersions, " "),
		}
		if price := pricer.inForcePrice(r.Model, r.Start); price != nil { // cached: the model's price and its id
			out.InputPer1M, out.CachedInputPer1M, out.OutputPer1M = price.price.InputPer1M, price.price.CachedInputPer1M, price.price.OutputPer1M
			out.PriceID = price.id
		}
		return pricer.emitFor(ctx, t, r, &out, fn)
	})
}

// tenantPeriod checks tenant and parses period in the tenant's zone.
func (s *Service) tenantPeriod(tenant, period string) (billing.Period, error) {
	if err := checkTenant(tenant); err != nil {
		return billing.Period{}, err
	}
	return billing.ParsePeriod(period, s.Zone(tenant))
}

// checkTenant refuses a malformed or reserved tenant id.
func checkTenant(tenant string) error {
	if tenant == "" {
		return fmt.Errorf("%w: tenant_id is required", ErrInvalidRequest)
	}
	if err := ident.CheckParam("tenant_id", tenant); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if strings.HasPrefix(tenant, "__") {
		// Reserved (ingest refuses it): billing.IdleTenant holds the
		// provider's idle GPU cost, which is no one's bill.
		return fmt.Errorf("%w: tenant_id %q is reserved (%s is the provider's idle GPU cost), not a billing account", ErrInvalidRequest, tenant, billing.IdleTenant)
	}
	return nil
}
