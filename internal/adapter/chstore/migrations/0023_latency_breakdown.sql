-- Latency breakdown, estimated TTFT and token sizes (docs/architecture.md
-- "Latency breakdown and token sizes").
--
-- inference_events.ttft_estimated is 1 for an event whose TTFT was taken
-- from its E2E (the label ttft_source=e2e that meterd --otlp-ttft-from-e2e
-- sets): the hour rollup leaves its TTFT out of the TTFT distribution,
-- decode and goodput's TTFT check. Computed by ClickHouse on insert; parts
-- written before this migration compute it when read. All zeros, it costs
-- next to nothing on disk.
--
-- The hour-level rollup rows (not the minute rows: see rollup.HourDists)
-- keep seven more histograms, keys Array(Int16) and counts Array(UInt64) as
-- the latency ones, without count or sum columns: prefill and decode (E2E
-- minus TTFT) in ms, prompt and output tokens per request, and E2E per
-- output-length class (short < 256 output tokens, medium < 1024, long).
-- Rows written before this migration have empty arrays until the rollup
-- job recomputes their hours. One column per statement: a run that stopped
-- after some of them skips the columns added already.
ALTER TABLE inference_events ADD COLUMN ttft_estimated UInt8 MATERIALIZED toUInt8(label_values[indexOf(label_keys, 'ttft_source')] = 'e2e');
ALTER TABLE rollup_hour ADD COLUMN prefill_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN prefill_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN decode_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN decode_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN prompt_size_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN prompt_size_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN output_size_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN output_size_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN e2e_short_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN e2e_short_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN e2e_medium_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN e2e_medium_counts Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN e2e_long_keys Array(Int16);
ALTER TABLE rollup_hour ADD COLUMN e2e_long_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN prefill_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN prefill_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN decode_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN decode_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN prompt_size_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN prompt_size_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN output_size_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN output_size_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_short_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_short_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_medium_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_medium_counts Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_long_keys Array(Int16);
ALTER TABLE rollup_tenant_hour ADD COLUMN e2e_long_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN prefill_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN prefill_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN decode_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN decode_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN prompt_size_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN prompt_size_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN output_size_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN output_size_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_short_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_short_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_medium_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_medium_counts Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_long_keys Array(Int16);
ALTER TABLE rollup_total_hour ADD COLUMN e2e_long_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN prefill_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN prefill_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN decode_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN decode_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN prompt_size_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN prompt_size_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN output_size_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN output_size_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_short_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_short_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_medium_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_medium_counts Array(UInt64);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_long_keys Array(Int16);
ALTER TABLE rollup_deployment_hour ADD COLUMN e2e_long_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN prefill_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN prefill_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN decode_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN decode_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN prompt_size_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN prompt_size_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN output_size_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN output_size_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_short_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_short_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_medium_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_medium_counts Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_long_keys Array(Int16);
ALTER TABLE rollup_tenant_day ADD COLUMN e2e_long_counts Array(UInt64);
