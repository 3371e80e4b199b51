package chstore

import "context"

// Exec runs a statement on the store's database, for tests that change
// what the store sees.
func (s *Store) Exec(ctx context.Context, stmt string) error { return s.conn.Exec(ctx, stmt) }
