-- Minute rows are kept for a limited window (meterd --minute-retention,
-- default 7 days): hour and day rows answer longer ranges, and the minute
-- rows were the largest table after the raw events (50 bytes per event at
-- the 100M-event benchmark). rollup_minute_recent has the columns of
-- rollup_minute, partitioned by UTC day (whatever the server's time zone),
-- so that the rollup job drops a day whole once it is older than the
-- window (ALTER TABLE … DROP PARTITION).
-- Every minute row is copied; the rollup job then drops the days outside
-- the window. A copy run twice (a migration stopped before it was
-- recorded) inserts the rows again with their version: reads with FINAL
-- and merges keep one of each.
CREATE TABLE IF NOT EXISTS rollup_minute_recent AS rollup_minute
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMMDD(bucket, 'UTC')
ORDER BY (tenant_id, bucket, model, model_version, deployment, gpu_type, slo_class);

INSERT INTO rollup_minute_recent (bucket, tenant_id, model, model_version, deployment, gpu_type, slo_class, requests, errors, err_context_length, err_rate_limited, err_oom, err_cuda, err_timeout, err_cancelled, err_bad_request, err_internal, prompt_tokens, cached_prompt_tokens, output_tokens, ttft_count, ttft_sum, ttft_keys, ttft_counts, itl_count, itl_sum, itl_keys, itl_counts, e2e_count, e2e_sum, e2e_keys, e2e_counts, queue_count, queue_sum, queue_keys, queue_counts, slo_version, good_requests, good_output_tokens, version)
SELECT bucket, tenant_id, model, model_version, deployment, gpu_type, slo_class, requests, errors, err_context_length, err_rate_limited, err_oom, err_cuda, err_timeout, err_cancelled, err_bad_request, err_internal, prompt_tokens, cached_prompt_tokens, output_tokens, ttft_count, ttft_sum, ttft_keys, ttft_counts, itl_count, itl_sum, itl_keys, itl_counts, e2e_count, e2e_sum, e2e_keys, e2e_counts, queue_count, queue_sum, queue_keys, queue_counts, slo_version, good_requests, good_output_tokens, version
FROM rollup_minute;
