package chstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The ingest inserts (events, their ids, GPU and engine samples) send one
// columnar INSERT per batch, thousands a minute. A batch that clickhouse-go
// prepares per INSERT builds its columns from empty buffers each time:
// measured at 20,000 events a batch, 3.4 KB allocated per event (the
// strings' bytes and offsets grown by doubling, column by column) and a
// quarter of meterd's CPU per event in the insert (BenchmarkInsertEvents).
//
// So each statement keeps prepared batches whose block, clickhouse-go's
// column buffers, serves one INSERT after another: a batch prepared with
// driver.WithReleaseConnection holds no connection between INSERTs, and
// each Send takes a connection from the pool, sends the statement, then
// the block, and ends the INSERT (clickhouse-go's TestBatchReleaseConnection
// holds that a second Send sends the block again). Before each INSERT the
// columns are reset, which keeps their memory, and filled from the batch's
// slices, one append of a whole slice per column.
//
// A batch whose INSERT failed is dropped rather than reused: the next
// prepares a new one, with the columns the server names then. So is one
// whose context was done when Send returned (clickhouse-go's watchdog of
// that context may still close the connection the batch holds at that
// moment, which would be the next INSERT's), and one holding more than
// maxReusedRows rows (its buffers would keep that memory for good).
//
// A migration run by this process forgets every prepared batch (apply):
// the idle ones at once, and those out in an INSERT at that moment when
// they come back (the cache's generation). A migration run by another
// process (another replica, meterd migrate) is not seen here: a batch is
// re-prepared once it is maxInsertAge old, and until then an INSERT whose
// block no longer fits the table fails once and is retried with a new one.

// maxIdleInserts is how many prepared batches of a statement are kept
// between INSERTs: one per writer inserting at once. More writers prepare
// more, and the extra are dropped after use.
const maxIdleInserts = 4

// maxReusedRows is the most rows a batch may have sent and be kept: more
// than twice meterd's default --batch-size (100,000). A larger INSERT (a
// replay with a larger batch size) prepares its own and drops it.
const maxReusedRows = 1 << 18

// maxInsertAge is how long a prepared batch is used, so that one prepared
// before another process's migration is re-prepared within that time.
const maxInsertAge = 5 * time.Minute

// insertCache holds the prepared batches of each statement. The zero value
// is empty and ready.
type insertCache struct {
	mu   sync.Mutex
	idle map[string][]*reusedInsert
	// gen counts forget calls: a batch prepared before the last is not
	// kept (put).
	gen uint64
	// afterSend, when set (by tests), runs after each Send, before the
	// batch is kept or dropped; maxRows, when set, replaces maxReusedRows.
	afterSend func()
	maxRows   int
}

// reusedInsert is a batch prepared once and sent again for each INSERT.
type reusedInsert struct {
	batch driver.Batch
	cols  []column.Interface
	// ctx is the context the batch was prepared with: the batch keeps it
	// and uses it in each Send (the connection, the statement's settings,
	// the deadline, cancellation), so it stands for the context of the
	// INSERT in progress.
	ctx *callContext
	// gen is the cache's generation when the batch was prepared, and
	// prepared the time.
	gen      uint64
	prepared time.Time
}

// take returns an idle prepared batch of insert, or prepares one with ctx.
func (c *insertCache) take(ctx context.Context, conn driver.Conn, insert string, columns int) (*reusedInsert, error) {
	now := time.Now()
	c.mu.Lock()
	for idle := c.idle[insert]; len(idle) > 0; idle = c.idle[insert] {
		ri := idle[len(idle)-1]
		idle[len(idle)-1] = nil
		c.idle[insert] = idle[:len(idle)-1]
		if now.Sub(ri.prepared) < maxInsertAge {
			c.mu.Unlock()
			return ri, nil
		}
	}
	gen := c.gen
	c.mu.Unlock()
	cc := newCallContext()
	cc.set(ctx)
	defer cc.set(nil)
	batch, err := conn.PrepareBatch(cc, insert, driver.WithReleaseConnection())
	if err != nil {
		return nil, err
	}
	cols := batch.Columns()
	if len(cols) != columns {
		_ = batch.Abort()
		return nil, fmt.Errorf("the server's block has %d columns, the statement %d", len(cols), columns)
	}
	return &reusedInsert{batch: batch, cols: cols, ctx: cc, gen: gen, prepared: now}, nil
}

