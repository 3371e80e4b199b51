package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"tokenmeter/query"
	"tokenmeter/rollup"
)

// ErrNotFound marks a report of a deployment the range knows nothing of.
var ErrNotFound = errors.New("not found")

// Source is what a report reads; *query.Service implements it.
type Source interface {
	GPUUsage(ctx context.Context, q query.GPUUsageQuery) ([]query.GPUUsageRow, error)
	DeploymentHours(ctx context.Context, start, end time.Time) ([]query.RollupRow, error)
	EngineStats(ctx context.Context, q query.EngineQuery) ([]query.EngineRow, error)
}

var _ Source = (*query.Service)(nil)

// Limits and defaults of a query.
const (
	// MaxRange is the longest range a report covers.
	MaxRange = 400 * 24 * time.Hour
	// MinQualifyingHours is the fewest qualifying hours a sustainable
	// throughput estimate needs.
	MinQualifyingHours = 24
	// MaxHorizonWeeks bounds the forecast horizon.
	MaxHorizonWeeks = 104
	// DefaultMaxUnits and MaxMaxUnits are the default and the largest
	// limit on the units a report lists one by one; MaxUnitHours bounds
	// the hours the listed units, the fleet and the others hold together
	// ((MaxUnits + 2) × the range's hours), and so the size of the answer.
	DefaultMaxUnits = 20
	MaxMaxUnits     = 100
	MaxUnitHours    = 250_000
	// MaxMembers bounds the deployments, models and GPU types a unit lists.
	MaxMembers = 100
	// OthersName names the unit of the units beyond MaxUnits.
	OthersName = "(others)"

	defaultTarget          = 0.99
	defaultHorizonWeeks    = 13
	defaultMinHourRequests = 100
	defaultMissTolerance   = 0.05
	defaultLowUtilization  = 0.3
	defaultHeadroomRisk    = 0.2
)

// decimal is the form of a growth factor: digits with an optional fraction.
var decimal = regexp.MustCompile(`^[0-9]{1,6}(\.[0-9]{1,9})?$`)

