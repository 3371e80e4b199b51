-- The busiest minute of every hour and day row, so that /v1/traffic reads
-- hour and day rows over long ranges (minute rows cap a query at 50,000
-- steps) and still reports the exact peak minute of each step.
-- peak_minute_requests and peak_minute_output_tokens are the largest
-- requests and output tokens of one minute of the row's own group: at the
-- tenant level of the tenant's sum over its groups, at the total level of
-- everything, in a day row the largest of its hours'. The hour rows also
-- keep the per-minute requests and output tokens of their hour (60 values,
-- minute 0 first): a query whose series merge several rows of one hour
-- (group_by=model) sums them minute by minute for an exact peak.
-- Rows written before this migration have zero peaks and empty arrays: the
-- rollup job recomputes their hours, and until it has, queries take those
-- hours' peaks from the minute rows. One column per statement: a run that
-- stopped after some of them skips the columns added already.
ALTER TABLE rollup_hour ADD COLUMN peak_minute_requests UInt64;
ALTER TABLE rollup_hour ADD COLUMN peak_minute_output_tokens UInt64;
ALTER TABLE rollup_hour ADD COLUMN minute_requests Array(UInt64);
ALTER TABLE rollup_hour ADD COLUMN minute_output_tokens Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN peak_minute_requests UInt64;
ALTER TABLE rollup_tenant_hour ADD COLUMN peak_minute_output_tokens UInt64;
ALTER TABLE rollup_tenant_hour ADD COLUMN minute_requests Array(UInt64);
ALTER TABLE rollup_tenant_hour ADD COLUMN minute_output_tokens Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN peak_minute_requests UInt64;
ALTER TABLE rollup_total_hour ADD COLUMN peak_minute_output_tokens UInt64;
ALTER TABLE rollup_total_hour ADD COLUMN minute_requests Array(UInt64);
ALTER TABLE rollup_total_hour ADD COLUMN minute_output_tokens Array(UInt64);
ALTER TABLE rollup_tenant_day ADD COLUMN peak_minute_requests UInt64;
ALTER TABLE rollup_tenant_day ADD COLUMN peak_minute_output_tokens UInt64;
