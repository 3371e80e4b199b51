-- Coarser hour rollups, derived from rollup_hour by every hour recompute:
-- per tenant (model and the other dimensions merged, left empty) and for all
-- tenants (tenant_id empty too). Queries that group by nothing finer read
-- one row per tenant-hour or per hour instead of one per group, and merge
-- far fewer histograms. Same columns and versioning as rollup_hour.
-- Each hour's recompute writes one part holding every tenant, so until
-- merges catch up a tenant's month is spread over hundreds of parts; small
-- granules (256 rows, not 8192) keep a one-tenant read to its own rows.
CREATE TABLE IF NOT EXISTS rollup_tenant_hour AS rollup_hour
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant_id, bucket)
SETTINGS index_granularity = 256;

CREATE TABLE IF NOT EXISTS rollup_total_hour AS rollup_hour
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY bucket
SETTINGS index_granularity = 256;
