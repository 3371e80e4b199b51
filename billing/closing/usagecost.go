package closing

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"tokenmeter/billing"
	"tokenmeter/billing/export"
	"tokenmeter/query"
)

// usageCostPricer gives usage-cost rows their billing period and prices, so
// that a closed month's rows tie out to its statement:
//
//   - A row of a closed period is priced with the price book its statement
//     was billed with, not the book in force (a later book, a repricing,
//     does not change what that month's usage cost).
//   - A row that spans a billing period's edge (an hour or a day of a tenant
//     in a zone that is not a whole number of hours from UTC, such as
//     +05:30, whose months start at 18:30 UTC) or a price change of its
//     book is split there: each piece's tokens are read for its instants
//     (the last piece takes the rest, so the pieces add up to the row), is
//     labelled with its own period and priced at its own price. The
//     allocated cost of an hour goes to the piece its start lies in, as the
//     statements' finance part counts the hours that start in a period.
type usageCostPricer struct {
	s       *Service
	inForce *billing.PriceBook
	cq      query.CostQuery // the export's query: its cost policies
	width   time.Duration
	closed  map[string]map[string]string  // period → tenant → the book version of its closed statement
	books   map[string]*billing.PriceBook // version → book
	usage   map[pieceKey]map[[2]string]query.UsageRow
	cost    map[pieceKey]map[[2]string]int64
	// The fast path's caches: each tenant's period of its last row and the
	// book pricing it, and per book its version and each model's prices
	// and price change instants.
	tenants map[string]*tenantPeriod
	bookSt  map[*billing.PriceBook]*bookState
	last    *tenantPeriod // the last row's tenant
}

// tenantPeriod is a tenant's billing period of its last row, and the book
// that prices it (nil until a row needs it).
type tenantPeriod struct {
	name string
	p    billing.Period
	book *bookState
	// next is the tenant whose rows came after this one's last time: rows
	// come in (hour, tenant) order, the same tenants each hour, so it is
	// mostly the next row's tenant, found without hashing its name.
	next *tenantPeriod
}

// bookState caches what pricing a row reads of a book.
type bookState struct {
	book    *billing.PriceBook
	version string // "" until price needs it
	models  map[string]*modelPrices
}

// modelPrices are one model's token prices in a book (with their ids),
// its price change instants, and the last price looked up by at with the
// instants it holds for, [from, until).
type modelPrices struct {
	prices      []pricedAt
	changes     []time.Time
	from, until time.Time
	bounded     [2]bool // from, until set (else unbounded)
	last        int     // index in prices of the last lookup's answer, -1: none
	looked      bool
}

// pricedAt is a token price of a book and its id, from its EffectiveFrom.
type pricedAt struct {
	price billing.TokenPrice
	id    string
}

type pieceKey struct {
	tenant     string
	start, end time.Time
}

func newUsageCostPricer(s *Service, inForce *billing.PriceBook, cq query.CostQuery, width time.Duration) *usageCostPricer {
	return &usageCostPricer{s: s, inForce: inForce, cq: cq, width: width, closed: map[string]map[string]string{}, books: map[string]*billing.PriceBook{},
		tenants: map[string]*tenantPeriod{}, bookSt: map[*billing.PriceBook]*bookState{},
		usage: map[pieceKey]map[[2]string]query.UsageRow{}, cost: map[pieceKey]map[[2]string]int64{}}
}

// bookOf is the book that prices tenant's period p: its closed statement's,
// or the book in force while p is open. The statements of a period are
// read once, all tenants' together.
func (x *usageCostPricer) bookOf(ctx context.Context, tenant string, p billing.Period) (*billing.PriceBook, error) {
	versions, ok := x.closed[p.Key]
	if !ok {
		versions = map[string]string{}
		err := x.s.d.Store.EachStatement(ctx, p.Key, x.cq.TenantID, func(stored billing.StoredStatement) error {
			var st struct {
				PriceBook string `json:"price_book"`
			}
			if err := json.Unmarshal(stored.Content, &st); err != nil {
				return fmt.Errorf("statement of %s for %s: %w", stored.Tenant, stored.Period, err)
			}
			versions[stored.Tenant] = st.PriceBook
			return nil
		})
		if err != nil {
			return nil, err
		}
		x.closed[p.Key] = versions
	}
	version, closed := versions[tenant]
	if !closed {
		return x.inForce, nil
	}
	if b, ok := x.books[version]; ok {
		return b, nil
	}
	b, err := x.s.closer.bookOf(ctx, version, x.inForce)
	if err != nil {
		return nil, fmt.Errorf("statement of %s for %s: %w", tenant, p.Key, err)
	}
	x.books[version] = b
	return b, nil
}

