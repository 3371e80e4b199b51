package api

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query"
	"tokenmeter/query/capacity"
)

// ReportReader is what the capacity report reads; *query.Service
// implements it.
type ReportReader = capacity.Source

// reportService implements meterv1.ReportServiceServer.
type reportService struct {
	meterv1.UnimplementedReportServiceServer
	store  ReportReader
	prices PriceBookStore
}

// newReportService serves svc.Reports with the price books of svc.Prices,
// or of svc.Reports when it keeps them too.
func newReportService(svc *Services) *reportService {
	return &reportService{store: svc.Reports, prices: svc.priceBooks(svc.Reports)}
}

func (s *reportService) GetCapacityReport(ctx context.Context, req *meterv1.GetCapacityReportRequest) (*meterv1.GetCapacityReportResponse, error) {
	switch req.GetFormat() {
	case "", "json":
	default:
		return nil, fmt.Errorf("%w: format %q is served over REST (GET /v1/reports/capacity?format=csv or html); gRPC answers the report itself, which meterctl report capacity --format renders",
			query.ErrInvalidQuery, req.GetFormat())
	}
	book, err := bookInForce(ctx, s.prices)
	if err != nil {
		return nil, err
	}
	q := capacity.Query{
		Start: timeOf(req.GetStart()), End: timeOf(req.GetEnd()),
		GroupBy: capacity.Group(req.GetGroupBy()), Deployment: req.GetDeployment(),
		Target: req.GetTarget(), Growth: req.GetGrowth(), TargetTokensPerSecond: req.GetTargetTokensPerSecond(),
		HorizonWeeks: int(req.GetHorizonWeeks()), MinHourRequests: req.GetMinHourRequests(),
		MissTolerance: req.MissTolerance, LowUtilization: req.GetLowUtilization(), HeadroomRisk: req.GetHeadroomRisk(),
		Currency: book.Currency, MaxUnits: int(req.GetMaxUnits()), Prices: book,
	}
	r, err := capacity.Build(ctx, s.store, q)
	if err != nil {
		return nil, err
	}
	return &meterv1.GetCapacityReportResponse{Report: capacityReport(r)}, nil
}

// timeOf is a request's timestamp, the zero time when absent.
func timeOf(ts *timestamppb.Timestamp) (t time.Time) {
	if ts == nil {
		return t
	}
	return ts.AsTime()
}

func capacityReport(r *capacity.Report) *meterv1.CapacityReport {
	out := &meterv1.CapacityReport{
		Start: timestamppb.New(r.Start), End: timestamppb.New(r.End), GroupBy: string(r.GroupBy),
		Target: r.Target, Growth: r.Growth, TargetTokensPerSecond: r.TargetTokensPerSecond, HorizonWeeks: int32(r.HorizonWeeks),
		MinHourRequests: r.MinHourRequests, MissTolerance: *r.MissTolerance, LowUtilization: r.LowUtilization,
		HeadroomRisk: r.HeadroomRisk, Currency: r.Currency, Fleet: capacityUnit(r.Currency, &r.Fleet),
		NotEnoughData: r.NotEnoughData, UnitsInOthers: int32(r.UnitsInOthers), MaxUnits: int32(r.MaxUnits),
	}
	if r.Others != nil {
		out.Others = capacityUnit(r.Currency, r.Others)
	}
	for i := range r.Units {
		out.Units = append(out.Units, capacityUnit(r.Currency, &r.Units[i]))
	}
	for _, f := range r.Findings {
		out.Findings = append(out.Findings, &meterv1.CapacityFinding{Unit: f.Unit, Kind: f.Kind, Severity: int32(f.Severity), Text: f.Text})
	}
	for i := range r.Plans {
		out.Plans = append(out.Plans, capacityPlan(r.Currency, &r.Plans[i]))
	}
	out.PlansOmitted = int32(r.PlansOmitted)
	fp := r.FleetPlan
	out.FleetPlan = &meterv1.CapacityFleetPlan{Parts: mixParts(r.Currency, fp.Parts), Gpus: fp.GPUs, TokensPerSecond: fp.TokensPerSecond,
		CostPerHour: money(r.Currency, fp.CostPerHourNanos), Deployments: int32(fp.Deployments), Missing: fp.Missing, AtMost: fp.AtMost}
	return out
}

