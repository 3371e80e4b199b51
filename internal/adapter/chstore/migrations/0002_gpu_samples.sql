-- Raw GPU samples (see proto GpuSample). Ingested by a later pipeline; the
-- table exists now so that the contract and the schema are whole.
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
ORDER BY (deployment, gpu_uuid, mig_instance_id, sampled_at, sample_id);
