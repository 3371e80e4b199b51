// Package rollup owns the scheduled, idempotent aggregation of raw events
// into per-minute, per-hour and per-day rollups, and the cost of each hour:
// which hours to recompute (dirty hours since a watermark, hours counted
// with an old SLO version), the SLO sets that decide goodput, the time
// buckets (StepStart, StepEnd, DayOf), what a rollup row counts (its
// dimensions, error classes and latency distributions), the day policy,
// and the lease that lets one replica at a time run the job. It declares
// the store it needs (Store: HourStore, DayStore, CostStore) and the
// records that store reads and writes; internal/adapter/chstore implements it.
//
// An hour is recomputed from one read of its deduplicated events, aggregated
// here into every level at once (minute, hour, tenant-hour, all-tenant hour;
// Roller.RollupHour, which keeps the memory of the last hour's events for
// the next; each Job has its own), goodput counted with the rules of a
// GoodputSpec; the SQL that reads the events and writes the rows lives in
// internal/adapter/chstore, the histogram keys in rollup/sketch. Days that have
// ended are then rolled up per tenant from the tenant-hour rows (RollupDay):
// the days of the hours just recomputed, and any ended day left without a
// fresh one (StaleDays). A day rollup is fresh while it was computed from
// the newest computation of each of its hours; queries read the fresh days
// (FreshDays) from their day rows. Cost allocation follows billing's
// policies (billing.BusyPolicies, billing.IdlePolicies).
// It does not serve queries (package query plans and merges the reads,
// package api serves them).
package rollup
