package query

import (
	"slices"
	"time"

	"tokenmeter/rollup"
)

// Level is a level of the rollups: which rows answer a read.
type Level int

const (
	// LevelMinute: one row per minute and group (all six dimensions).
	LevelMinute Level = iota
	// LevelHour: one row per hour and group.
	LevelHour
	// LevelTenantHour: one row per hour and tenant; with Days, whole days
	// from the day rollups (one row per day and tenant).
	LevelTenantHour
	// LevelTotalHour: one row per hour, every tenant together.
	LevelTotalHour
	// LevelDeploymentHour: one row per hour, model and deployment, every
	// tenant together (the capacity report's read, Service.DeploymentHours;
	// levelFor never picks it).
	LevelDeploymentHour
)

// levelFor picks the coarsest rollup level that answers a query: the hour
// levels when the range lies on whole hours and the step is not a minute;
// among them the per-tenant or all-tenant one when the grouping allows.
func levelFor(start, end time.Time, step, tenant string, groupBy []string) Level {
	if step == "minute" || !start.Truncate(time.Hour).Equal(start) || !end.Truncate(time.Hour).Equal(end) {
		return LevelMinute
	}
	switch {
	case len(groupBy) == 0 && tenant == "":
		return LevelTotalHour
	case len(groupBy) == 0 || (len(groupBy) == 1 && groupBy[0] == "tenant_id"):
		return LevelTenantHour
	}
	return LevelHour
}

// level is the rollup level that answers q. For the histograms of
// rollup.HourDists (SizeColumns, BreakdownColumns) it is the level whose
// table keeps them (rollup.HourDistTables) and answers the grouping: the
// all-tenant rows without a tenant and grouped by nothing, model or
// deployment (every one); else the tenant rows for the token sizes and
// decode of a tenant or per tenant, the group rows for decode of other
// groupings. (Tenant rows rolled up before they kept decode make
// Service.Rollups read the group rows instead: RollupRow.DecodeUnkept.)
func (q RollupQuery) level() Level {
	l := levelFor(q.Start, q.End, q.Step, q.TenantID, q.GroupBy)
	if l == LevelMinute || (q.Columns != SizeColumns && q.Columns != BreakdownColumns) {
		return l
	}
	byDeployment := q.TenantID == "" && !slices.ContainsFunc(q.GroupBy, func(f string) bool { return f != "model" && f != "deployment" })
	switch {
	case l == LevelTotalHour:
		return l
	case byDeployment:
		return LevelDeploymentHour
	case l == LevelTenantHour:
		return l
	}
	return LevelHour
}

// usesDays reports whether q may read whole days from the day rollups: a
// read of every tenant's tenant-hour rows at a step of a day or more. (One
// tenant's month is 720 rows, read fast enough; checking which day rows
// are fresh reads every tenant's hour versions.)
func (q RollupQuery) usesDays() bool {
	return q.level() == LevelTenantHour && q.TenantID == "" && rollup.Granularities[q.Step] != rollup.Granularities["hour"]
}

// mergeHere reports whether the rows of q are few enough to be merged by
// this process rather than by the store: one tenant's hour rows, or the
// all-tenant ones (a month is a few thousand rows). On ClickHouse 18.16,
// sumMap costs about a microsecond per histogram bucket even when a step
// has one row to merge, so a tenant's month of latency at hour step spent
// 0.1–0.3 s in it.
func (q RollupQuery) mergeHere() bool {
	switch q.level() {
	case LevelTotalHour:
		return true
	case LevelTenantHour, LevelHour:
		return q.TenantID != ""
	}
	return false
}

// UsageRead is one read of usage rows: from the rollups at Level, leaving
// out Hours, or (Raw) from raw events, of Hours only (nil: every hour).
type UsageRead struct {
	Query UsageQuery
	Level Level
	Raw   bool
	Hours []time.Time
}

// RollupRead is one read of rollup rows at Level, whole Days of it from the
// day rollups (LevelTenantHour only). With Merge the store merges the rows
// per (step, group), in order, and applies Query.Limit and Offset; without
// it, it returns each stored row with its step and group, for this package
// to merge.
type RollupRead struct {
	Query RollupQuery
	Level Level
	Days  []time.Time
	Merge bool
}

// TrafficKind is the kind of rows a traffic read sums (see Service.Traffic).
type TrafficKind int

const (
	// TrafficMinutes: minute rows, summed per minute and series.
	TrafficMinutes TrafficKind = iota
	// TrafficLevel: hour (or day) rows that are each a series' own.
	TrafficLevel
	// TrafficMerged: LevelHour rows merged per series, with their
	// per-minute counts.
	TrafficMerged
)

// TrafficRead is one read of traffic rows of Kind at Level (LevelMinute
// for TrafficMinutes), with whole Days from the day rollups (TrafficLevel
// on LevelTenantHour only), of OnlyHours when not nil, at most Limit rows
// (0: no bound) from Query.Offset.
type TrafficRead struct {
	Query     RollupQuery
	Kind      TrafficKind
	Level     Level
	Days      []time.Time
	OnlyHours []time.Time
	Limit     int
}

// trafficKind picks the rows that answer a normalized q, and their level.
func (q RollupQuery) trafficKind() (TrafficKind, Level) {
	level := q.level()
	switch level {
	case LevelMinute:
		return TrafficMinutes, level
	case LevelHour:
		// A series is one hour row per hour when it fixes every
		// dimension: grouped by it, or the query's tenant.
		fixed := len(q.GroupBy)
		if q.TenantID != "" && !slices.Contains(q.GroupBy, "tenant_id") {
			fixed++
		}
		if fixed < len(rollup.RollupGroupFields) {
			return TrafficMerged, level
		}
	}
	return TrafficLevel, level
}

// GPUTokens is which cost lines give the tokens served by GPU groups: the
// attributed lines of tenants, not Except (the line of cost charged to no
// tenant, billing.IdleTenant), and only when Join (see tokensJoinable).
type GPUTokens struct {
	Join   bool
	Except string
}

// tokensJoinable says whether the cost rows can give the tokens served by
// these GPU groups: only groups of deployment and GPU type, which cost rows
// carry too.
func (q GPUUsageQuery) tokensJoinable() bool {
	for _, f := range q.GroupBy {
		if f != "deployment" && f != "gpu_type" {
			return false
		}
	}
	return true
}

// PlanTraffic is the read that answers a normalized traffic query, before
// the fresh days are known and the limit bounded (Service.Traffic does
// both); the limit is the query's.
func PlanTraffic(q RollupQuery) TrafficRead {
	kind, level := q.trafficKind()
	return TrafficRead{Query: q, Kind: kind, Level: level, Limit: q.Limit}
}
