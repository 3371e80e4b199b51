package api

import (
	"cmp"
	"context"
	"slices"
	"time"
	"tokenmeter/query"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/billing"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// CostReader answers cost and GPU usage queries; *query.Service implements it.
type CostReader interface {
	Cost(ctx context.Context, q query.CostQuery) ([]query.CostRow, error)
	GPUUsage(ctx context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error)
}

// PriceBookStore keeps the versioned price books; *chstore.Store implements it.
type PriceBookStore interface {
	CurrentPriceBook(ctx context.Context) (version, book string, createdAt time.Time, ok bool, err error)
	PutPriceBook(ctx context.Context, version, book, source string, at time.Time) error
}

var _ CostReader = (*query.Service)(nil)

// costService implements meterv1.CostServiceServer.
type costService struct {
	meterv1.UnimplementedCostServiceServer
	store  CostReader
	prices PriceBookStore
}

// newCostService serves svc.Cost with the price books of svc.Prices, or of
// svc.Cost when it keeps them too.
func newCostService(svc *Services) *costService {
	prices := svc.Prices
	if prices == nil {
		prices, _ = svc.Cost.(PriceBookStore)
	}
	return &costService{store: svc.Cost, prices: prices}
}

// bookInForce is the price book in force (the empty book before any is
// stored): its currency labels amounts, its allocation section gives the
// default policies.
func bookInForce(ctx context.Context, store PriceBookStore) (*billing.PriceBook, error) {
	if store == nil {
		return billing.EmptyPriceBook(), nil
	}
	_, doc, _, ok, err := store.CurrentPriceBook(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return billing.EmptyPriceBook(), nil
	}
	return billing.ParsePriceBook([]byte(doc))
}

func money(cur string, nanos int64) *meterv1.Money {
	return &meterv1.Money{Currency: cur, Nanos: nanos, Amount: billing.Money(nanos).StringFixed(9)}
}

// per1k is cost per 1,000 tokens as a decimal string; empty without tokens.
func per1k(nanos int64, tokens uint64) string {
	m, ok := billing.CostPer1K(billing.Money(nanos), int64(tokens))
	if !ok {
		return ""
	}
	return m.StringFixed(9)
}

// costAcc sums the cost rows of a series or step.
type costAcc struct {
	cost, busy                            int64
	requests, input, cached, output, good uint64
	unReq, unIn, unOut                    uint64
	list                                  int64
	listUnpriced                          uint64
}

func (a *costAcc) add(r query.CostRow) {
	a.cost += r.CostNanos
	a.busy += r.BusyNanos
	a.requests += r.Requests
	a.input += r.InputTokens
	a.cached += r.CachedInputTokens
	a.output += r.OutputTokens
	a.good += r.GoodOutputTokens
	a.unReq += r.UnattributedRequests
	a.unIn += r.UnattributedInput
	a.unOut += r.UnattributedOutput
	a.list += r.ListCharge
	a.listUnpriced += r.ListUnpricedRequests
}

func (a costAcc) point(cur string, start time.Time) *meterv1.CostPoint {
	return &meterv1.CostPoint{
		Start:                      timestamppb.New(start),
		Cost:                       money(cur, a.cost),
		BusyCost:                   money(cur, a.busy),
		IdleCost:                   money(cur, a.cost-a.busy),
		Requests:                   a.requests,
		InputTokens:                a.input,
		CachedInputTokens:          a.cached,
		OutputTokens:               a.output,
		GoodOutputTokens:           a.good,
		CostPer_1KOutputTokens:     per1k(a.cost, a.output),
		CostPer_1KTokens:           per1k(a.cost, a.input+a.output),
		BusyCostPer_1KOutputTokens: per1k(a.busy, a.output),
		BusyCostPer_1KTokens:       per1k(a.busy, a.input+a.output),
		CostPer_1KGoodOutputTokens: per1k(a.cost, a.good),
		UnattributedRequests:       a.unReq,
		UnattributedInputTokens:    a.unIn,
		UnattributedOutputTokens:   a.unOut,
	}
}

func (s *costService) GetCost(ctx context.Context, req *meterv1.GetCostRequest) (*meterv1.GetCostResponse, error) {
	tenant, err := scopeTenant(ctx, req.GetTenantId())
	if err != nil {
		return nil, err
	}
	book, err := bookInForce(ctx, s.prices)
	if err != nil {
		return nil, err
	}
	q := query.CostQuery{TenantID: tenant, Step: req.GetStep(), GroupBy: req.GetGroupBy(),
		Busy: cmp.Or(req.GetBusyPolicy(), string(book.Allocation.Busy)), Idle: cmp.Or(req.GetIdlePolicy(), string(book.Allocation.Idle))}
	if req.GetStart() != nil {
		q.Start = req.GetStart().AsTime()
	}
	if req.GetEnd() != nil {
		q.End = req.GetEnd().AsTime()
	}
	if q, err = q.Normalize(); err != nil {
		return nil, err
	}
	pg, err := query.NewPage(q.GroupBy, int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	cur := book.Currency
	rows, err := s.store.Cost(ctx, q)
	if err != nil {
		return nil, err
	}
	keys, series, next := query.Paginate(pg, rows, func(r query.CostRow) map[string]string { return r.Group })
	resp := &meterv1.GetCostResponse{NextPageToken: next, BusyPolicy: q.Busy, IdlePolicy: q.Idle, Currency: cur}
	out, versions := seriesOf(keys, series, cur, q.Start, func() accumulator[query.CostRow, *meterv1.CostPoint] { return &costAcc{} },
		func(r query.CostRow) (map[string]string, time.Time, []string) {
			return r.Group, r.Start, r.PriceVersions
		})
	for _, s := range out {
		resp.Series = append(resp.Series, &meterv1.CostSeries{Group: s.group, Points: s.points, Summary: s.summary})
	}
	resp.PriceVersions = versions
	return resp, nil
}

// accumulator sums the rows of a step or a whole series into a point.
type accumulator[R, P any] interface {
	add(R)
	point(cur string, start time.Time) P
}

// oneSeries is a group's points and summary.
type oneSeries[P any] struct {
	group   map[string]string
	points  []P
	summary P
}

// seriesOf builds the series of one page (keys, in order): a point per row
// (rows are steps in time order) and a summary over the range, and lists
// the price versions the rows were computed with.
func seriesOf[R, P any](keys []string, series map[string][]R, cur string, rangeStart time.Time,
	newAcc func() accumulator[R, P], meta func(R) (group map[string]string, start time.Time, versions []string)) ([]oneSeries[P], []string) {
	versions := map[string]bool{}
	var out []oneSeries[P]
	for _, k := range keys {
		total := newAcc()
		var s oneSeries[P]
		for _, r := range series[k] {
			group, start, vs := meta(r)
			s.group = group
			step := newAcc()
			step.add(r)
			total.add(r)
			s.points = append(s.points, step.point(cur, start))
			for _, v := range vs {
				versions[v] = true
			}
		}
		s.summary = total.point(cur, rangeStart)
		out = append(out, s)
	}
	return out, sortedKeys(versions)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		if k != "" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// gpuAcc sums the GPU usage rows of a series or step.
type gpuAcc struct {
	gpu, busy, covered, inst, energy, unpriced float64
	maxGPUs                                    uint32
	cost, busyCost, idleCost                   int64
	input, output                              uint64
	tokens                                     bool
}

func (a *gpuAcc) add(r query.GPUUsageRow) {
	a.gpu += r.GPUSeconds
	a.busy += r.BusySeconds
	a.covered += r.CoveredSeconds
	a.inst += r.InstanceSeconds
	a.energy += r.EnergyJoules
	a.unpriced += r.UnpricedSeconds
	a.maxGPUs = max(a.maxGPUs, r.MaxGPUs)
	a.cost += r.CostNanos
	a.busyCost += r.BusyCostNanos
	a.idleCost += r.IdleCostNanos
	a.input += r.InputTokens
	a.output += r.OutputTokens
	a.tokens = r.TokensKnown
}

func (a gpuAcc) point(cur string, start time.Time) *meterv1.GpuUsagePoint {
	p := &meterv1.GpuUsagePoint{
		Start:            timestamppb.New(start),
		GpuHours:         a.gpu / 3600,
		BusyGpuHours:     a.busy / 3600,
		IdleGpuHours:     (a.gpu - a.busy) / 3600,
		Utilization:      query.Ratio(a.busy, a.gpu),
		EnergyKwh:        a.energy / 3.6e6,
		Coverage:         query.Ratio(a.covered, a.inst),
		MaxGpus:          a.maxGPUs,
		Cost:             money(cur, a.cost),
		BusyCost:         money(cur, a.busyCost),
		IdleCost:         money(cur, a.idleCost),
		UnpricedGpuHours: a.unpriced / 3600,
	}
	if a.tokens {
		p.OutputTokens = a.output
		p.TotalTokens = a.input + a.output
		p.TokensPerGpuHour, _ = billing.TokensPerGPUHour(int64(a.input+a.output), a.gpu)
	}
	return p
}

func (s *costService) GetGpuUsage(ctx context.Context, req *meterv1.GetGpuUsageRequest) (*meterv1.GetGpuUsageResponse, error) {
	q := query.GPUUsageQuery{Step: req.GetStep(), GroupBy: req.GetGroupBy()}
	if req.GetStart() != nil {
		q.Start = req.GetStart().AsTime()
	}
	if req.GetEnd() != nil {
		q.End = req.GetEnd().AsTime()
	}
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	pg, err := query.NewPage(q.GroupBy, int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	book, err := bookInForce(ctx, s.prices)
	if err != nil {
		return nil, err
	}
	cur := book.Currency
	rows, err := s.store.GPUUsage(ctx, q)
	if err != nil {
		return nil, err
	}
	keys, series, next := query.Paginate(pg, rows, func(r query.GPUUsageRow) map[string]string { return r.Group })
	resp := &meterv1.GetGpuUsageResponse{NextPageToken: next, Currency: cur}
	out, versions := seriesOf(keys, series, cur, q.Start, func() accumulator[query.GPUUsageRow, *meterv1.GpuUsagePoint] { return &gpuAcc{} },
		func(r query.GPUUsageRow) (map[string]string, time.Time, []string) {
			return r.Group, r.Start, r.PriceVersions
		})
	for _, s := range out {
		resp.Series = append(resp.Series, &meterv1.GpuUsageSeries{Group: s.group, Points: s.points, Summary: s.summary})
	}
	resp.PriceVersions = versions
	return resp, nil
}
