-- Allocated GPU time and the serving dimensions of a cost line (issue 33).
--
-- gpu_ms_busy_<busy> and gpu_ms_<busy>_<idle> are the line's share of its
-- deployment-hour's GPU time in GPU-milliseconds, split exactly as its cost
-- is (busy_<busy>, cost_<busy>_<idle>: the same policies, the same largest
-- remainder), so that GPU-hours per tenant agree with cost per tenant under
-- every policy and the lines of a deployment-hour add up to its GPU time
-- rounded once to the millisecond (priced or not).
--
-- engine, tensor_parallelism and model_version are the line's serving
-- labels in its hour: the values its events carried, sorted and joined by
-- '+' when there were several ("sglang+vllm" for a deployment whose engine
-- changed within the hour; "2+4"), empty when none was reported. engine and
-- tensor_parallelism are the deployment's and model's (every tenant of the
-- deployment-hour alike), model_version is the line's own (a canary may
-- serve some tenants first).
--
-- Rows written before this migration have zeros and empty labels until the
-- rollup job recomputes their hours, which it does once, at its start
-- (Store.GPUTimeMissingHours). One column per statement: a run that
-- stopped after some of them skips the columns added already.
ALTER TABLE cost_hour ADD COLUMN gpu_ms_busy_tokens UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_busy_weighted UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_busy_request_time UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_tokens_separate UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_tokens_shared_weighted UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_tokens_shared_even UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_weighted_separate UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_weighted_shared_weighted UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_weighted_shared_even UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_request_time_separate UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_request_time_shared_weighted UInt64;
ALTER TABLE cost_hour ADD COLUMN gpu_ms_request_time_shared_even UInt64;
ALTER TABLE cost_hour ADD COLUMN engine String;
ALTER TABLE cost_hour ADD COLUMN tensor_parallelism String;
ALTER TABLE cost_hour ADD COLUMN model_version String;

-- The serving labels of each (hour, deployment, model), every tenant
-- together, as the cost step resolves them from the hour's events: what
-- usage reads group by engine and tensor_parallelism through (a few rows
-- per deployment-hour; rollup rows do not carry them). A small table of the
-- whole service, like price_books: in a cluster every server holds all of
-- it, so that a usage read joins it on each shard.
CREATE TABLE IF NOT EXISTS serving_hour
(
    hour               DateTime,
    deployment         String,
    model              String,
    engine             String,
    tensor_parallelism String,
    version            UInt64
)
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, deployment, model);
