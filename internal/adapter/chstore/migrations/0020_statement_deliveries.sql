-- Deliveries of closed statements to the sinks that send them out
-- (package billing/notify: a Kafka topic, a webhook): a row per statement
-- a sink has delivered, by the statement's hash, written after the sink
-- acknowledged it. The statements table is the outbox: a statement of a
-- sink's range without a row here is sent (again) by the next delivery
-- pass, after a failure or a restart, so delivery is at least once. A row
-- with an empty tenant_id marks a sink's first start: statements closed
-- before it are not sent (enabling a sink does not replay every bill of
-- the past). Rows are never changed; a redelivery adds a row.
CREATE TABLE IF NOT EXISTS statement_deliveries
(
    sink         String,
    tenant_id    String,
    period       String,
    hash         String,
    delivered_at DateTime
)
ENGINE = MergeTree
ORDER BY (sink, tenant_id, period, hash);
