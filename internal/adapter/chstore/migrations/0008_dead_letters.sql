-- Records that ingest rejected and that the dead-letter topic refused (too
-- large even when cut, not authorized, or unreachable past the retry
-- budget): the rejection is kept here instead, so that no record can stop
-- a partition. payload holds at most the first bytes of the record's value
-- (the consumer's DLQ value limit); original_size and original_sha256
-- identify the whole value. A redelivered record replaces its row.
CREATE TABLE IF NOT EXISTS dead_letters
(
    source_topic      String,
    source_partition  Int32,
    source_offset     Int64,
    reason_code       String,
    reason            String,
    original_size     UInt64,
    original_sha256   String,
    record_key        String,
    payload           String,
    payload_truncated UInt8,
    dlq_error         String,
    recorded_at       DateTime
)
ENGINE = ReplacingMergeTree(recorded_at)
PARTITION BY toYYYYMM(recorded_at)
ORDER BY (source_topic, source_partition, source_offset);
