package chstore

// IdleInserts is the number of prepared ingest batches the store keeps
// idle (insert.go).
func (s *Store) IdleInserts() int { return s.inserts.idleCount() }

// ForgetInserts forgets the store's prepared batches, as a migration does.
func (s *Store) ForgetInserts() { s.inserts.forget() }

// AfterInsertSend sets f to run after each ingest INSERT's Send, before
// its batch is kept or dropped (nil: nothing).
func (s *Store) AfterInsertSend(f func()) { s.inserts.afterSend = f }

// LabelBlockCap is the capacity of the batch's block of labels.
func (b *EventBatch) LabelBlockCap() int { return cap(b.labels) }

// SetMaxReusedRows sets the most rows a prepared batch may have sent and
// be kept (0: maxReusedRows).
func (s *Store) SetMaxReusedRows(n int) { s.inserts.maxRows = n }
