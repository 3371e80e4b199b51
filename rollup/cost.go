package rollup

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"tokenmeter/billing"
	"tokenmeter/internal/ident"
)

// CostStore is what the cost step needs of ClickHouse; *chstore.Store implements it.
type CostStore interface {
	// GPUSamplesOfHours returns the deduplicated samples of the whole hours
	// in [from, to), each hour's in a stable order.
	GPUSamplesOfHours(ctx context.Context, from, to time.Time) ([]GPUSampleRow, error)
	// DeploymentUsageOfHours returns the usage of the whole hours in [from,
	// to) per hour, deployment, tenant and model, from each hour's newest
	// rollup, in that order.
	DeploymentUsageOfHours(ctx context.Context, from, to time.Time) ([]DeploymentUsageRow, error)
	// ServingOfHours returns the distinct serving labels (engine, tensor
	// parallelism) the events of the whole hours in [from, to) carried per
	// hour, deployment and model.
	ServingOfHours(ctx context.Context, from, to time.Time) ([]ServingRow, error)
	WriteCost(ctx context.Context, gpu []GPUHourRow, cost []CostRow, version uint64) error
	// WriteServing stores the serving labels of hours with version; they
	// replace the rows of earlier computations with the same keys.
	WriteServing(ctx context.Context, rows []ServingHourRow, version uint64) error
	GPUDirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	StalePriceHours(ctx context.Context, version string, from time.Time) ([]time.Time, error)
	// GPUTimeMissingHours lists the hours costed before cost lines carried
	// their GPU time (migration 0026).
	GPUTimeMissingHours(ctx context.Context) ([]time.Time, error)
	// TelemetryMissingHours lists the hours costed before GPU telemetry
	// (migration 0024), to recost once.
	TelemetryMissingHours(ctx context.Context) ([]time.Time, error)
	CurrentPriceBook(ctx context.Context) (version, book string, createdAt time.Time, ok bool, err error)
}

// currentPrices reads the price book in force; without one, an empty book
// (every GPU-second is then reported unpriced, never priced at zero).
func currentPrices(ctx context.Context, store CostStore) (*billing.PriceBook, error) {
	return billing.BookInForce(ctx, store)
}

// costPolicies are every (busy, idle) pair, in CostRow order.
func costPolicies(book *billing.PriceBook) [3][3]billing.Policy {
	var out [3][3]billing.Policy
	for b, bp := range billing.BusyPolicies() {
		for i, ip := range billing.IdlePolicies() {
			out[b][i] = billing.Policy{Busy: bp, Idle: ip, Weights: book.Allocation.Weights}
		}
	}
	return out
}

// gpuGroupKey is one row of gpu_hour within a deployment.
type gpuGroupKey struct{ gpuType, pool, region, profile string }

