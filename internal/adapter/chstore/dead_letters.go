package chstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"tokenmeter/ingest/sink"
)

// deadLetterColumns is the explicit column list of every insert into dead_letters.
var deadLetterColumns = []string{
	"source_topic", "source_partition", "source_offset", "reason_code", "reason",
	"original_size", "original_sha256", "record_key", "payload", "payload_truncated",
	"dlq_error", "recorded_at",
}

// InsertDeadLetters implements ingest.DeadLetterWriter: it writes the dead
// letters in one INSERT. An empty slice is a no-op.
func (s *Store) InsertDeadLetters(ctx context.Context, dead []sink.DeadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	return s.sendRows(ctx, "insert dead letters", "dead_letters", deadLetterColumns, len(dead), func(i int) []any {
		d := &dead[i]
		return []any{
			d.SourceTopic, d.SourcePartition, d.SourceOffset, d.ReasonCode, d.Reason,
			d.OriginalSize, d.OriginalSHA256, string(d.Key), string(d.Payload), boolByte(d.Truncated),
			d.DLQError, d.RecordedAt.UTC().Truncate(time.Second),
		}
	})
}

// deadLettersSQL reads the dead letters of one source topic, one row per
// source record (the latest recorded), in source order.
var deadLettersSQL = "SELECT " + strings.Join(deadLetterColumns, ", ") + ` FROM dead_letters FINAL
WHERE source_topic = ?
ORDER BY source_partition, source_offset
LIMIT ?`

// DeadLetters returns up to limit dead letters recorded for records of topic,
// in partition and offset order.
func (s *Store) DeadLetters(ctx context.Context, topic string, limit int) ([]sink.DeadLetter, error) {
	rows, err := s.conn.Query(ctx, deadLettersSQL, topic, limit)
	if err != nil {
		return nil, fmt.Errorf("read dead letters: %w", classify(err))
	}
	defer rows.Close()
	var out []sink.DeadLetter
	for rows.Next() {
		var d sink.DeadLetter
		var key, payload string
		var truncated uint8
		if err := rows.Scan(&d.SourceTopic, &d.SourcePartition, &d.SourceOffset, &d.ReasonCode, &d.Reason,
			&d.OriginalSize, &d.OriginalSHA256, &key, &payload, &truncated, &d.DLQError, &d.RecordedAt); err != nil {
			return nil, fmt.Errorf("scan dead letters: %w", err)
		}
		d.Key, d.Payload, d.Truncated = []byte(key), []byte(payload), truncated == 1
		d.RecordedAt = d.RecordedAt.UTC()
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read dead letters: %w", classify(err))
	}
	return out, nil
}