// put keeps ri for the next INSERT of insert, unless enough are kept, it
// was prepared before the last forget, or it holds more than
// maxReusedRows rows.
func (c *insertCache) put(insert string, ri *reusedInsert) {
	c.mu.Lock()
	defer c.mu.Unlock()
	maxRows := maxReusedRows
	if c.maxRows > 0 {
		maxRows = c.maxRows
	}
	if ri.gen != c.gen || ri.cols[0].Rows() > maxRows {
		return
	}
	if c.idle == nil {
		c.idle = make(map[string][]*reusedInsert)
	}
	if len(c.idle[insert]) < maxIdleInserts {
		c.idle[insert] = append(c.idle[insert], ri)
	}
}

// forget drops every prepared batch (after a schema change): the idle ones
// now, those in use when they are put back.
func (c *insertCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle = nil
	c.gen++
}

// idleCount is the number of idle prepared batches of all statements.
func (c *insertCache) idleCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, idle := range c.idle {
		n += len(idle)
	}
	return n
}

// sendColumns sends one columnar INSERT of cols, whose values are slices
// (one per column of names, in order), through a prepared batch of insert.
func (s *Store) sendColumns(ctx context.Context, what, insert string, names []string, cols []any) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ri, err := s.inserts.take(ctx, s.conn, insert, len(names))
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	if err := ri.fill(names, cols); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	ri.ctx.set(ctx)
	err = ri.batch.Send()
	ri.ctx.set(nil)
	if s.inserts.afterSend != nil {
		s.inserts.afterSend()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	// A batch whose context is done by now is not kept: the context's
	// watchdog may yet close the connection it holds (see above).
	if ctx.Err() == nil {
		s.inserts.put(insert, ri)
	}
	return nil
}

// fill resets the batch's columns and appends cols to them.
func (ri *reusedInsert) fill(names []string, cols []any) error {
	if len(cols) != len(ri.cols) {
		return fmt.Errorf("%d columns for a block of %d", len(cols), len(ri.cols))
	}
	for _, col := range ri.cols {
		col.Reset()
	}
	for i, values := range cols {
		if err := appendColumn(blockColumn{ri.cols[i]}, values); err != nil {
			return fmt.Errorf("column %s: %w", names[i], err)
		}
	}
	rows := ri.cols[0].Rows()
	for i, col := range ri.cols {
		if col.Rows() != rows {
			return fmt.Errorf("column %s has %d rows, column %s %d", names[i], col.Rows(), names[0], rows)
		}
	}
	return nil
}

// blockColumn appends to a column of a block as driver.BatchColumn does.
type blockColumn struct{ col column.Interface }

func (c blockColumn) Append(v any) error {
	_, err := c.col.Append(v)
	return err
}

func (c blockColumn) AppendRow(v any) error { return c.col.AppendRow(v) }

// callContext is a context.Context that stands for another, set for each
// call and cleared after it: a prepared batch keeps the context it was
// prepared with and uses it in every Send. Cleared, it is never done.
type callContext struct {
	cur atomic.Pointer[context.Context]
}

func newCallContext() *callContext { return &callContext{} }

func (c *callContext) set(ctx context.Context) {
	if ctx == nil {
		c.cur.Store(nil)
		return
	}
	c.cur.Store(&ctx)
}

func (c *callContext) get() context.Context {
	if p := c.cur.Load(); p != nil {
		return *p
	}
	return context.Background()
}

func (c *callContext) Deadline() (time.Time, bool) { return c.get().Deadline() }
func (c *callContext) Done() <-chan struct{}       { return c.get().Done() }
func (c *callContext) Err() error                  { return c.get().Err() }
func (c *callContext) Value(key any) any           { return c.get().Value(key) }
