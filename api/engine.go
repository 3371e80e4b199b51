package api

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
)

// EngineReader reads engine stats; *query.Service implements it.
type EngineReader interface {
	EngineStats(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error)
}

var _ EngineReader = (*query.Service)(nil)

// engineService serves EngineService.
type engineService struct {
	meterv1.UnimplementedEngineServiceServer
	store EngineReader
}

func (s *engineService) GetEngineStats(ctx context.Context, req *meterv1.GetEngineStatsRequest) (*meterv1.GetEngineStatsResponse, error) {
	q := query.EngineQuery{Step: req.GetStep(), GroupBy: req.GetGroupBy(), Deployments: req.GetDeployment()}
	q.Start, q.End = timeOf(req.GetStart()), timeOf(req.GetEnd())
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	pg, err := query.NewPage(q.GroupBy, int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	rows, err := s.store.EngineStats(ctx, q)
	if err != nil {
		return nil, err
	}
	series, next := query.EngineSeriesOf(q, pg, rows)
	resp := &meterv1.GetEngineStatsResponse{NextPageToken: next}
	for _, sr := range series {
		out := &meterv1.EngineStatsSeries{Group: sr.Group, Summary: enginePoint(sr.Summary)}
		for _, p := range sr.Points {
			out.Points = append(out.Points, enginePoint(p))
		}
		resp.Series = append(resp.Series, out)
	}
	return resp, nil
}

func enginePoint(p query.EnginePoint) *meterv1.EngineStatsPoint {
	out := &meterv1.EngineStatsPoint{
		Start: timestamppb.New(p.Start), Samples: p.Samples, Replicas: p.Replicas, SampledSeconds: p.SampledSeconds,
		WaitingMean: p.WaitingMean, WaitingMax: float64(p.WaitingMax), WaitingP95: float64(p.WaitingP95),
		RunningMean: p.RunningMean, RunningMax: float64(p.RunningMax),
		KvCacheUsageMean: p.KVMean, KvCacheUsageMax: p.KVMax, KvCacheSamples: p.KVSamples,
		PrefixCacheQueries: p.PrefixQueries, PrefixCacheHits: p.PrefixHits, Preemptions: p.Preemptions,
		Restarts: p.Restarts,
	}
	if p.KVMinOK {
		out.KvCacheUsageMin = p.KVMin
	}
	if p.HitRateOK {
		out.PrefixCacheHitRate = &p.PrefixHitRate
	}
	if p.BatchTokensOK {
		out.BatchTokensMean = &p.BatchTokens
	}
	return out
}
