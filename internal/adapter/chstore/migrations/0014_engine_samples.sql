-- Engine samples (proto EngineSample): one row per replica of an inference
-- engine and scrape. A field the engine does not publish, or a counter
-- delta not yet known, is NULL, which every aggregate skips. A sample
-- belongs to the hour and minute that contain its sampled_at.
CREATE TABLE IF NOT EXISTS engine_samples
(
    sample_id             String,
    deployment            String,
    engine                String,
    replica               String,
    model                 String,
    node                  String,
    sampled_at            DateTime,
    sampled_at_ms         Int64,
    interval_s            Float64,
    running               Nullable(UInt32),
    waiting               Nullable(UInt32),
    kv_cache_usage        Nullable(Float64),
    prefix_cache_queries  Nullable(UInt64),
    prefix_cache_hits     Nullable(UInt64),
    prefix_cache_hit_rate Nullable(Float64),
    preemptions           Nullable(UInt64),
    batch_tokens          Nullable(Float64),
    source                String,
    ingested_at           DateTime
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(sampled_at)
ORDER BY (toStartOfHour(sampled_at), deployment, replica, sample_id);

-- Hours touched by engine sample inserts, like gpu_dirty_hours.
CREATE TABLE IF NOT EXISTS engine_dirty_hours
(
    hour        DateTime,
    ingested_at DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (ingested_at, hour);

CREATE MATERIALIZED VIEW IF NOT EXISTS engine_dirty_hours_mv TO engine_dirty_hours AS
SELECT DISTINCT toDateTime(intDiv(toUInt32(sampled_at), 3600) * 3600) AS hour, now() AS ingested_at
FROM engine_samples;

-- Engine rollups per bucket (hour, or minute) and replica: sums that merge
-- over any range and grouping. A mean is weighted / seconds (seconds: the
-- interval_s of the samples that carried the value); queue depths are
-- counted per value (waiting_values, waiting_counts), so that a p95 over
-- any range is exact. Rows of one computation of an hour share a version;
-- reads take the newest computation of each bucket.
CREATE TABLE IF NOT EXISTS engine_hour
(
    bucket             DateTime,
    deployment         String,
    engine             String,
    model              String,
    replica            String,
    samples            UInt64,
    sampled_seconds    Float64,
    running_weighted   Float64,
    running_seconds    Float64,
    running_max        UInt32,
    waiting_weighted   Float64,
    waiting_seconds    Float64,
    waiting_max        UInt32,
    waiting_values     Array(UInt32),
    waiting_counts     Array(UInt64),
    kv_weighted        Float64,
    kv_seconds         Float64,
    kv_max             Float64,
    kv_samples         UInt64,
    prefix_queries     UInt64,
    prefix_hits        UInt64,
    hit_rate_weighted  Float64,
    hit_rate_seconds   Float64,
    preemptions        UInt64,
    batch_weighted     Float64,
    batch_seconds      Float64,
    version            UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (bucket, deployment, engine, model, replica);

-- Minute rows, kept for the minute retention window like
-- rollup_minute_recent (partitioned by UTC day, dropped whole).
CREATE TABLE IF NOT EXISTS engine_minute AS engine_hour
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMMDD(bucket, 'UTC')
ORDER BY (bucket, deployment, engine, model, replica);
