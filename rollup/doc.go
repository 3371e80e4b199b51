// Package rollup owns the scheduled, idempotent aggregation of raw events
// into per-minute and per-hour rollups: which hours to recompute (dirty hours
// since a watermark, hours counted with an old SLO version), the SLO sets that
// decide goodput, and the lease that lets one replica at a time run the job.
//
// An hour is recomputed from one read of its deduplicated events, aggregated
// here into every level at once (minute, hour, tenant-hour, all-tenant hour;
// RollupHour), goodput counted with the rules of a GoodputSpec; the SQL that
// reads the events and writes the rows lives in internal/chstore, the
// histogram keys in rollup/sketch. Days that have ended are then rolled up
// per tenant from the tenant-hour rows (chstore.Store.RollupDay): the days of
// the hours just recomputed, and any ended day left without a fresh one.
// It does not serve queries (package api does).
package rollup
