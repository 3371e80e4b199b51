-- Closed billing statements: one tenant's bill for one period, written once
-- when the period closes and never changed after. content is the
-- statement's canonical JSON (billing.Statement) and hash its SHA-256, so
-- a re-read gives the same bytes. Two closes of the same period running at
-- once may both insert; readers take the first row written (the smallest
-- (closed_at, hash)), so every reader sees the same statement whichever
-- close won.
CREATE TABLE IF NOT EXISTS statements
(
    tenant_id    String,
    period       String,
    zone         String,
    period_start DateTime,
    period_end   DateTime,
    hash         String,
    content      String,
    closed_at    DateTime
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(period_start)
ORDER BY (tenant_id, period, closed_at, hash);
