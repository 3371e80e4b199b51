-- Engine restarts and the KV-cache minimum (issue 33). engine_samples
-- carries each scrape's restarts (1 when the engine restarted since the
-- replica's previous scrape, 0 when not, NULL at its first scrape);
-- engine_hour and engine_minute carry Σ restarts and the smallest KV-cache
-- usage sampled (kv_min, meaningful where kv_samples > 0). Rows rolled up
-- before this migration read kv_min -1: their minimum is unknown until the
-- hour is rolled up again. One column per statement: a run that stopped
-- after some of them skips the columns added already (18.16 has no ADD
-- COLUMN IF NOT EXISTS).
ALTER TABLE engine_samples ADD COLUMN restarts Nullable(UInt32);
ALTER TABLE engine_hour ADD COLUMN kv_min Float64 DEFAULT -1;
ALTER TABLE engine_hour ADD COLUMN restarts UInt64;
ALTER TABLE engine_minute ADD COLUMN kv_min Float64 DEFAULT -1;
ALTER TABLE engine_minute ADD COLUMN restarts UInt64;