// ComputeCost computes an hour's gpu_hour and cost_hour rows from its
// deduplicated GPU samples and its per-deployment usage. It is a pure
// function: the same inputs give the same rows, in the same order.
//
// Each deployment-hour's GPU cost is split among its (tenant, model) pairs
// under every busy and idle policy, exactly (largest remainder), so that
// the lines of every policy pair add up to the GPU cost. Usage in a
// deployment without GPU samples is marked unattributed; GPU time of
// samples without a deployment goes entirely to the idle line.
func ComputeCost(hour time.Time, book *billing.PriceBook, samples []GPUSampleRow, usage []DeploymentUsageRow) ([]GPUHourRow, []CostRow, error) {
	hour = hour.UTC().Truncate(time.Hour)
	version := book.Version()
	byDep := map[string][]GPUSampleRow{}
	for _, s := range samples {
		byDep[s.Deployment] = append(byDep[s.Deployment], s)
	}
	usageByDep := map[string][]DeploymentUsageRow{}
	for _, u := range usage {
		usageByDep[u.Deployment] = append(usageByDep[u.Deployment], u)
	}
	deps := make([]string, 0, len(byDep)+len(usageByDep))
	for d := range byDep {
		deps = append(deps, d)
	}
	for d := range usageByDep {
		if _, ok := byDep[d]; !ok {
			deps = append(deps, d)
		}
	}
	slices.Sort(deps)
	policies := costPolicies(book)

	var gpuRows []GPUHourRow
	var costRows []CostRow
	for _, dep := range deps {
		ss, us := byDep[dep], usageByDep[dep]
		if dep == "" {
			us = nil // usage without a deployment cannot be matched to GPUs
			for _, u := range usageByDep[dep] {
				costRows = append(costRows, unattributedRow(hour, book, u))
			}
		}
		if len(ss) == 0 {
			for _, u := range us {
				costRows = append(costRows, unattributedRow(hour, book, u))
			}
			continue
		}
		rows, depCost, gpuTypes, err := gpuHourRows(hour, dep, book, ss)
		if err != nil {
			return nil, nil, fmt.Errorf("deployment %q: %w", dep, err)
		}
		gpuRows = append(gpuRows, rows...)
		depTime := gpuMillis(depCost)

		tenants := make([]billing.TenantUsage, len(us))
		byKey := map[string]DeploymentUsageRow{}
		for i, u := range us {
			// billing's tenant name of the pair: no two pairs share one,
			// whatever bytes the ids hold (billing refuses repeated names).
			key := ident.Key(u.TenantID, u.Model)
			byKey[key] = u
			tenants[i] = billing.TenantUsage{
				Tenant: key, InputTokens: int64(u.InputTokens), CachedInputTokens: int64(u.CachedInputTokens),
				OutputTokens: int64(u.OutputTokens), Requests: int64(u.Requests), E2EMillis: int64(u.E2EMs + 0.5),
			}
		}
		lines := map[string]*CostRow{}
		var order []string
		for b := range policies {
			for i := range policies[b] {
				alloc, err := billing.AllocateHour(depCost, tenants, policies[b][i])
				if err != nil {
					return nil, nil, fmt.Errorf("deployment %q: allocate: %w", dep, err)
				}
				gpuTime, err := billing.AllocateHour(depTime, tenants, policies[b][i])
				if err != nil {
					return nil, nil, fmt.Errorf("deployment %q: allocate GPU time: %w", dep, err)
				}
				if len(gpuTime.Lines) != len(alloc.Lines) {
					return nil, nil, fmt.Errorf("deployment %q: %d GPU time lines, %d cost lines", dep, len(gpuTime.Lines), len(alloc.Lines))
				}
				for k, l := range alloc.Lines {
					r, ok := lines[l.Tenant]
					if !ok {
						r = &CostRow{Hour: hour, Deployment: dep, GPUType: gpuTypes, PriceVersion: version}
						if l.Tenant == billing.IdleTenant {
							r.TenantID = billing.IdleTenant
						} else {
							u := byKey[l.Tenant]
							r.TenantID, r.Model = u.TenantID, u.Model
							r.Requests, r.InputTokens, r.CachedInputTokens = u.Requests, u.InputTokens, u.CachedInputTokens
							r.OutputTokens, r.GoodOutputTokens, r.E2EMs = u.OutputTokens, u.GoodOutputTokens, uint64(u.E2EMs+0.5)
							r.SLOVersion, r.ModelVersion = u.SLOVersion, ServingLabel(u.ModelVersions)
							r.ListCharge, r.ListPriced = listCharge(book, hour, u)
						}
						lines[l.Tenant] = r
						order = append(order, l.Tenant)
					}
					ml := gpuTime.Lines[k]
					if ml.Tenant != l.Tenant {
						return nil, nil, fmt.Errorf("deployment %q: GPU time line %q beside cost line %q", dep, ml.Tenant, l.Tenant)
					}
					r.Cost[b][i], r.GPUMs[b][i] = int64(l.Total), uint64(ml.Total)
					if i == 0 {
						r.Busy[b], r.GPUBusyMs[b] = int64(l.Busy), uint64(ml.Busy)
					}
				}
			}
		}
		slices.Sort(order)
		for _, k := range order {
			costRows = append(costRows, *lines[k])
		}
	}
	return gpuRows, costRows, nil
}

