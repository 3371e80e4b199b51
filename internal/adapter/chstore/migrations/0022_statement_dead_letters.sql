-- Statements whose event a billing events sink (package billing/notify)
-- gave up sending: the event could not be made from what is stored (the
-- statement's JSON, or its invoice's, does not decode), or the sink refused
-- it for good (a webhook's 4xx other than 408 and 429) as many times in a
-- row as the Notifier's bound. A row per giving up, for operators: the
-- statement stays without a row in statement_deliveries, so the next
-- meterd (a restart) or an explicit redeliver tries it again, and its
-- delivery then adds its row there. Rows are never changed.
CREATE TABLE IF NOT EXISTS statement_dead_letters
(
    sink      String,
    tenant_id String,
    period    String,
    revision  UInt32,
    hash      String,
    attempts  UInt32,
    reason    String,
    dead_at   DateTime
)
ENGINE = MergeTree
ORDER BY (sink, tenant_id, period, hash);
