-- Decode on the tenant rows (docs/architecture.md "Latency breakdown and
-- token sizes"): rollup_tenant_hour and rollup_tenant_day keep the decode
-- histogram (decode_keys, decode_counts, added by migration 0023 and empty
-- there until now), so that one tenant's GetLatency and every tenant's by
-- tenant read it from the tenant rows instead of merging every group row of
-- rollup_hour. decode_kept is 1 on the rows that keep it: tenant hours
-- rolled up since this change, and day rows all of whose hours kept it.
-- Rows written before hold 0 (their empty arrays are not "no decode"), and
-- a read that meets one answers from rollup_hour as before, until the
-- rollup job recomputes their hours and days. One column per statement: a
-- rerun skips a column that exists (Store.Migrate, addedBefore).
ALTER TABLE rollup_tenant_hour ADD COLUMN decode_kept UInt8 DEFAULT 0;
ALTER TABLE rollup_tenant_day ADD COLUMN decode_kept UInt8 DEFAULT 0;
