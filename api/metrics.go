package api

import (
	"context"
	"tokenmeter/query"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/rollup/sketch"
)

// RollupReader answers rollup queries; *query.Service implements it.
type RollupReader interface {
	Rollups(ctx context.Context, q query.RollupQuery) ([]query.RollupRow, error)
	RawLatency(ctx context.Context, q query.RollupQuery) ([]query.RawLatencyRow, error)
	Traffic(ctx context.Context, q query.RollupQuery) ([]query.TrafficRow, error)
}

var _ RollupReader = (*query.Service)(nil)

// metricsService implements meterv1.MetricsServiceServer.
type metricsService struct {
	meterv1.UnimplementedMetricsServiceServer
	store RollupReader
}

// selection is a checked SeriesSelector.
type selection struct {
	q    query.RollupQuery
	page query.Page
}

func (s *metricsService) selection(ctx context.Context, sel *meterv1.SeriesSelector) (selection, error) {
	tenant, err := scopeTenant(ctx, sel.GetTenantId())
	if err != nil {
		return selection{}, err
	}
	q := query.RollupQuery{TenantID: tenant, Step: sel.GetStep(), GroupBy: sel.GetGroupBy()}
	q.Start, q.End = timeOf(sel.GetStart()), timeOf(sel.GetEnd())
	q, err = q.Normalize()
	if err != nil {
		return selection{}, err
	}
	pg, err := query.NewPage(q.GroupBy, int(sel.GetPageSize()), sel.GetPageToken())
	if err != nil {
		return selection{}, err
	}
	return selection{q: q, page: pg}, nil
}

func (s *metricsService) GetLatency(ctx context.Context, req *meterv1.GetLatencyRequest) (*meterv1.GetLatencyResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	resp := &meterv1.GetLatencyResponse{RelativeAccuracy: sketch.RelativeAccuracy}
	var series []query.LatencySeries
	if req.GetExact() {
		resp.RelativeAccuracy = 0
		rows, err := s.store.RawLatency(ctx, sel.q)
		if err != nil {
			return nil, err
		}
		series, resp.NextPageToken, err = query.ExactLatencySeriesOf(sel.q, sel.page, rows)
		if err != nil {
			return nil, err
		}
	} else {
		q := sel.q
		q.Columns = query.LatencyBreakdownColumns
		rows, err := s.store.Rollups(ctx, q)
		if err != nil {
			return nil, err
		}
		series, resp.NextPageToken, err = query.LatencySeriesOf(sel.q, sel.page, rows)
		if err != nil {
			return nil, err
		}
	}
	for _, sr := range series {
		out := &meterv1.LatencySeries{Group: sr.Group, Summary: latencyPoint(sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, latencyPoint(p))
		}
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

// latencyPoint maps the stats of a step (or a summary) to the protocol.
func latencyPoint(p query.LatencyPoint) *meterv1.LatencyPoint {
	stats := func(m string) *meterv1.LatencyStats {
		st := p.Metrics[m]
		if st == nil {
			return nil // prefill, decode and the output classes of a minute step
		}
		return &meterv1.LatencyStats{Count: st.Count, Mean: st.Mean, P50: st.P50, P90: st.P90, P95: st.P95, P99: st.P99,
			TailRatio: st.TailRatio, MaxP99: st.MaxP99}
	}
	return &meterv1.LatencyPoint{Start: timestamppb.New(p.Start), Ttft: stats("ttft"), Itl: stats("itl"), E2E: stats("e2e"), Queue: stats("queue"),
		Prefill: stats("prefill"), Decode: stats("decode"),
		E2EShortOutput: stats("e2e_short"), E2EMediumOutput: stats("e2e_medium"), E2ELongOutput: stats("e2e_long")}
}

func (s *metricsService) GetGoodput(ctx context.Context, req *meterv1.GetGoodputRequest) (*meterv1.GetGoodputResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	q := sel.q
	q.Columns = query.CounterColumns
	rows, err := s.store.Rollups(ctx, q)
	if err != nil {
		return nil, err
	}
	series, next := query.GoodputSeriesOf(sel.q, sel.page, rows)
	resp := &meterv1.GetGoodputResponse{NextPageToken: next}
	for _, sr := range series {
		out := &meterv1.GoodputSeries{Group: sr.Group, Summary: goodputPoint(sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, goodputPoint(p))
		}
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

func goodputPoint(p query.GoodputPoint) *meterv1.GoodputPoint {
	return &meterv1.GoodputPoint{
		Start: timestamppb.New(p.Start), Requests: p.Requests, GoodRequests: p.GoodRequests,
		Attainment: p.Attainment, GoodputRequestsPerSecond: p.GoodputRequestsPerSecond,
		OutputTokens: p.OutputTokens, GoodOutputTokens: p.GoodOutputTokens,
		GoodputOutputTokensPerSecond: p.GoodputOutputTokensPerSecond, GoodputRatio: p.GoodputRatio,
		SloVersionMin: p.SLOVersionMin, SloVersionMax: p.SLOVersionMax,
	}
}

// GetTraffic maps the traffic series (each step's counters and busiest
// minute as rates, see query.Service.Traffic) to the protocol.
func (s *metricsService) GetTraffic(ctx context.Context, req *meterv1.GetTrafficRequest) (*meterv1.GetTrafficResponse, error) {
	sel, err := s.selection(ctx, req.GetSelector())
	if err != nil {
		return nil, err
	}
	q := sel.q
	q.TokenSizes = true
	rows, err := s.store.Traffic(ctx, q)
	if err != nil {
		return nil, err
	}
	series, next, err := query.TrafficSeriesOf(sel.q, sel.page, rows)
	if err != nil {
		return nil, err
	}
	resp := &meterv1.GetTrafficResponse{NextPageToken: next}
	for _, sr := range series {
		out := &meterv1.TrafficSeries{Group: sr.Group, Summary: trafficPoint(sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, trafficPoint(p))
		}
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

func trafficPoint(p query.TrafficPoint) *meterv1.TrafficPoint {
	return &meterv1.TrafficPoint{
		Start: timestamppb.New(p.Start), Requests: p.Requests,
		RequestsPerSecond: p.RequestsPerSecond, PeakRequestsPerSecond: p.PeakRequestsPerSecond,
		InputTokensPerSecond: p.InputTokensPerSecond, OutputTokensPerSecond: p.OutputTokensPerSecond,
		PeakOutputTokensPerSecond: p.PeakOutputTokensPerSecond, ErrorRate: p.ErrorRate, ErrorsByClass: p.ErrorsByClass,
		PromptTokensPerRequest: tokenStats(p.PromptTokensPerRequest), OutputTokensPerRequest: tokenStats(p.OutputTokensPerRequest),
	}
}

// tokenStats maps tokens per request to the protocol (nil stays nil).
func tokenStats(st *query.TokenStats) *meterv1.TokenStats {
	if st == nil {
		return nil
	}
	return &meterv1.TokenStats{Requests: st.Requests, Mean: st.Mean, P50: st.P50, P95: st.P95, P99: st.P99}
}
