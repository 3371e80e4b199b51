-- GPU telemetry (docs/architecture.md "GPU telemetry"): SM activity and the
-- maximum SM clock on every sample, and the sums and maxima from which the
-- memory, power, temperature, clock-throttling and SM-activity figures of
-- any range are derived, on gpu_hour (per GPU group) and on a new per-GPU
-- table, gpu_device_hour. Hours rolled up before this migration hold zeros
-- (their *_seconds are 0: no reading) until recomputed.
-- One column per statement: 18.16 has no ADD COLUMN IF NOT EXISTS, and a
-- rerun skips a column that exists (Store.Migrate, addedBefore).
-- sm_active is DCGM_FI_PROF_SM_ACTIVE in units of 1/10,000 (a Float64 took
-- 8 bytes a sample compressed, 4.2 bytes per event at the benchmark's 52M
-- samples per 100M events); 65535: the sample did not carry it.
ALTER TABLE gpu_samples ADD COLUMN sm_active UInt16 DEFAULT 65535;
ALTER TABLE gpu_samples ADD COLUMN sm_clock_max_mhz Float64 DEFAULT 0;

-- The columns of rollup.GPUTelemetry.
ALTER TABLE gpu_hour ADD COLUMN fb_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN fb_used_mib_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN fb_total_mib_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN fb_used_max UInt64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN fb_used_max_ratio Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN power_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN power_watt_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN power_max Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN temp_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN temp_degree_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN temp_max Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN clock_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN throttle_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN sm_active_seconds Float64 DEFAULT 0;
ALTER TABLE gpu_hour ADD COLUMN sm_active_sum Float64 DEFAULT 0;

-- One row per deployment-hour, GPU group and GPU (or MIG instance: gpu is
-- the UUID, "/<mig_instance_id>" for an instance), with gpu_hour's columns
-- (gpus = 1; each GPU priced on its own) and node. GetGpuUsage reads it
-- when grouped by node or gpu. A row per GPU-hour: about 8,800 a year per
-- GPU, independent of the events.
CREATE TABLE IF NOT EXISTS gpu_device_hour
(
    hour                  DateTime,
    deployment            String,
    gpu_type              String,
    pool                  String,
    region                String,
    mig_profile           String,
    node                  String,
    gpu                   String,
    gpus                  UInt32,
    samples               UInt64,
    gpu_seconds           Float64,
    busy_seconds          Float64,
    covered_seconds       Float64,
    energy_joules         Float64,
    unpriced_seconds      Float64,
    cost_nanos            Int64,
    busy_cost_nanos       Int64,
    idle_cost_nanos       Int64,
    price_version         String,
    fb_seconds            Float64,
    fb_used_mib_seconds   Float64,
    fb_total_mib_seconds  Float64,
    fb_used_max           UInt64,
    fb_used_max_ratio     Float64,
    power_seconds         Float64,
    power_watt_seconds    Float64,
    power_max             Float64,
    temp_seconds          Float64,
    temp_degree_seconds   Float64,
    temp_max              Float64,
    clock_seconds         Float64,
    throttle_seconds      Float64,
    sm_active_seconds     Float64,
    sm_active_sum         Float64,
    version               UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, deployment, gpu_type, pool, region, mig_profile, node, gpu);