func capacityPlan(cur string, p *capacity.Plan) *meterv1.CapacityPlan {
	out := &meterv1.CapacityPlan{Deployment: p.Deployment, LoadFor: p.LoadFor, LoadTokensPerSecond: p.LoadTokensPerSecond,
		LoadKnown: p.LoadKnown, LoadReason: p.LoadReason, Mix: mixParts(cur, p.Mix), MixKnown: p.MixKnown, MixReason: p.MixReason,
		MixGpus: p.MixGPUs, MixTokensPerSecond: p.MixTokensPerSecond, MixAtMost: p.MixAtMost, MixArithmetic: p.MixArithmetic}
	if p.MixKnown {
		out.MixCostPerHour = money(cur, p.MixCostPerHourNanos)
	}
	for _, o := range p.Options {
		g := &meterv1.CapacityGpuOption{GpuType: o.GPUType, Measured: o.Measured, Sustainable: sustainableLoad(o.Sustainable),
			MixedHours: int32(o.MixedHours), Priced: o.Priced, PriceId: o.PriceID, CostKnown: o.CostKnown,
			CostArithmetic: o.CostArithmetic, NotEnoughData: o.NotEnoughData, Gpus: o.GPUs, Arithmetic: o.Arithmetic}
		if o.Priced {
			g.PricePerHour = money(cur, o.PricePerHourNanos)
		}
		if o.CostKnown {
			g.CostPer_1MTokens = money(cur, o.CostPer1MNanos)
		}
		if o.Arithmetic != "" {
			g.CostPerHour = money(cur, o.CostPerHourNanos)
		}
		out.Options = append(out.Options, g)
	}
	return out
}

func mixParts(cur string, parts []capacity.MixPart) []*meterv1.CapacityMixPart {
	var out []*meterv1.CapacityMixPart
	for _, m := range parts {
		out = append(out, &meterv1.CapacityMixPart{GpuType: m.GPUType, Gpus: m.GPUs, TokensPerSecond: m.TokensPerSecond, CostPerHour: money(cur, m.CostPerHourNanos)})
	}
	return out
}

func sustainableLoad(s capacity.Sustainable) *meterv1.SustainableLoad {
	out := &meterv1.SustainableLoad{Known: s.Known, Reason: s.Reason, TokensPerSecondPerGpu: s.TokensPerSecondPerGPU,
		SupportingHours: int32(s.SupportingHours), MissedHours: int32(s.MissedHours), QualifyingHours: int32(s.QualifyingHours),
		LowerBound: s.LowerBound, Saturated: s.Saturated}
	if s.Known {
		out.Hour = timestamppb.New(s.Hour)
	}
	return out
}

// share is part / whole, 0 when whole is 0.
func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

