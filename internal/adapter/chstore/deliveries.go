package chstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"tokenmeter/billing"
)

// The delivery state of the sinks that send closed statements out
// (billing/notify): which statements each sink has delivered, by hash, in
// statement_deliveries. The statements table is the outbox.

// deliveryStartSQL reads a sink's first start: the earliest of its marker
// rows (empty tenant_id), and how many there are.
const deliveryStartSQL = `SELECT count(), min(delivered_at) FROM statement_deliveries
WHERE sink = ? AND tenant_id = ''`

// deliveryMarkSQL records a sink's start at the server's clock.
const deliveryMarkSQL = `INSERT INTO statement_deliveries (sink, tenant_id, period, hash, delivered_at)
SELECT ?, '', '', '', now()`

// undeliveredKeysSQL lists the statements (every revision of a period's
// statement: the close's, then the reissues; of each the first row
// stored, as StatementRevisions reads them) closed at or after a time that
// a sink has no delivery of, oldest close first, without their content:
// a page of them, after a cursor (a close time, tenant, period and
// revision; the zero time for the first page). The cursor is spelled out
// rather than compared as a tuple, as ClickHouse 18.16 reads it too.
var undeliveredKeysSQL = `SELECT tenant_id, period, revision, argMin(hash, (closed_at, hash)) AS first_hash, min(closed_at) AS first_closed
FROM (` + revisionsOf("1") + `)
GROUP BY tenant_id, period, revision
HAVING first_closed >= toDateTime(?)
   AND (first_closed > toDateTime(?) OR (first_closed = toDateTime(?) AND (tenant_id > ? OR (tenant_id = ? AND
       (period > ? OR (period = ? AND revision > ?))))))
   AND (tenant_id, period, first_hash) NOT IN (SELECT tenant_id, period, hash FROM statement_deliveries WHERE sink = ?)
ORDER BY first_closed, tenant_id, period, revision
LIMIT ?`

// undeliveredSQL reads the rows undeliveredKeysSQL lists, content
// included (it reads every statement's content: it runs only when there
// is something to deliver).
var undeliveredSQL = `SELECT tenant_id, period, revision, hash, content, closed_at FROM (` + revisionsOf("1") + `)
WHERE (tenant_id, period, revision, hash, closed_at) IN (` + undeliveredKeysSQL + `)
ORDER BY closed_at, tenant_id, period, revision`

// DeliveryStart returns when sink was first started, by the server's
// clock, recording the start now when it never was: statements closed
// before a sink existed are not its to send. Two meterd starting a new
// sink at once both record one; the earliest counts.
func (s *Store) DeliveryStart(ctx context.Context, sink string) (time.Time, error) {
	read := func() (uint64, time.Time, error) {
		var (
			n     uint64
			start time.Time
		)
		if err := s.conn.QueryRow(ctx, deliveryStartSQL, sink).Scan(&n, &start); err != nil {
			return 0, time.Time{}, fmt.Errorf("read start of sink %s: %w", sink, classify(err))
		}
		return n, start.UTC(), nil
	}
	n, start, err := read()
	if err != nil || n > 0 {
		return start, err
	}
	if err := s.conn.Exec(ctx, deliveryMarkSQL, sink); err != nil {
		return time.Time{}, fmt.Errorf("record start of sink %s: %w", sink, classify(err))
	}
	if n, start, err = read(); err == nil && n == 0 {
		err = fmt.Errorf("start of sink %s not found after recording it", sink)
	}
	return start, err
}

// UndeliveredStatements returns up to limit closed statements, closed at
// or after from, that sink has not delivered (MarkDelivered), oldest close
// first: every revision of a tenant's period (the close's and each
// reissue, each the first row stored of it, as StatementRevisions reads
// them). With after (the last statement of the previous page), the page
// after it in that order: a caller that cannot send the first statements
// still reaches the others.
func (s *Store) UndeliveredStatements(ctx context.Context, sink string, from time.Time, after *billing.StoredStatement, limit int) ([]billing.StoredStatement, error) {
	var (
		out      []billing.StoredStatement
		st       billing.StoredStatement
		content  string
		revision uint32
	)
	since := max(from.Unix(), 0) // a zero from: since ever
	// No cursor: after the epoch, which every close is.
	var cur billing.StoredStatement
	if after != nil {
		cur = *after
	}
	curAt := max(cur.ClosedAt.Unix(), 0)
	curRevision := uint32(max(cur.Revision, 0))
	args := []any{since, curAt, curAt, cur.Tenant, cur.Tenant, cur.Period, cur.Period, curRevision, sink, limit}
	var found uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM ("+undeliveredKeysSQL+")", args...).Scan(&found); err != nil {
		return nil, fmt.Errorf("query undelivered statements: %w", classify(err))
	}
	if found == 0 {
		return nil, nil // the usual answer, without reading any content
	}
	err := s.each(ctx, "undelivered statements", undeliveredSQL, args,
		[]any{&st.Tenant, &st.Period, &revision, &st.Hash, &content, &st.ClosedAt}, func() error {
			// Two identical rows (a retried insert) are one statement.
			if n := len(out); n > 0 && out[n-1].Tenant == st.Tenant && out[n-1].Period == st.Period && out[n-1].Revision == int(revision) {
				return nil
			}
			row := st
			row.Revision, row.Content, row.ClosedAt = int(revision), []byte(content), st.ClosedAt.UTC()
			out = append(out, row)
			return nil
		})
	return out, err
}

