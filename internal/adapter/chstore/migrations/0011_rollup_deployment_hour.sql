-- Per-model-and-deployment hour rollups, every tenant together (tenant_id,
-- model_version, gpu_type and slo_class left empty), derived from
-- rollup_hour by every hour recompute like rollup_total_hour: the capacity
-- report reads a deployment's hours from a few rows per hour instead of
-- every tenant's (5.8M rows for the benchmark's month). Same columns and
-- versioning as rollup_hour.
CREATE TABLE IF NOT EXISTS rollup_deployment_hour AS rollup_hour
ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (bucket, deployment, model)
SETTINGS index_granularity = 256;

-- The hours rolled up before this migration, from their newest rollup_hour
-- rows, summed as the job sums them (histograms by key, minutes by
-- position). Rows already present at their hour's newest version are
-- skipped, row by row (a run that stopped half-way may have written part of
-- an hour: an INSERT ... SELECT is written in blocks), so that running it
-- again neither counts a row twice nor leaves an hour incomplete. Hours
-- the job recomputes meanwhile (another replica of older code) are read
-- from rollup_hour by the capacity report until they are here at their
-- newest version.
INSERT INTO rollup_deployment_hour (bucket, tenant_id, model, model_version, deployment, gpu_type, slo_class,
  requests, errors, err_context_length, err_rate_limited, err_oom, err_cuda, err_timeout, err_cancelled,
  err_bad_request, err_internal, prompt_tokens, cached_prompt_tokens, output_tokens,
  ttft_count, ttft_sum, ttft_keys, ttft_counts, itl_count, itl_sum, itl_keys, itl_counts,
  e2e_count, e2e_sum, e2e_keys, e2e_counts, queue_count, queue_sum, queue_keys, queue_counts,
  slo_version, good_requests, good_output_tokens, version,
  peak_minute_requests, peak_minute_output_tokens, minute_requests, minute_output_tokens)
SELECT bucket, '', model, '', deployment, '', '',
  sum(requests), sum(errors), sum(err_context_length), sum(err_rate_limited), sum(err_oom), sum(err_cuda),
  sum(err_timeout), sum(err_cancelled), sum(err_bad_request), sum(err_internal),
  sum(prompt_tokens), sum(cached_prompt_tokens), sum(output_tokens),
  sum(ttft_count), sum(ttft_sum), tupleElement(sumMap(ttft_keys, ttft_counts), 1), tupleElement(sumMap(ttft_keys, ttft_counts), 2),
  sum(itl_count), sum(itl_sum), tupleElement(sumMap(itl_keys, itl_counts), 1), tupleElement(sumMap(itl_keys, itl_counts), 2),
  sum(e2e_count), sum(e2e_sum), tupleElement(sumMap(e2e_keys, e2e_counts), 1), tupleElement(sumMap(e2e_keys, e2e_counts), 2),
  sum(queue_count), sum(queue_sum), tupleElement(sumMap(queue_keys, queue_counts), 1), tupleElement(sumMap(queue_keys, queue_counts), 2),
  max(slo_version), sum(good_requests), sum(good_output_tokens), version,
  arrayReduce('max', sumForEach(minute_requests)), arrayReduce('max', sumForEach(minute_output_tokens)),
  sumForEach(minute_requests), sumForEach(minute_output_tokens)
FROM rollup_hour
WHERE (bucket, version) IN (SELECT bucket, max(version) FROM rollup_hour GROUP BY bucket)
  AND (bucket, deployment, model, version) NOT IN (SELECT bucket, deployment, model, version FROM rollup_deployment_hour)
GROUP BY bucket, model, deployment, version;