func capacityUnit(cur string, u *capacity.Unit) *meterv1.CapacityUnit {
	out := &meterv1.CapacityUnit{
		Name: u.Name, Deployments: u.Deployments, Models: u.Models, GpuTypes: u.GPUTypes,
		DeploymentCount: int32(u.DeploymentCount), ModelCount: int32(u.ModelCount), GpuTypeCount: int32(u.GPUTypeCount),
		Hours: int32(u.Hours), HoursWithGpus: int32(u.HoursWithGPUs), MeanGpus: u.MeanGPUs, MaxGpus: u.MaxGPUs, MaxGpuEquivalents: u.MaxGPUEquivalents,
		GpuHours: u.GPUHours, BusyGpuHours: u.BusyGPUHours, IdleGpuHours: u.IdleGPUHours,
		Utilization: u.Utilization, P95Utilization: u.P95Utilization, IdleShare: u.IdleShare,
		Cost: money(cur, u.CostNanos), BusyCost: money(cur, u.BusyCostNanos), IdleCost: money(cur, u.IdleCostNanos),
		UnpricedGpuHours: u.UnpricedGPUHours,
		Requests:         u.Requests, GoodRequests: u.GoodRequests, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		Attainment: u.Attainment, TokensPerSecondPerGpu: u.TokensPerSecondPerGPU,
		Headroom: u.Headroom, HeadroomKnown: u.HeadroomKnown,
		GpuTelemetry: gpuTelemetry(u.GPUTelemetry),
	}
	if p := u.Peak; p != nil {
		out.Peak = &meterv1.CapacityPeakHour{Start: timestamppb.New(p.Start), TokensPerSecond: p.TokensPerSecond, Gpus: p.GPUs,
			TokensPerSecondPerGpu: p.TokensPerSecondPerGPU, Requests: p.Requests, Attainment: p.Attainment}
		if p.Saturation != nil {
			out.Peak.Saturation = enginePoint(*p.Saturation)
		}
	}
	out.Sustainable = sustainableLoad(u.Sustainable)
	h := u.Hot
	out.HotBand = &meterv1.CapacityHotBand{Hours: int32(h.Hours), Requests: h.Requests, GoodRequests: h.GoodRequests, Attainment: share(h.GoodRequests, h.Requests),
		OtherHours: int32(h.OtherHours), OtherRequests: h.OtherRequests, OtherGoodRequests: h.OtherGoodRequests, OtherAttainment: share(h.OtherGoodRequests, h.OtherRequests)}
	for _, n := range u.Needed {
		out.GpusNeeded = append(out.GpusNeeded, &meterv1.GpusNeeded{For: n.For, TokensPerSecond: n.TokensPerSecond, Gpus: n.GPUs, Arithmetic: n.Arithmetic, Change: n.Change})
	}
	for wd := range u.Profile {
		day := &meterv1.LoadProfileDay{Weekday: int32(wd), TokensPerSecond: u.Profile[wd][:], Hours: make([]int32, 24)}
		for h, n := range u.ProfileHours[wd] {
			day.Hours[h] = int32(n)
		}
		out.LoadProfile = append(out.LoadProfile, day)
	}
	t := u.Trend
	out.Trend = &meterv1.CapacityTrend{GrowthKnown: t.GrowthKnown, Reason: t.Reason, TokensGrowth: t.TokensGrowth, PeakGrowth: t.PeakGrowth}
	for _, w := range t.Weeks {
		cw := &meterv1.CapacityWeek{Start: timestamppb.New(w.Start), Tokens: w.Tokens, PeakTokensPerSecond: w.PeakTokensPerSecond}
		if w.Tokens > 0 { // a week without traffic has no peak hour
			cw.PeakHour = timestamppb.New(w.PeakTokensPerSecondHour)
		}
		out.Trend.Weeks = append(out.Trend.Weeks, cw)
	}
	if f := t.Forecast; f != nil {
		out.Trend.Forecast = &meterv1.PeakForecast{At: timestamppb.New(f.At), TokensPerSecond: f.TokensPerSecond, Slope: f.Slope,
			Intercept: f.Intercept, R2: f.R2, Weeks: int32(f.Weeks)}
	}
	for _, h := range u.HourPoints {
		out.HoursDetail = append(out.HoursDetail, &meterv1.CapacityHour{Start: timestamppb.New(h.Start), Gpus: h.GPUs,
			Utilization: h.Utilization, TokensPerSecond: h.TokensPerSecond, TokensPerSecondPerGpu: h.TokensPerSecondPerGPU,
			Requests: h.Requests, GoodRequests: h.GoodRequests, Attainment: h.Attainment, Qualifies: h.Qualifies,
			GpuTelemetry: gpuTelemetry(h.GPUTelemetry)})
	}
	for _, d := range u.Days {
		out.Days = append(out.Days, &meterv1.CapacityDay{Start: timestamppb.New(d.Start), BusyCost: money(cur, d.BusyCostNanos),
			IdleCost: money(cur, d.IdleCostNanos), BusyGpuHours: d.BusyGPUHours, GpuHours: d.GPUHours, Tokens: d.Tokens})
	}
	return out
}
