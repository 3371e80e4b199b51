-- Reissued statements and the invoices and credit notes of every statement
-- revision (billing/invoice.go, docs/architecture.md "Invoices").
--
-- statement_revisions holds revisions 1, 2, ... of a period's statement,
-- each written once when an admin voids the revision before it; revision
-- 0 stays in statements, whose rows are never touched, so the original is
-- readable byte for byte. Readers take a period's highest revision (the
-- first row stored of it, as for statements).
CREATE TABLE IF NOT EXISTS statement_revisions
(
    tenant_id String,
    period    String,
    revision  UInt32,
    hash      String,
    content   String,
    closed_at DateTime
)
ENGINE = MergeTree
ORDER BY (tenant_id, period, revision, closed_at, hash);

-- invoices holds every invoice and credit note, numbered by (issuer, seq):
-- gap-free per issuer, assigned under the close lock (billing/closing).
-- content is the document's canonical JSON and hash its SHA-256. No
-- partition key: the documents a close or a void issues go in one INSERT,
-- which is then one part, written whole or not at all, so a failed insert
-- leaves no number used.
CREATE TABLE IF NOT EXISTS invoices
(
    issuer         String,
    seq            UInt64,
    number         String,
    kind           String,
    tenant_id      String,
    period         String,
    revision       UInt32,
    statement_hash String,
    issued_at      DateTime,
    hash           String,
    content        String
)
ENGINE = MergeTree
ORDER BY (issuer, seq, issued_at, hash);
