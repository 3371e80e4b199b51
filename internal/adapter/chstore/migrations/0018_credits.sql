-- Credit grants (billing/credits.go): amounts a tenant may draw on before it
-- pays, created by an admin and never changed after. grant_id is the
-- idempotency key of their creation: the same grant again stores nothing
-- (creations run one at a time, under the close lock), and readers take the
-- first row stored of an id. amount is in nano-units of currency;
-- expires_at 0 (1970-01-01 00:00:00) means no expiry.
CREATE TABLE IF NOT EXISTS credit_grants
(
    grant_id       String,
    tenant_id      String,
    kind           String,
    amount         Int64,
    currency       String,
    effective_from DateTime,
    expires_at     DateTime,
    priority       Int32,
    description    String,
    created_at     DateTime,
    created_by     String
)
ENGINE = MergeTree
ORDER BY (tenant_id, grant_id, created_at);

-- The credit ledger: each draw and expiry a closed statement made on a grant
-- (billing.CreditEntriesOf, written from the statement stored), and each
-- return and expiry reversal a void gave back. amount is > 0, in nano-units;
-- entry_id names the movement (kind, tenant, period, statement hash,
-- grant), so an entry written twice (a retry, a reconciliation after a
-- crash) is read once: readers keep one row per entry_id.
CREATE TABLE IF NOT EXISTS credit_ledger
(
    entry_id       String,
    tenant_id      String,
    grant_id       String,
    kind           String,
    amount         Int64,
    period         String,
    statement_hash String,
    at             DateTime
)
ENGINE = MergeTree
ORDER BY (tenant_id, entry_id, at);