// Normalize fills the defaults of q and checks it, joining every problem;
// errors wrap query.ErrInvalidQuery.
func (q Query) Normalize() (Query, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", query.ErrInvalidQuery, fmt.Sprintf(format, a...))
	}
	var errs []error
	q.Start, q.End = q.Start.UTC(), q.End.UTC()
	switch {
	case q.Start.IsZero() || q.End.IsZero():
		errs = append(errs, bad("start and end are required"))
	case !q.End.After(q.Start):
		errs = append(errs, bad("the range is empty: end (%s) must be after start (%s)", q.End.Format(time.RFC3339), q.Start.Format(time.RFC3339)))
	case !q.Start.Truncate(time.Hour).Equal(q.Start) || !q.End.Truncate(time.Hour).Equal(q.End):
		errs = append(errs, bad("start and end must lie on whole hours (GPU time is computed per hour)"))
	case q.End.Sub(q.Start) > MaxRange:
		errs = append(errs, bad("range of %s is longer than %d days", q.End.Sub(q.Start), int(MaxRange/(24*time.Hour))))
	case q.Start.Unix() < 0 || q.End.Unix() > 1<<32-1:
		errs = append(errs, bad("range must lie between 1970 and 2106"))
	}
	switch q.GroupBy {
	case "":
		q.GroupBy = ByDeployment
	case ByDeployment, ByModel, ByGPUType:
	default:
		errs = append(errs, bad("group_by %q: want deployment, model or gpu_type", q.GroupBy))
	}
	if q.Target == 0 {
		q.Target = defaultTarget
	}
	if !(q.Target > 0 && q.Target <= 1) {
		errs = append(errs, bad("target %v: want an attainment in (0, 1], e.g. 0.99", q.Target))
	}
	if q.Growth == "" {
		q.Growth = "1"
	}
	if g, ok := parseGrowth(q.Growth); !ok || g.Sign() <= 0 {
		errs = append(errs, bad("growth %q: want a decimal number greater than 0, e.g. 1.3", q.Growth))
	}
	if !(q.TargetTokensPerSecond >= 0 && q.TargetTokensPerSecond < 1e15) {
		errs = append(errs, bad("target tokens per second %v: want a number of at least 0", q.TargetTokensPerSecond))
	}
	if q.HorizonWeeks == 0 {
		q.HorizonWeeks = defaultHorizonWeeks
	}
	if q.HorizonWeeks < 0 || q.HorizonWeeks > MaxHorizonWeeks {
		errs = append(errs, bad("horizon of %d weeks: want 1 to %d", q.HorizonWeeks, MaxHorizonWeeks))
	}
	if q.MinHourRequests == 0 {
		q.MinHourRequests = defaultMinHourRequests
	}
	tolerance := defaultMissTolerance
	if q.MissTolerance != nil {
		tolerance = *q.MissTolerance
	}
	q.MissTolerance = &tolerance
	if !(tolerance >= 0 && tolerance < 0.5) {
		errs = append(errs, bad("miss tolerance %v: want a share in [0, 0.5)", tolerance))
	}
	if q.LowUtilization == 0 {
		q.LowUtilization = defaultLowUtilization
	}
	if !(q.LowUtilization > 0 && q.LowUtilization < 1) {
		errs = append(errs, bad("low utilization %v: want a share in (0, 1)", q.LowUtilization))
	}
	if q.MaxUnits == 0 {
		q.MaxUnits = DefaultMaxUnits
	}
	if q.MaxUnits < 1 || q.MaxUnits > MaxMaxUnits {
		errs = append(errs, bad("max_units %d: want 1 to %d", q.MaxUnits, MaxMaxUnits))
	} else if hours := int64(q.End.Sub(q.Start) / time.Hour); hours > 0 && hours <= int64(MaxRange/time.Hour) && int64(q.MaxUnits+2)*hours > MaxUnitHours {
		errs = append(errs, bad("max_units %d: %d units (with the fleet and others) × %d hours is more than %d unit-hours; ask for at most %d units or a shorter range",
			q.MaxUnits, q.MaxUnits+2, hours, MaxUnitHours, max(1, MaxUnitHours/hours-2)))
	}
	if q.HeadroomRisk == 0 {
		q.HeadroomRisk = defaultHeadroomRisk
	}
	if !(q.HeadroomRisk > 0 && q.HeadroomRisk < 1) {
		errs = append(errs, bad("headroom risk %v: want a share in (0, 1)", q.HeadroomRisk))
	}
	return q, errors.Join(errs...)
}

// depHour is one deployment's hour: GPU time and cost from the GPU
// rollups, requests and tokens from the usage rollups.
type depHour struct {
	gpuSec, busySec, unpricedSec float64
	maxGPUs                      uint32
	cost, busyCost, idleCost     int64
	requests, good, in, out      uint64
	telemetry                    rollup.GPUTelemetry
}

func (h *depHour) add(o *depHour) {
	h.gpuSec += o.gpuSec
	h.busySec += o.busySec
	h.unpricedSec += o.unpricedSec
	h.maxGPUs += o.maxGPUs // distinct deployments' GPUs add up
	h.cost += o.cost
	h.busyCost += o.busyCost
	h.idleCost += o.idleCost
	h.requests += o.requests
	h.good += o.good
	h.in += o.in
	h.out += o.out
	h.telemetry.Merge(o.telemetry)
}

func (h *depHour) tokens() uint64 { return h.in + h.out }

// deployment is what the range holds of one deployment.
type deployment struct {
	name   string
	hours  map[int]*depHour // hour index from the range start
	models map[string]uint64
	types  map[string]float64 // GPU seconds per GPU type
	// hourTypes are the GPU types with GPU time in each hour, in the
	// order read.
	hourTypes map[int][]string
	// gpuSec and tokens are the range's totals, which rank the units.
	gpuSec float64
	tokens uint64
}

func (d *deployment) hour(i int) *depHour {
	h := d.hours[i]
	if h == nil {
		h = &depHour{}
		d.hours[i] = h
	}
	return h
}