// piece is a part of a row: its instants, billing period and pricing book.
type piece struct {
	start, end time.Time
	period     billing.Period
	book       *billing.PriceBook
}

// pieces cuts [start, end) of tenant's model at its billing periods' edges
// and at the price changes of each period's book.
func (x *usageCostPricer) pieces(ctx context.Context, tenant, model string, start, end time.Time) ([]piece, error) {
	var out []piece
	zone := x.s.Zone(tenant)
	for at := start; at.Before(end); {
		p := billing.PeriodOf(at, zone)
		book, err := x.bookOf(ctx, tenant, p)
		if err != nil {
			return nil, err
		}
		until := end
		if p.End.Before(until) {
			until = p.End
		}
		cuts := []time.Time{at}
		for _, tp := range book.TokenPrices {
			if tp.Model == model && tp.EffectiveFrom.After(at) && tp.EffectiveFrom.Before(until) {
				cuts = append(cuts, tp.EffectiveFrom)
			}
		}
		slices.SortFunc(cuts, time.Time.Compare)
		cuts = slices.CompactFunc(cuts, time.Time.Equal)
		cuts = append(cuts, until)
		for i := 0; i+1 < len(cuts); i++ {
			out = append(out, piece{start: cuts[i], end: cuts[i+1], period: p, book: book})
		}
		at = until
	}
	return out, nil
}

// state is book's cache.
func (x *usageCostPricer) state(book *billing.PriceBook) *bookState {
	bs, ok := x.bookSt[book]
	if !ok {
		bs = &bookState{book: book, models: map[string]*modelPrices{}}
		x.bookSt[book] = bs
	}
	return bs
}

// model is model's prices in the book.
func (bs *bookState) model(model string) *modelPrices {
	mp, ok := bs.models[model]
	if !ok {
		mp = &modelPrices{last: -1}
		for _, tp := range bs.book.TokenPrices {
			if tp.Model == model {
				mp.prices = append(mp.prices, pricedAt{price: tp, id: tp.ID()})
				mp.changes = append(mp.changes, tp.EffectiveFrom)
			}
		}
		bs.models[model] = mp
	}
	return mp
}

// changesInside reports whether the model's price changes inside
// (start, end).
func (mp *modelPrices) changesInside(start, end time.Time) bool {
	for _, at := range mp.changes {
		if at.After(start) && at.Before(end) {
			return true
		}
	}
	return false
}

// at is the model's price at t as PriceBook.TokenPrice answers (the latest
// EffectiveFrom not after t; of equal ones the first), nil when none: the
// last answer while t stays in the instants it holds for.
func (mp *modelPrices) at(t time.Time) *pricedAt {
	if mp.looked && (!mp.bounded[0] || !t.Before(mp.from)) && (!mp.bounded[1] || t.Before(mp.until)) {
		if mp.last < 0 {
			return nil
		}
		return &mp.prices[mp.last]
	}
	best := -1
	for i := range mp.prices {
		if !mp.prices[i].price.EffectiveFrom.After(t) && (best < 0 || mp.prices[i].price.EffectiveFrom.After(mp.prices[best].price.EffectiveFrom)) {
			best = i
		}
	}
	// The answer holds from its EffectiveFrom (from the start of time when
	// none) until the next EffectiveFrom after t.
	mp.looked, mp.last, mp.bounded = true, best, [2]bool{best >= 0, false}
	if best >= 0 {
		mp.from = mp.prices[best].price.EffectiveFrom
	}
	for _, at := range mp.changes {
		if at.After(t) && (!mp.bounded[1] || at.Before(mp.until)) {
			mp.until, mp.bounded[1] = at, true
		}
	}
	if best < 0 {
		return nil
	}
	return &mp.prices[best]
}

// tenantOf is r's tenant's billing period of r's start (the last row's,
// while it holds r).
func (x *usageCostPricer) tenantOf(r *query.UsageCostRow) *tenantPeriod {
	t := x.last
	switch {
	case t != nil && t.name == r.Tenant:
	case t != nil && t.next != nil && t.next.name == r.Tenant:
		t = t.next
	default:
		var ok bool
		if t, ok = x.tenants[r.Tenant]; !ok {
			t = &tenantPeriod{name: r.Tenant}
			x.tenants[r.Tenant] = t
		}
		if x.last != nil {
			x.last.next = t
		}
	}
	x.last = t
	if t.p.Key == "" || !t.p.Contains(r.Start) {
		t.p, t.book = billing.PeriodOf(r.Start, x.s.Zone(r.Tenant)), nil
	}
	return t
}