// listCharge prices a usage row at its model's token list prices in force
// at the start of the hour.
func listCharge(book *billing.PriceBook, hour time.Time, u DeploymentUsageRow) (int64, bool) {
	m, _, ok := book.ListCharge(u.Model, hour, int64(u.InputTokens), int64(u.CachedInputTokens), int64(u.OutputTokens))
	return int64(m), ok
}

func unattributedRow(hour time.Time, book *billing.PriceBook, u DeploymentUsageRow) CostRow {
	charge, priced := listCharge(book, hour, u)
	return CostRow{
		ListCharge: charge, ListPriced: priced,
		Hour: hour, TenantID: u.TenantID, Deployment: u.Deployment, Model: u.Model, Unattributed: true,
		Requests: u.Requests, InputTokens: u.InputTokens, CachedInputTokens: u.CachedInputTokens,
		OutputTokens: u.OutputTokens, GoodOutputTokens: u.GoodOutputTokens, E2EMs: uint64(u.E2EMs + 0.5),
		PriceVersion: book.Version(), SLOVersion: u.SLOVersion, ModelVersion: ServingLabel(u.ModelVersions),
	}
}

// gpuMillis is a deployment-hour's GPU time as AllocateHour splits money:
// its GPU-seconds (priced or not) rounded once to whole GPU-milliseconds,
// the busy part likewise (at most the whole), the idle part the rest. Split
// by the same policies as the cost, the lines' GPU time agrees with their
// cost and adds up to the deployment-hour's exactly.
func gpuMillis(c billing.GPUCost) billing.GPUCost {
	total := math.Round(c.GPUSeconds * 1000)
	busy := min(math.Round(c.BusySeconds*1000), total)
	return billing.GPUCost{
		GPUSeconds: c.GPUSeconds, BusySeconds: c.BusySeconds, IdleSeconds: c.IdleSeconds,
		Cost: billing.Money(total), BusyCost: billing.Money(busy), IdleCost: billing.Money(total - busy),
	}
}

// gpuHourRows aggregates one deployment's samples per GPU group and prices
// each group; the deployment's cost is the sum of its groups' (each rounded
// once), so that allocations reconcile with gpu_hour exactly.
func gpuHourRows(hour time.Time, dep string, book *billing.PriceBook, samples []GPUSampleRow) ([]GPUHourRow, billing.GPUCost, string, error) {
	type agg struct {
		instances map[string]float64 // instance → Σ interval_s
		samples   uint64
		energy    float64
		telemetry GPUTelemetry
		devices   map[string]*deviceAgg
	}
	groups := map[gpuGroupKey]*agg{}
	normal := NormalClocks(samples)
	for i, s := range samples {
		k := gpuGroupKey{s.GPUType, s.Pool, s.Region, s.MIGProfile}
		g := groups[k]
		if g == nil {
			g = &agg{instances: map[string]float64{}, devices: map[string]*deviceAgg{}}
			groups[k] = g
		}
		u := billing.GPUUsage{
			GPUType: s.GPUType, Pool: s.Pool, Region: s.Region, MIGFraction: s.MIGFraction, At: s.SampledAt,
			GPUSeconds: s.IntervalS, BusySeconds: s.IntervalS * min(max(s.Utilization, 0), 1),
		}
		g.instances[s.Instance] += s.IntervalS
		g.samples++
		g.energy += s.EnergyJoules
		g.telemetry.AddSample(s, normal[i])
		g.devices[s.Instance] = g.devices[s.Instance].add(s, u, normal[i])
	}
	keys := make([]gpuGroupKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b gpuGroupKey) int {
		return cmp.Or(strings.Compare(a.gpuType, b.gpuType), strings.Compare(a.pool, b.pool),
			strings.Compare(a.region, b.region), strings.Compare(a.profile, b.profile))
	})
	total := billing.GPUCost{Currency: book.Currency, PriceVersion: book.Version()}
	var rows []GPUHourRow
	var types []string
	for _, k := range keys {
		g := groups[k]
		c, devices, err := deviceRows(hour, dep, k, book, g.devices)
		if err != nil {
			return nil, billing.GPUCost{}, "", err
		}
		var covered float64
		for _, secs := range g.instances {
			covered += min(secs, 3600)
		}
		rows = append(rows, GPUHourRow{
			Hour: hour, Deployment: dep, GPUType: k.gpuType, Pool: k.pool, Region: k.region, MIGProfile: k.profile,
			GPUs: uint32(len(g.instances)), Samples: g.samples,
			GPUSeconds: c.GPUSeconds, BusySeconds: c.BusySeconds, CoveredSeconds: covered,
			EnergyJoules: g.energy, UnpricedSeconds: c.UnpricedSeconds,
			CostNanos: int64(c.Cost), BusyCostNanos: int64(c.BusyCost), IdleCostNanos: int64(c.IdleCost),
			PriceVersion: c.PriceVersion, Telemetry: g.telemetry, Devices: devices,
		})
		total.GPUSeconds += c.GPUSeconds
		total.BusySeconds += c.BusySeconds
		total.IdleSeconds += c.IdleSeconds
		total.UnpricedSeconds += c.UnpricedSeconds
		total.Cost += c.Cost
		total.BusyCost += c.BusyCost
		total.IdleCost += c.IdleCost
		if !slices.Contains(types, k.gpuType) {
			types = append(types, k.gpuType)
		}
	}
	slices.Sort(types)
	return rows, total, strings.Join(types, "+"), nil
}

