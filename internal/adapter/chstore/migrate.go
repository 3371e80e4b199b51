package chstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one versioned schema change.
type Migration struct {
	Version    int
	Name       string
	Statements []string
}

// Migrations returns the embedded migrations in version order. A file is named
// NNNN_name.sql and holds one or more statements separated by ";" at a line end.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migration %s: version %d already used by %s", name, v, prev)
		}
		seen[v] = name
		body, err := migrationFS.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		stmts := splitStatements(string(body))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("migration %s: no statements", name)
		}
		out = append(out, Migration{Version: v, Name: rest, Statements: stmts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// splitStatements splits SQL text on semicolons that end a line, dropping
// comment-only lines. Migrations must not put ";" at a line end inside strings.
func splitStatements(sql string) []string {
	var stmts []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
			stmts = append(stmts, stmt)
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		stmts = append(stmts, s)
	}
	return stmts
}

// schemaMigrationsDDL creates the table of applied migrations.
const schemaMigrationsDDL = `CREATE TABLE IF NOT EXISTS schema_migrations
(
    version    UInt32,
    name       String,
    applied_at DateTime
)
ENGINE = MergeTree
ORDER BY version`

// Migrate creates the database if needed and applies every embedded migration
// not yet recorded in schema_migrations. It is idempotent: statements use
// IF NOT EXISTS, and applied versions are recorded, so concurrent or repeated
// runs converge on the same schema (a column added already counts as
// added). It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	if err := s.ensureDatabase(ctx); err != nil {
		return nil, err
	}
	ddl, err := s.statements(0, schemaMigrationsDDL)
	if err != nil {
		return nil, err
	}
	exists, err := s.tableExists(ctx, "schema_migrations")
	if err != nil {
		return nil, err
	}
	if s.cfg.Cluster == "" || !exists {
		for _, stmt := range ddl {
			if err := s.conn.Exec(ctx, stmt); err != nil {
				return nil, fmt.Errorf("create schema_migrations: %w", err)
			}
		}
	}
	if s.cfg.Cluster != "" {
		// schema_migrations is a replicated table read on this server,
		// which may not have fetched what another meterd recorded through
		// another server: a migration read as not applied would run again
		// (and 0004 drops gpu_samples). Fetch everything first.
		if err := s.conn.Exec(ctx, "SYSTEM SYNC REPLICA "+s.cfg.Database+".schema_migrations"); err != nil {
			return nil, fmt.Errorf("sync schema_migrations: %w", err)
		}
	}
	applied, err := s.AppliedMigrations(ctx)
	if err != nil {
		return nil, err
	}
	var done []int
	for _, m := range migs {
		if applied[m.Version] {
			continue
		}
		elsewhere, err := s.applyOnce(ctx, m)
		if err != nil {
			return done, err
		}
		if elsewhere {
			continue
		}
		if err := s.insertRow(ctx, "INSERT INTO schema_migrations (version, name, applied_at)", uint32(m.Version), m.Name, time.Now().UTC().Truncate(time.Second)); err != nil {
			return done, fmt.Errorf("record migration %d: %w", m.Version, err)
		}
		s.logger.Info("applied migration", "version", m.Version, "name", m.Name)
		done = append(done, m.Version)
	}
	return done, nil
}

// applyOnce applies m. When that fails because another meterd migrating
// at the same time applied and recorded m meanwhile, and went on to a
// later migration that removed what this run still reads (0013 drops the
// table 0012 copies from), the other's record is what counts: elsewhere is
// true and the error is dropped.
//
// In cluster mode a failure is retried twice, a second and then two
// apart: two meterd migrating at once race on ON CLUSTER DDL (one's
// DROP of a table an earlier migration made, seen on its own server
// before the other's CREATE of the new form reached it, drops that new
// form everywhere, and the other's next statement finds no table; seen in
// make test under load). Every statement is idempotent (IF NOT EXISTS, a
// drop only of an older form), so a run again converges.
func (s *Store) applyOnce(ctx context.Context, m Migration) (elsewhere bool, err error) {
	for attempt := 0; ; attempt++ {
		err = s.apply(ctx, m)
		if err == nil {
			return false, nil
		}
		if recorded, cerr := s.recordedElsewhere(ctx, m.Version); cerr == nil && recorded {
			s.logger.Info("migration applied by another meterd meanwhile", "version", m.Version, "error here", err)
			return true, nil
		}
		if s.cfg.Cluster == "" || attempt == 2 {
			return false, err
		}
		s.logger.Warn("migration failed; applying it again", "version", m.Version, "attempt", attempt+1, "error", err)
		select {
		case <-ctx.Done():
			return false, err
		case <-time.After(time.Duration(attempt+1) * time.Second):
		}
	}
}

