package api

import (
	"context"
	"fmt"
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
	// tenantCost is Config.TenantCost: whether tenant keys see the
	// allocated cost (seesCost).
	tenantCost bool
}

// newCostService serves svc.Cost with the price books of svc.Prices, or of
// svc.Cost when it keeps them too.
func newCostService(svc *Services) *costService {
	return &costService{store: svc.Cost, prices: svc.priceBooks(svc.Cost)}
}

// priceBooks is where a service backed by backend reads the price book in
// force: svc.Prices, else backend itself when it keeps the price books;
// nil when neither does (New refuses that).
func (svc *Services) priceBooks(backend any) PriceBookStore {
	if svc.Prices != nil {
		return svc.Prices
	}
	prices, _ := backend.(PriceBookStore)
	return prices
}

// bookInForce is the price book in force (the empty book before any is
// stored): its currency labels amounts, its allocation section gives the
// default policies.
func bookInForce(ctx context.Context, store PriceBookStore) (*billing.PriceBook, error) {
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

// per1k is an amount per 1,000 tokens as a decimal string; empty without
// tokens.
func per1k(p query.Per1K) string {
	if !p.OK {
		return ""
	}
	return p.Money.StringFixed(9)
}

func costPoint(cur string, p query.CostPoint) *meterv1.CostPoint {
	return &meterv1.CostPoint{
		Start:                      timestamppb.New(p.Start),
		Cost:                       money(cur, p.CostNanos),
		BusyCost:                   money(cur, p.BusyNanos),
		IdleCost:                   money(cur, p.IdleNanos),
		Requests:                   p.Requests,
		InputTokens:                p.InputTokens,
		CachedInputTokens:          p.CachedInputTokens,
		OutputTokens:               p.OutputTokens,
		GoodOutputTokens:           p.GoodOutputTokens,
		CostPer_1KOutputTokens:     per1k(p.CostPer1KOutput),
		CostPer_1KTokens:           per1k(p.CostPer1K),
		BusyCostPer_1KOutputTokens: per1k(p.BusyCostPer1KOutput),
		BusyCostPer_1KTokens:       per1k(p.BusyCostPer1K),
		CostPer_1KGoodOutputTokens: per1k(p.CostPer1KGoodOutput),
		UnattributedRequests:       p.UnattributedRequests,
		UnattributedInputTokens:    p.UnattributedInput,
		UnattributedOutputTokens:   p.UnattributedOutput,
		ListCharge:                 money(cur, p.ListCharge),
		ListUnpricedRequests:       p.ListUnpricedRequests,
		CostPerRequest:             per1k(p.CostPerRequest),
		GpuSeconds:                 gpuSeconds(p.GPUMs),
		GpuHours:                   float64(p.GPUMs) / 3.6e6,
		BusyGpuHours:               float64(p.GPUBusyMs) / 3.6e6,
		IdleGpuHours:               float64(p.GPUIdleMs) / 3.6e6,
	}
}

// gpuSeconds writes GPU-milliseconds as exact seconds with three decimals.
func gpuSeconds(ms uint64) string {
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}

func gpuUsagePoint(cur string, a query.GPUUsagePoint) *meterv1.GpuUsagePoint {
	p := &meterv1.GpuUsagePoint{
		Start:            timestamppb.New(a.Start),
		GpuHours:         a.GPUHours,
		BusyGpuHours:     a.BusyGPUHours,
		IdleGpuHours:     a.IdleGPUHours,
		Utilization:      a.Utilization,
		EnergyKwh:        a.EnergyKWh,
		Coverage:         a.Coverage,
		MaxGpus:          a.MaxGPUs,
		Cost:             money(cur, a.CostNanos),
		BusyCost:         money(cur, a.BusyCostNanos),
		IdleCost:         money(cur, a.IdleCostNanos),
		UnpricedGpuHours: a.UnpricedGPUHours,
		Telemetry:        gpuTelemetry(a.Telemetry),
	}
	if a.TokensKnown {
		p.OutputTokens = a.OutputTokens
		p.TotalTokens = a.TotalTokens
		p.TokensPerGpuHour = a.TokensPerGPUHour
	}
	return p
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
		Busy: req.GetBusyPolicy(), Idle: req.GetIdlePolicy()}.WithDefaults(book)
	q.Start, q.End = timeOf(req.GetStart()), timeOf(req.GetEnd())
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
	series, next, versions := query.CostSeriesOf(q, pg, rows)
	resp := &meterv1.GetCostResponse{NextPageToken: next, BusyPolicy: q.Busy, IdlePolicy: q.Idle, Currency: cur}
	for _, sr := range series {
		out := &meterv1.CostSeries{Group: sr.Group, Summary: costPoint(cur, sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, costPoint(cur, p))
		}
		resp.Series = append(resp.Series, out)
	}
	resp.PriceVersions = versions
	if !seesCost(ctx, s.tenantCost) {
		hideCost(resp)
	}
	return resp, nil
}

func (s *costService) GetGpuUsage(ctx context.Context, req *meterv1.GetGpuUsageRequest) (*meterv1.GetGpuUsageResponse, error) {
	q := query.GPUUsageQuery{Step: req.GetStep(), GroupBy: req.GetGroupBy()}
	q.Start, q.End = timeOf(req.GetStart()), timeOf(req.GetEnd())
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
	series, next, versions := query.GPUUsageSeriesOf(q, pg, rows)
	resp := &meterv1.GetGpuUsageResponse{NextPageToken: next, Currency: cur}
	for _, sr := range series {
		out := &meterv1.GpuUsageSeries{Group: sr.Group, Summary: gpuUsagePoint(cur, sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, gpuUsagePoint(cur, p))
		}
		resp.Series = append(resp.Series, out)
	}
	resp.PriceVersions = versions
	return resp, nil
}