// MarkDelivered records that sink delivered sts at at.
func (s *Store) MarkDelivered(ctx context.Context, sink string, sts []billing.StoredStatement, at time.Time) error {
	if len(sts) == 0 {
		return nil
	}
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO statement_deliveries (sink, tenant_id, period, hash, delivered_at)")
	if err != nil {
		return fmt.Errorf("record deliveries of sink %s: %w", sink, classify(err))
	}
	for _, st := range sts {
		if err := batch.Append(sink, st.Tenant, st.Period, st.Hash, at.UTC().Truncate(time.Second)); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("record deliveries of sink %s: %w", sink, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("record deliveries of sink %s: %w", sink, classify(err))
	}
	return nil
}

// StatementDeadLetter is a statement whose event a sink gave up sending
// (MarkDeadLettered).
type StatementDeadLetter struct {
	Sink, Tenant, Period string
	Revision             int
	Hash                 string
	// Attempts is how many times in a row the sink failed for good;
	// Reason the last failure.
	Attempts int
	Reason   string
	At       time.Time
}

// deadLetterReasonMax bounds a dead letter's stored reason (bytes).
const deadLetterReasonMax = 1000

// MarkDeadLettered records that sink gave up sending st's event at at,
// after attempts failures for reason. It does not mark st delivered: the
// next meterd, or a redeliver, tries it again.
func (s *Store) MarkDeadLettered(ctx context.Context, sink string, st billing.StoredStatement, attempts int, reason string, at time.Time) error {
	if len(reason) > deadLetterReasonMax {
		reason = strings.ToValidUTF8(reason[:deadLetterReasonMax], "")
	}
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO statement_dead_letters (sink, tenant_id, period, revision, hash, attempts, reason, dead_at)")
	if err != nil {
		return fmt.Errorf("record dead letter of sink %s: %w", sink, classify(err))
	}
	if err := batch.Append(sink, st.Tenant, st.Period, uint32(max(st.Revision, 0)), st.Hash, uint32(max(attempts, 0)), reason, at.UTC().Truncate(time.Second)); err != nil {
		_ = batch.Abort()
		return fmt.Errorf("record dead letter of sink %s: %w", sink, err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("record dead letter of sink %s: %w", sink, classify(err))
	}
	return nil
}

// statementDeadLettersSQL lists a sink's dead letters whose statement it has not
// delivered since, newest first.
const statementDeadLettersSQL = `SELECT tenant_id, period, revision, hash, attempts, reason, dead_at FROM statement_dead_letters
WHERE sink = ? AND (tenant_id, period, hash) NOT IN (SELECT tenant_id, period, hash FROM statement_deliveries WHERE sink = ?)
ORDER BY dead_at DESC, tenant_id, period, revision`

// StatementDeadLetters returns sink's dead letters (MarkDeadLettered) of
// the statements it has not delivered since, newest first: a statement
// given up on by several meterd, or again after a restart, has a row for
// each.
func (s *Store) StatementDeadLetters(ctx context.Context, sink string) ([]StatementDeadLetter, error) {
	var (
		out                []StatementDeadLetter
		d                  StatementDeadLetter
		revision, attempts uint32
	)
	err := s.each(ctx, "statement dead letters", statementDeadLettersSQL, []any{sink, sink},
		[]any{&d.Tenant, &d.Period, &revision, &d.Hash, &attempts, &d.Reason, &d.At}, func() error {
			row := d
			row.Sink, row.Revision, row.Attempts, row.At = sink, int(revision), int(attempts), d.At.UTC()
			out = append(out, row)
			return nil
		})
	return out, err
}