// deviceAgg is one GPU's (or MIG instance's) samples in a gpu_hour group.
type deviceAgg struct {
	node      string
	gpu       string
	usage     []billing.GPUUsage
	seconds   float64
	samples   uint64
	energy    float64
	telemetry GPUTelemetry
}

func (d *deviceAgg) add(s GPUSampleRow, u billing.GPUUsage, normalClock float64) *deviceAgg {
	if d == nil {
		d = &deviceAgg{node: s.Node, gpu: s.Instance}
	}
	d.usage = append(d.usage, u)
	d.seconds += s.IntervalS
	d.samples++
	d.energy += s.EnergyJoules
	d.telemetry.AddSample(s, normalClock)
	return d
}

// deviceRows prices one gpu_hour group and returns its gpu_device_hour
// rows: a row per GPU (or MIG instance), in GPU order. The group's cost is
// rounded once over all its samples, and its busy and idle parts are split
// over the GPUs by largest remainder on their exact costs
// (billing.GPUCostParts), so that the GPUs' costs add up to the group's
// exactly: a per-GPU drill-down and the group agree to the nano-unit.
func deviceRows(hour time.Time, dep string, k gpuGroupKey, book *billing.PriceBook, devices map[string]*deviceAgg) (billing.GPUCost, []GPUHourRow, error) {
	ids := make([]string, 0, len(devices))
	for id := range devices {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	usage := make([][]billing.GPUUsage, len(ids))
	for i, id := range ids {
		usage[i] = devices[id].usage
	}
	whole, parts, err := book.GPUCostParts(usage)
	if err != nil {
		return billing.GPUCost{}, nil, err
	}
	rows := make([]GPUHourRow, 0, len(ids))
	for i, id := range ids {
		d, c := devices[id], parts[i]
		rows = append(rows, GPUHourRow{
			Hour: hour, Deployment: dep, GPUType: k.gpuType, Pool: k.pool, Region: k.region, MIGProfile: k.profile,
			Node: d.node, GPU: d.gpu, GPUs: 1, Samples: d.samples,
			GPUSeconds: c.GPUSeconds, BusySeconds: c.BusySeconds, CoveredSeconds: min(d.seconds, 3600),
			EnergyJoules: d.energy, UnpricedSeconds: c.UnpricedSeconds,
			CostNanos: int64(c.Cost), BusyCostNanos: int64(c.BusyCost), IdleCostNanos: int64(c.IdleCost),
			PriceVersion: c.PriceVersion, Telemetry: d.telemetry,
		})
	}
	return whole, rows, nil
}