// inForcePrice is the price of model at t in the book in force, nil when
// it has none.
func (x *usageCostPricer) inForcePrice(model string, t time.Time) *pricedAt {
	return x.state(x.inForce).model(model).at(t)
}

// emit writes row r (out filled from it as one piece: its step, the book
// in force) as the rows of its pieces.
func (x *usageCostPricer) emit(ctx context.Context, r *query.UsageCostRow, out *export.UsageCostRow, fn func(*export.UsageCostRow) error) error {
	return x.emitFor(ctx, x.tenantOf(r), r, out, fn)
}

// emitFor is emit with r's tenant's period t (tenantOf).
func (x *usageCostPricer) emitFor(ctx context.Context, t *tenantPeriod, r *query.UsageCostRow, out *export.UsageCostRow, fn func(*export.UsageCostRow) error) error {
	if r.Tenant == billing.IdleTenant {
		return fn(out) // no tenant's: no billing period to cut at, no statement
	}
	end := r.Start.Add(x.width)
	// Most rows lie inside one period with no price change: priced as they
	// are, without allocating (the export streams 500,000 rows a second).
	if p := t.p; !end.After(p.End) {
		if t.book == nil {
			book, err := x.bookOf(ctx, r.Tenant, p)
			if err != nil {
				return err
			}
			t.book = x.state(book)
		}
		if !t.book.model(r.Model).changesInside(r.Start, end) {
			if t.book.book != x.inForce {
				x.price(out, piece{start: r.Start, end: end, period: p, book: t.book.book})
			}
			return fn(out)
		}
	}
	ps, err := x.pieces(ctx, r.Tenant, r.Model, r.Start, end)
	if err != nil {
		return err
	}
	if len(ps) == 1 {
		if ps[0].book != x.inForce {
			x.price(out, ps[0])
		}
		return fn(out)
	}
	whole := *out
	left := whole // what the pieces so far have not taken
	for i, pc := range ps {
		row := whole
		if i < len(ps)-1 {
			u, err := x.usageOf(ctx, r.Tenant, pc.start, pc.end)
			if err != nil {
				return err
			}
			got := u[[2]string{r.Model, r.Deployment}]
			row.Requests, row.InputTokens = min(uint64(got.Requests), left.Requests), min(uint64(got.PromptTokens), left.InputTokens)
			row.CachedInputTokens = min(uint64(got.CachedPromptTokens), left.CachedInputTokens, row.InputTokens)
			row.OutputTokens = min(uint64(got.OutputTokens), left.OutputTokens)
			row.AllocatedCost, err = x.costOf(ctx, r, pc)
			if err != nil {
				return err
			}
			left.Requests, left.InputTokens = left.Requests-row.Requests, left.InputTokens-row.InputTokens
			left.CachedInputTokens, left.OutputTokens = left.CachedInputTokens-row.CachedInputTokens, left.OutputTokens-row.OutputTokens
			left.AllocatedCost -= row.AllocatedCost
		} else {
			row.Requests, row.InputTokens, row.CachedInputTokens = left.Requests, left.InputTokens, left.CachedInputTokens
			row.OutputTokens, row.AllocatedCost = left.OutputTokens, left.AllocatedCost
			if row.CachedInputTokens > row.InputTokens {
				row.CachedInputTokens = row.InputTokens
			}
		}
		if row.Requests+row.InputTokens+row.OutputTokens == 0 && row.AllocatedCost == 0 {
			continue
		}
		row.ChargePeriodStart, row.ChargePeriodEnd = pc.start, pc.end
		row.BillingPeriod, row.BillingPeriodStart, row.BillingPeriodEnd = pc.period.Key, pc.period.Start.UTC(), pc.period.End.UTC()
		x.price(&row, pc)
		if err := fn(&row); err != nil {
			return err
		}
	}
	return nil
}