// recordedElsewhere reports whether schema_migrations records version,
// written by another meterd (in cluster mode, once this server has fetched
// every record).
func (s *Store) recordedElsewhere(ctx context.Context, version int) (bool, error) {
	if s.cfg.Cluster != "" {
		if err := s.conn.Exec(ctx, "SYSTEM SYNC REPLICA "+s.cfg.Database+".schema_migrations"); err != nil {
			return false, err
		}
	}
	applied, err := s.AppliedMigrations(ctx)
	return applied[version], err
}

// apply runs the statements of migration m in the store's mode.
func (s *Store) apply(ctx context.Context, m Migration) error {
	// A prepared insert names the columns of the table as it was.
	defer s.inserts.forget()
	stmts, err := s.statements(m.Version, m.Statements...)
	if err != nil {
		return err
	}
	for i, stmt := range stmts {
		exec := s.conn.Exec
		switch {
		case strings.HasPrefix(stmt, eachShard):
			exec = s.onEachShard
		case strings.HasPrefix(stmt, dropOlder):
			exec = func(ctx context.Context, stmt string, _ ...any) error { return s.dropOlder(ctx, m.Version, stmt) }
		}
		if err := exec(ctx, stmt); err != nil && !addedBefore(stmt, err) {
			return fmt.Errorf("migration %04d_%s statement %d: %w", m.Version, m.Name, i+1, err)
		}
	}
	return nil
}

// tableExists reports whether the store's database has table name on the
// server the store talks to.
func (s *Store) tableExists(ctx context.Context, name string) (bool, error) {
	var n uint64
	if err := s.conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", s.cfg.Database, name).Scan(&n); err != nil {
		return false, fmt.Errorf("look up table %s: %w", name, err)
	}
	return n > 0, nil
}

// statements returns the statements that apply stmts, of migration
// version, in the store's mode: as written on a single node, translated
// in cluster mode (cluster.go), with the Distributed tables whose local
// tables they alter created again at the end.
func (s *Store) statements(version int, stmts ...string) ([]string, error) {
	if s.cfg.Cluster == "" {
		return stmts, nil
	}
	c := clusterSchema{cluster: s.cfg.Cluster, db: s.cfg.Database}
	var out, redo []string
	for _, stmt := range stmts {
		t, r, err := c.translate(version, stmt)
		if err != nil {
			return nil, err
		}
		out = append(out, t...)
		for _, name := range r {
			if !slices.Contains(redo, name) {
				redo = append(redo, name)
			}
		}
	}
	for _, name := range redo {
		out = append(out, c.redistribute(name)...)
	}
	return out, nil
}

// addedBefore reports whether err says that the column stmt adds exists
// already: ClickHouse has no ADD COLUMN IF NOT EXISTS before 19.x, and a run
// that stopped (or a replica that ran at the same time) may have added it.
func addedBefore(stmt string, err error) bool {
	var ex *clickhouse.Exception
	return errors.As(err, &ex) && (ex.Code == 15 || ex.Code == 44) && strings.Contains(ex.Message, "already exists") &&
		strings.Contains(strings.ToUpper(stmt), "ADD COLUMN")
}

// AppliedMigrations returns the set of recorded migration versions.
func (s *Store) AppliedMigrations(ctx context.Context) (map[int]bool, error) {
	rows, err := s.conn.Query(ctx, "SELECT DISTINCT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int]bool{}
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read schema_migrations: %w", err)
		}
		applied[int(v)] = true
	}
	return applied, rows.Err()
}