// Build reads the range's hourly GPU usage and usage rollups and computes
// the report. Invalid queries fail with errors wrapping
// query.ErrInvalidQuery; a deployment the range knows nothing of with
// ErrNotFound. Amounts are in the price book's currency, which the caller
// sets (Report.Currency).
func Build(ctx context.Context, src Source, q Query) (*Report, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	var (
		gpuRows    []query.GPUUsageRow
		useRows    []query.RollupRow
		engineRows []query.EngineRow
	)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		gpuRows, err = src.GPUUsage(gctx, query.GPUUsageQuery{Start: q.Start, End: q.End, Step: "hour", GroupBy: []string{"deployment", "gpu_type"},
			NoTokens: true}) // tokens come from the counters
		return err
	})
	g.Go(func() (err error) {
		useRows, err = src.DeploymentHours(gctx, q.Start, q.End)
		return err
	})
	g.Go(func() (err error) {
		engineRows, err = src.EngineStats(gctx, query.EngineQuery{Start: q.Start, End: q.End, Step: "hour", GroupBy: []string{"deployment"}})
		return err
	})
	if err := g.Wait(); err != nil {
		if errors.Is(err, query.ErrTooManySeries) {
			return nil, fmt.Errorf("the capacity report reads every deployment's hours of the range: report a shorter range: %w", err)
		}
		return nil, err
	}
	deps := map[string]*deployment{}
	dep := func(name string) *deployment {
		d := deps[name]
		if d == nil {
			d = &deployment{name: name, hours: map[int]*depHour{}, models: map[string]uint64{}, types: map[string]float64{}, hourTypes: map[int][]string{}}
			deps[name] = d
		}
		return d
	}
	index := func(t time.Time) int { return int(t.Sub(q.Start) / time.Hour) }
	for i := range gpuRows {
		r := &gpuRows[i]
		d := dep(r.Group["deployment"])
		h := d.hour(index(r.Start))
		h.gpuSec += r.GPUSeconds
		h.busySec += r.BusySeconds
		h.unpricedSec += r.UnpricedSeconds
		h.maxGPUs += r.MaxGPUs
		h.cost += r.CostNanos
		h.busyCost += r.BusyCostNanos
		h.idleCost += r.IdleCostNanos
		h.telemetry.Merge(r.Telemetry)
		d.types[r.Group["gpu_type"]] += r.GPUSeconds
		if t := r.Group["gpu_type"]; r.GPUSeconds > 0 && !slices.Contains(d.hourTypes[index(r.Start)], t) {
			d.hourTypes[index(r.Start)] = append(d.hourTypes[index(r.Start)], t)
		}
		d.gpuSec += r.GPUSeconds
	}
	for i := range useRows {
		r := &useRows[i]
		d := dep(r.Group["deployment"])
		h := d.hour(index(r.Start))
		h.requests += r.Requests
		h.good += r.GoodRequests
		h.in += r.PromptTokens
		h.out += r.OutputTokens
		d.models[r.Group["model"]] += r.PromptTokens + r.OutputTokens
		d.tokens += r.PromptTokens + r.OutputTokens
	}
	if q.Deployment != "" {
		d, ok := deps[q.Deployment]
		if !ok {
			return nil, fmt.Errorf("%w: deployment %q has neither GPU samples nor traffic between %s and %s",
				ErrNotFound, q.Deployment, q.Start.Format(time.RFC3339), q.End.Format(time.RFC3339))
		}
		deps = map[string]*deployment{q.Deployment: d}
	}
	rep := &Report{Query: q}
	all := make([]*deployment, 0, len(deps))
	for _, d := range deps {
		all = append(all, d)
	}
	slices.SortFunc(all, func(a, b *deployment) int { return cmp.Compare(a.name, b.name) })
	rep.Fleet = computeUnit(q, "fleet", all, false)
	saturation(&rep.Fleet, all, engineRows)
	if len(all) == 0 {
		rep.NotEnoughData = fmt.Sprintf("no GPU samples and no traffic between %s and %s",
			q.Start.Format(time.RFC3339), q.End.Format(time.RFC3339))
		return rep, nil
	}
	groups := map[string][]*deployment{}
	for _, d := range all {
		key := d.name
		switch q.GroupBy {
		case ByModel:
			key = largest(d.models, "(no traffic)")
		case ByGPUType:
			key = largest(d.types, "(no GPU samples)")
		}
		groups[key] = append(groups[key], d)
	}
	names, folded := largestUnits(groups, q.MaxUnits)
	for _, name := range names {
		u := computeUnit(q, name, groups[name], true)
		saturation(&u, groups[name], engineRows)
		rep.Units = append(rep.Units, u)
	}
	if len(folded) > 0 {
		var rest []*deployment
		for _, name := range folded {
			rest = append(rest, groups[name]...)
		}
		slices.SortFunc(rest, func(a, b *deployment) int { return cmp.Compare(a.name, b.name) })
		o := computeUnit(q, OthersName, rest, false)
		o.Sustainable.Reason = fmt.Sprintf("not estimated for %s: it sums %d %ss of different loads; raise max_units (at most %d) or report one deployment to see each",
			OthersName, len(folded), unitWord(q.GroupBy), MaxMaxUnits)
		saturation(&o, rest, engineRows)
		rep.Others, rep.UnitsInOthers = &o, len(folded)
	}
	rep.Findings = findings(q, rep.Units)
	var planned []*deployment
	for _, u := range rep.Units {
		for _, name := range u.Deployments {
			planned = append(planned, deps[name])
		}
	}
	// At most MaxUnits plans: the largest deployments by GPU time, then
	// tokens, then name (a model or GPU type unit holds many).
	slices.SortFunc(planned, func(a, b *deployment) int {
		return cmp.Or(cmp.Compare(b.gpuSec, a.gpuSec), cmp.Compare(b.tokens, a.tokens), cmp.Compare(a.name, b.name))
	})
	if len(planned) > q.MaxUnits {
		rep.PlansOmitted = len(planned) - q.MaxUnits
		planned = planned[:q.MaxUnits]
	}
	slices.SortFunc(planned, func(a, b *deployment) int { return cmp.Compare(a.name, b.name) })
	rep.Plans = plans(q, planned)
	rep.FleetPlan = fleetPlan(rep.Plans)
	return rep, nil
}

