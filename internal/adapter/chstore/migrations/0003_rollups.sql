-- Hours touched by inserts, recorded by ClickHouse itself for every insert
-- block into inference_events, whatever wrote it. The rollup job recomputes
-- the hours recorded since its watermark: late events (hours late) make
-- exactly their hour dirty again. Hours are UTC (no server time zone).
CREATE TABLE IF NOT EXISTS dirty_hours
(
    hour        DateTime,
    ingested_at DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (ingested_at, hour);

CREATE MATERIALIZED VIEW IF NOT EXISTS dirty_hours_mv TO dirty_hours AS
SELECT DISTINCT toDateTime(intDiv(toUInt32(completed_at), 3600) * 3600) AS hour, now() AS ingested_at
FROM inference_events;

-- Per-minute and per-hour rollups of deduplicated events, per (tenant, model,
-- model_version, deployment, gpu_type, slo_class). A recomputed bucket
-- replaces the old rows: ReplacingMergeTree keeps the highest version, and
-- queries read with FINAL. Latency distributions are sparse log-bucket
-- histograms (keys, counts) merged with sumMap; *_sum and *_count give means.
CREATE TABLE IF NOT EXISTS rollup_minute
(
    bucket               DateTime,
    tenant_id            String,
    model                String,
    model_version        String,
    deployment           String,
    gpu_type             String,
    slo_class            String,
    requests             UInt64,
    errors               UInt64,
    err_context_length   UInt64,
    err_rate_limited     UInt64,
    err_oom              UInt64,
    err_cuda             UInt64,
    err_timeout          UInt64,
    err_cancelled        UInt64,
    err_bad_request      UInt64,
    err_internal         UInt64,
    prompt_tokens        UInt64,
    cached_prompt_tokens UInt64,
    output_tokens        UInt64,
    ttft_count           UInt64,
    ttft_sum             Float64,
    ttft_keys            Array(Int16),
    ttft_counts          Array(UInt64),
    itl_count            UInt64,
    itl_sum              Float64,
    itl_keys             Array(Int16),
    itl_counts           Array(UInt64),
    e2e_count            UInt64,
    e2e_sum              Float64,
    e2e_keys             Array(Int16),
    e2e_counts           Array(UInt64),
    queue_count          UInt64,
    queue_sum            Float64,
    queue_keys           Array(Int16),
    queue_counts         Array(UInt64),
    slo_version          UInt32,
    good_requests        UInt64,
    good_output_tokens   UInt64,
    version              UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant_id, bucket, model, model_version, deployment, gpu_type, slo_class);

CREATE TABLE IF NOT EXISTS rollup_hour AS rollup_minute
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant_id, bucket, model, model_version, deployment, gpu_type, slo_class);

-- The rollup job's progress: the ingested_at watermark of dirty_hours.
CREATE TABLE IF NOT EXISTS rollup_state
(
    job        String,
    watermark  DateTime,
    updated_at DateTime
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY job;

-- Versioned SLO sets. The newest version is in force; every rollup row
-- records the version it counted good requests with.
CREATE TABLE IF NOT EXISTS slo_sets
(
    version    UInt32,
    rules      String,
    source     String,
    created_at DateTime
)
ENGINE = MergeTree
ORDER BY version;
