-- Every (tenant_id, event_id) ever stored, with what identifies its first
-- stored copy, so that one event is counted once whatever completed_at a
-- later copy carries (inference_events deduplicates only within an hour,
-- its key being hour-first). The consumer looks the ids of each batch up
-- here before inserting it: a copy equal to the stored one is dropped (a
-- redelivery or a client's retry), a copy that differs goes to the dead
-- letters (reason duplicate_conflict) and is never stored.
-- key_hash is cityHash64(concat(tenant_id, '\0', event_id)), computed by
-- meterd (go-faster/city's CH64 is ClickHouse's cityHash64); the lookups
-- read by it. fingerprint is meterd's hash of the copy's content (0: not
-- known, for the ids copied from inference_events below, compared by
-- completed_at_ms instead). A row is written after its event, so an id
-- found here is an event stored. A key has more than one row only after a
-- redelivery (identical copies); a plain MergeTree keeps them all, and a
-- lookup takes the earliest by ingested_at (a ReplacingMergeTree would keep
-- the latest). Lookups are of random keys, a batch's at a time: small
-- granules (1,024 rows) and no partitions keep the rows each one reads
-- few; the compressed blocks it must read still grow with the table
-- (docs/performance.md).
CREATE TABLE IF NOT EXISTS event_ids
(
    key_hash         UInt64,
    tenant_id        String,
    event_id         String,
    completed_at_ms  Int64,
    fingerprint      UInt64,
    ingested_at      DateTime,
    source_partition Int32,
    source_offset    Int64
)
ENGINE = MergeTree
ORDER BY key_hash
SETTINGS index_granularity = 1024;

-- The ids stored before this migration, every copy (a key's earliest copy
-- is the first stored one; lookups take it by ingested_at).
INSERT INTO event_ids (key_hash, tenant_id, event_id, completed_at_ms, fingerprint, ingested_at, source_partition, source_offset)
SELECT cityHash64(concat(tenant_id, '\0', event_id)), tenant_id, event_id, completed_at_ms, 0, ingested_at, source_partition, source_offset
FROM inference_events
