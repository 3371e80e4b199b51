-- GPU samples and cost. Before this migration no pipeline wrote gpu_samples
-- (the table of 0002 only fixed the contract), so it is recreated with an
-- hour-first key: the cost rollup of an hour then reads only that hour.
-- A sample belongs to the hour that contains its sampled_at (the end of the
-- interval it covers); it is not split across hours.
DROP TABLE IF EXISTS gpu_samples;

CREATE TABLE IF NOT EXISTS gpu_samples
(
    sample_id        String,
    node             String,
    gpu_uuid         String,
    gpu_index        UInt32,
    gpu_type         String,
    mig_profile      String,
    mig_instance_id  UInt32,
    mig_fraction     Float64,
    deployment       String,
    pod              String,
    namespace        String,
    region           String,
    pool             String,
    sampled_at       DateTime,
    sampled_at_ms    Int64,
    interval_s       Float64,
    utilization      Float64,
    fb_used_bytes    UInt64,
    fb_total_bytes   UInt64,
    power_watts      Float64,
    energy_joules    Float64,
    temperature_c    Float64,
    sm_clock_mhz     Float64,
    source           String,
    ingested_at      DateTime
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(sampled_at)
ORDER BY (toStartOfHour(sampled_at), deployment, gpu_uuid, mig_instance_id, sample_id);

-- Hours touched by GPU sample inserts, like dirty_hours for events.
CREATE TABLE IF NOT EXISTS gpu_dirty_hours
(
    hour        DateTime,
    ingested_at DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (ingested_at, hour);

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_dirty_hours_mv TO gpu_dirty_hours AS
SELECT DISTINCT toDateTime(intDiv(toUInt32(sampled_at), 3600) * 3600) AS hour, now() AS ingested_at
FROM gpu_samples;

-- GPU time and cost per deployment-hour and GPU group (type, pool, region,
-- MIG profile). Seconds are effective GPU-seconds (a MIG slice counts its
-- fraction of the card); money is integer nano-units of the price book's
-- currency. cost = busy_cost + idle_cost exactly.
CREATE TABLE IF NOT EXISTS gpu_hour
(
    hour             DateTime,
    deployment       String,
    gpu_type         String,
    pool             String,
    region           String,
    mig_profile      String,
    gpus             UInt32,
    samples          UInt64,
    gpu_seconds      Float64,
    busy_seconds     Float64,
    covered_seconds  Float64,
    energy_joules    Float64,
    unpriced_seconds Float64,
    cost_nanos       Int64,
    busy_cost_nanos  Int64,
    idle_cost_nanos  Int64,
    price_version    String,
    version          UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, deployment, gpu_type, pool, region, mig_profile);

-- A deployment-hour's GPU cost allocated to (tenant, model) for every busy
-- policy (tokens, weighted, request_time) and idle policy (separate,
-- shared_weighted, shared_even): cost_<busy>_<idle> is the line's total,
-- busy_<busy> its busy part. The tenant "__idle__" holds the idle cost kept
-- apart (and all of the cost of a deployment-hour without traffic).
-- unattributed = 1 marks usage in a deployment-hour without GPU samples: its
-- cost is unknown, not zero. list_charge is the usage at the model's token
-- list prices (list_priced = 0: the model had none).
CREATE TABLE IF NOT EXISTS cost_hour
(
    hour                          DateTime,
    tenant_id                     String,
    deployment                    String,
    model                         String,
    gpu_type                      String,
    unattributed                  UInt8,
    requests                      UInt64,
    input_tokens                  UInt64,
    cached_input_tokens           UInt64,
    output_tokens                 UInt64,
    good_output_tokens            UInt64,
    e2e_ms                        UInt64,
    busy_tokens                   Int64,
    busy_weighted                 Int64,
    busy_request_time             Int64,
    cost_tokens_separate          Int64,
    cost_tokens_shared_weighted   Int64,
    cost_tokens_shared_even       Int64,
    cost_weighted_separate        Int64,
    cost_weighted_shared_weighted Int64,
    cost_weighted_shared_even     Int64,
    cost_request_time_separate        Int64,
    cost_request_time_shared_weighted Int64,
    cost_request_time_shared_even     Int64,
    list_charge                   Int64,
    list_priced                   UInt8,
    price_version                 String,
    slo_version                   UInt32,
    version                       UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (tenant_id, hour, deployment, model)
SETTINGS index_granularity = 1024;

-- Versioned price books (billing.PriceBook as canonical JSON). The newest
-- (highest seq, the store time in ns) is in force; every gpu_hour and cost_hour row records the version it used.
CREATE TABLE IF NOT EXISTS price_books
(
    version    String,
    book       String,
    source     String,
    created_at DateTime,
    seq        UInt64
)
ENGINE = MergeTree
ORDER BY seq;
