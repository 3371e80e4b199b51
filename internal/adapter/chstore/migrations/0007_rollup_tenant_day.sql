-- Per-tenant day rollups (UTC days), derived from rollup_tenant_hour by the
-- rollup job once a day has ended, and again whenever one of its hours is
-- recomputed. Queries across tenants at day, month or total step read a
-- day's 1,000 tenant rows instead of 24,000 tenant-hour rows: merging a
-- month of every tenant's latency histograms took 6.5 s from the hour rows
-- on 18.16, 0.5 s from these.
-- hour_versions is the sum of the versions of the hour rows a day row was
-- computed from (the newest of each hour). Hour versions only grow, so the
-- day row is fresh exactly when the same sum over the newest hour rows
-- still gives it; queries check that and read the hours of any other day.
CREATE TABLE IF NOT EXISTS rollup_tenant_day AS rollup_hour
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant_id, bucket)
SETTINGS index_granularity = 256;

ALTER TABLE rollup_tenant_day ADD COLUMN hour_versions UInt64;