// unitWord names a unit of g in words.
func unitWord(g Group) string {
	switch g {
	case ByModel:
		return "model"
	case ByGPUType:
		return "GPU type"
	}
	return "deployment"
}

// largestUnits splits the units of groups into the limit largest, by GPU
// time, then tokens, then name, returned in name order, and the rest
// (folded into others), in name order too. A unit's GPU time and tokens
// add up its deployments' (in name order, so that the ranking is the same
// for the same rows).
func largestUnits(groups map[string][]*deployment, limit int) (keep, rest []string) {
	type ranked struct {
		name   string
		gpuSec float64
		tokens uint64
	}
	all := make([]ranked, 0, len(groups))
	for name, deps := range groups {
		r := ranked{name: name}
		for _, d := range deps {
			r.gpuSec += d.gpuSec
			r.tokens += d.tokens
		}
		all = append(all, r)
	}
	slices.SortFunc(all, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(b.gpuSec, a.gpuSec), cmp.Compare(b.tokens, a.tokens), cmp.Compare(a.name, b.name))
	})
	for i, r := range all {
		if i < limit {
			keep = append(keep, r.name)
		} else {
			rest = append(rest, r.name)
		}
	}
	slices.Sort(keep)
	slices.Sort(rest)
	return keep, rest
}

// saturation sets the engine stats of the unit's peak hour: the engine
// rows of its deployments in that hour, merged; none without engine
// samples then.
func saturation(u *Unit, deps []*deployment, rows []query.EngineRow) {
	if u.Peak == nil {
		return
	}
	in := map[string]bool{}
	for _, d := range deps {
		in[d.name] = true
	}
	var at []query.EngineRow
	for _, r := range rows {
		if r.Start.Equal(u.Peak.Start) && in[r.Group["deployment"]] {
			at = append(at, r)
		}
	}
	if len(at) == 0 {
		return
	}
	p := query.EnginePointOf(at, u.Peak.Start)
	u.Peak.Saturation = &p
}

// largest is the key of m's largest positive value (the first in key
// order on a tie), or none when m has none.
func largest[V uint64 | float64](m map[string]V, none string) string {
	best, bestV := none, V(0)
	for k, v := range m {
		if v > bestV || (v == bestV && v > 0 && k < best) {
			best, bestV = k, v
		}
	}
	return best
}