// price prices row's tokens with pc's book at pc's start, as
// PriceBook.TokenPrice and ListCharge do (listCharge), with the book's
// version and prices cached: a closed month priced with another book than
// the one in force reprices every row.
func (x *usageCostPricer) price(row *export.UsageCostRow, pc piece) {
	row.InputPer1M, row.CachedInputPer1M, row.OutputPer1M, row.PriceID, row.ListCharge = 0, 0, 0, "", 0
	bs := x.state(pc.book)
	if bs.version == "" {
		bs.version = pc.book.Version()
	}
	row.PriceBook = bs.version
	ps := bs.model(row.Model).prices
	best := -1
	for i := range ps {
		if !ps[i].price.EffectiveFrom.After(pc.start) && (best < 0 || ps[i].price.EffectiveFrom.After(ps[best].price.EffectiveFrom)) {
			best = i
		}
	}
	if best < 0 {
		return
	}
	p := ps[best].price
	row.InputPer1M, row.CachedInputPer1M, row.OutputPer1M, row.PriceID = p.InputPer1M, p.CachedInputPer1M, p.OutputPer1M, ps[best].id
	if row.CachedInputTokens > row.InputTokens {
		return // not a charge (ListCharge refuses it too)
	}
	if m, ok := listCharge(p, row.InputTokens-row.CachedInputTokens, row.CachedInputTokens, row.OutputTokens); ok {
		row.ListCharge = m
		return
	}
	m, _, _ := pc.book.ListCharge(row.Model, pc.start, int64(row.InputTokens), int64(row.CachedInputTokens), int64(row.OutputTokens))
	row.ListCharge = m
}

// listCharge is PriceBook.ListCharge's charge in 128-bit integers: the
// tokens of each kind × its price per 1M, summed, ÷ 10^6 rounded half to
// even to a nano-unit. ok is false when a price is negative or a sum does
// not fit (the caller then asks the book).
func listCharge(p billing.TokenPrice, uncached, cached, output uint64) (billing.Money, bool) {
	var hi, lo uint64
	for _, t := range [3][2]uint64{{uncached, uint64(p.InputPer1M)}, {cached, uint64(p.CachedInputPer1M)}, {output, uint64(p.OutputPer1M)}} {
		if int64(t[1]) < 0 {
			return 0, false
		}
		h, l := bits.Mul64(t[0], t[1])
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi, c = bits.Add64(hi, h, c)
		if c != 0 {
			return 0, false
		}
	}
	const million = 1_000_000
	if hi >= million {
		return 0, false
	}
	q, r := bits.Div64(hi, lo, million)
	if 2*r > million || (2*r == million && q&1 == 1) {
		q++
	}
	if q > math.MaxInt64 {
		return 0, false
	}
	return billing.Money(q), true
}

// usageOf is tenant's usage of [start, end) by model and deployment.
func (x *usageCostPricer) usageOf(ctx context.Context, tenant string, start, end time.Time) (map[[2]string]query.UsageRow, error) {
	k := pieceKey{tenant, start, end}
	if u, ok := x.usage[k]; ok {
		return u, nil
	}
	rows, err := x.s.d.Reads.Usage(ctx, query.UsageQuery{TenantID: tenant, Start: start, End: end, GroupBy: []string{"model", "deployment"}})
	if err != nil {
		return nil, err
	}
	u := make(map[[2]string]query.UsageRow, len(rows))
	for _, row := range rows {
		u[[2]string{row.Model, row.Deployment}] = row
	}
	x.usage[k] = u
	return u, nil
}

// costOf is the allocated cost of r's piece pc: the cost of the hours of r
// that start in pc.
func (x *usageCostPricer) costOf(ctx context.Context, r *query.UsageCostRow, pc piece) (billing.Money, error) {
	from, to := ceilHour(pc.start), ceilHour(pc.end)
	if x.width == time.Hour {
		if !pc.start.After(r.Start) && pc.end.After(r.Start) {
			return billing.Money(r.CostNanos), nil
		}
		return 0, nil
	}
	if !from.Before(to) {
		return 0, nil
	}
	k := pieceKey{r.Tenant, from, to}
	c, ok := x.cost[k]
	if !ok {
		q := x.cq
		q.TenantID, q.Start, q.End, q.Step, q.GroupBy = r.Tenant, from, to, "hour", []string{"model", "deployment"}
		rows, err := x.s.d.Reads.Cost(ctx, q)
		if err != nil {
			return 0, fmt.Errorf("allocated cost: %w", err)
		}
		c = map[[2]string]int64{}
		for _, row := range rows {
			c[[2]string{row.Group["model"], row.Group["deployment"]}] += row.CostNanos
		}
		x.cost[k] = c
	}
	return billing.Money(c[[2]string{r.Model, r.Deployment}]), nil
}
