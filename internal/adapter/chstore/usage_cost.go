package chstore

import (
	"cmp"
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"time"

	"tokenmeter/query"
)

// The hourly usage-and-cost export reads cost_hour's rows as they are
// stored (no GROUP BY: an hour's computation writes one row per tenant,
// deployment and model), a chunk of whole hours at a time, and sorts and
// sums them here. ClickHouse 18.16's sorted GROUP BY of a chunk (three
// String keys, groupUniqArray of the price version) was most of its CPU
// for the export, and its one-block answer made a chunk's rows arrive at
// once. A chunk's rows are held compactly (strings as ids of a table of
// names per column), and the next chunk is read while the last one is
// streamed.

// usageCostLine is one row of cost_hour as the export reads it.
type usageCostLine struct {
	b                                  uint32 // the step's start, Unix seconds
	tenant, model, deployment, version uint32 // ids in the chunk's names
	requests, input, cached, output    uint64
	unpriced                           uint64 // requests of rows without a list price
	list, cost, busy                   int64
}

// usageCostChunk is a chunk's lines, sorted and summed: lines[i] for i in
// order, each the first of its key with the sums of the others.
type usageCostChunk struct {
	lines []usageCostLine
	keys  []uint64
	order []int32
	// versions holds, for a summed line whose rows had several price
	// versions, the ids of the others (key: its index in lines).
	versions map[int32][]uint32
	// The names' tables as of this chunk (append-only: later chunks add).
	tenants, models, deployments, priceVersions []string
	err                                         error
}

// usageNames interns one column's strings: each distinct value gets an id;
// rank orders the ids as the values sort.
type usageNames struct {
	ids    map[string]uint32
	names  []string
	last   string // the value of the last id looked up, and its id
	lastID uint32
	rank   []uint32
	ranked int // names ranked so far
}

func newUsageNames() *usageNames { return &usageNames{ids: map[string]uint32{}} }

func (n *usageNames) id(s string) uint32 {
	// Rows come in the table's order (tenant, hour, deployment, model): a
	// tenant's or a version's value mostly repeats the last row's.
	if s == n.last && len(n.names) > 0 {
		return n.lastID
	}
	id, ok := n.ids[s]
	if !ok {
		id = uint32(len(n.names))
		n.ids[s] = id
		n.names = append(n.names, s)
	}
	n.last, n.lastID = s, id
	return id
}

// ranks brings rank up to date with the names.
func (n *usageNames) ranks() []uint32 {
	if n.ranked == len(n.names) {
		return n.rank
	}
	byValue := make([]uint32, len(n.names))
	for i := range byValue {
		byValue[i] = uint32(i)
	}
	slices.SortFunc(byValue, func(a, b uint32) int { return strings.Compare(n.names[a], n.names[b]) })
	n.rank = slices.Grow(n.rank[:0], len(n.names))[:len(n.names)]
	for r, id := range byValue {
		n.rank[id] = uint32(r)
	}
	n.ranked = len(n.names)
	return n.rank
}

// usageCostNames are the names' tables of a read, one per column.
type usageCostNames struct {
	tenants, models, deployments, versions *usageNames
}

// usageCostRowsSQL reads the rows of cost_hour of a normalized cost query's
// range, as stored, of the newest computation of each hour.
func usageCostRowsSQL(q query.CostQuery) (string, []any) {
	b, i := q.Policies()
	bucket, args := stepExpr("hour", q.StepSeconds(), q.Start)
	where, whereArgs := scope("hour", q.Start, q.End, q.TenantID)
	from, fromArgs := newestRows("cost_hour", "hour", where, whereArgs, "")
	return fmt.Sprintf(`SELECT %s AS b, tenant_id, model, deployment,
  requests, input_tokens, cached_input_tokens, output_tokens, list_charge, list_priced, %s, %s, price_version
FROM %s`, bucket, allocationColumns[b][i], busyColumns[b], from), append(args, fromArgs...)
}

// readUsageCostChunk reads the rows of cq's range (about rows of them, at
// most) into c, its buffers reused, then sorts them in (step, tenant,
// model, deployment) order and sums the rows of each.
func (s *Store) readUsageCostChunk(ctx context.Context, cq query.CostQuery, rows uint64, n *usageCostNames, c *usageCostChunk) error {
	c.lines = slices.Grow(c.lines[:0], int(min(rows, 1<<26)))
	clear(c.versions)
	var (
		l                                  usageCostLine
		tenant, model, deployment, version string
		requests                           uint64
		listPriced                         uint8
	)
	stmt, args := usageCostRowsSQL(cq)
	dest := []any{&l.b, &tenant, &model, &deployment, &requests, &l.input, &l.cached, &l.output,
		&l.list, &listPriced, &l.cost, &l.busy, &version}
	err := s.each(ctx, "usage and cost", stmt, args, dest, func() error {
		l.tenant, l.model, l.deployment = n.tenants.id(tenant), n.models.id(model), n.deployments.id(deployment)
		l.version = n.versions.id(version)
		l.requests, l.unpriced = requests, 0
		if listPriced == 0 {
			l.unpriced = requests
		}
		c.lines = append(c.lines, l)
		return nil
	})
	if err != nil {
		return err
	}
	c.sort(n)
	c.tenants, c.models, c.deployments, c.priceVersions = n.tenants.names, n.models.names, n.deployments.names, n.versions.names
	return nil
}

// usageCostKeyBits is the width of the sort's packed keys (a test narrows
// it to sort by comparing fields).
var usageCostKeyBits = 64

// sort orders c's lines by (step, tenant, model, deployment) into c.order
// and sums the lines of each key into its first.
func (c *usageCostChunk) sort(n *usageCostNames) {
	lines := c.lines
	c.order = c.order[:0]
	if len(lines) == 0 {
		return
	}
	tr, mr, dr := n.tenants.ranks(), n.models.ranks(), n.deployments.ranks()
	minB, maxB := lines[0].b, lines[0].b
	for i := range lines {
		minB, maxB = min(minB, lines[i].b), max(maxB, lines[i].b)
	}
	// The key packs the step (from the chunk's first), the ranks and the
	// line's index into one uint64 where they fit (they do unless a chunk
	// holds millions of names): sorting integers is several times faster
	// than comparing the fields.
	bb, tb, mb, db := bits.Len32(maxB-minB), bits.Len(uint(len(tr))), bits.Len(uint(len(mr))), bits.Len(uint(len(dr)))
	ib := bits.Len(uint(len(lines)))
	if bb+tb+mb+db+ib <= usageCostKeyBits {
		c.keys = slices.Grow(c.keys[:0], len(lines))[:len(lines)]
		for i := range lines {
			l := &lines[i]
			k := uint64(l.b - minB)
			k = k<<tb | uint64(tr[l.tenant])
			k = k<<mb | uint64(mr[l.model])
			k = k<<db | uint64(dr[l.deployment])
			c.keys[i] = k<<ib | uint64(i)
		}
		slices.Sort(c.keys)
		mask := uint64(1)<<ib - 1
		for _, k := range c.keys {
			c.order = append(c.order, int32(k&mask))
		}
	} else {
		for i := range lines {
			c.order = append(c.order, int32(i))
		}
		slices.SortFunc(c.order, func(i, j int32) int {
			a, b := &lines[i], &lines[j]
			if d := cmp.Compare(a.b, b.b); d != 0 {
				return d
			}
			if d := cmp.Compare(tr[a.tenant], tr[b.tenant]); d != 0 {
				return d
			}
			if d := cmp.Compare(mr[a.model], mr[b.model]); d != 0 {
				return d
			}
			return cmp.Compare(dr[a.deployment], dr[b.deployment])
		})
	}
	// Sum the lines of each key into its first.
	out := c.order[:0]
	for k := 0; k < len(c.order); {
		first := c.order[k]
		f := &lines[first]
		k++
		for ; k < len(c.order); k++ {
			o := &lines[c.order[k]]
			if o.b != f.b || o.tenant != f.tenant || o.model != f.model || o.deployment != f.deployment {
				break
			}
			f.requests += o.requests
			f.input += o.input
			f.cached += o.cached
			f.output += o.output
			f.unpriced += o.unpriced
			f.list += o.list
			f.cost += o.cost
			f.busy += o.busy
			if o.version != f.version && !slices.Contains(c.versions[first], o.version) {
				if c.versions == nil {
					c.versions = map[int32][]uint32{}
				}
				c.versions[first] = append(c.versions[first], o.version)
			}
		}
		out = append(out, first)
	}
	c.order = out
}

// emit streams c's rows to row, r reused.
func (c *usageCostChunk) emit(r *query.UsageCostRow, row func(r *query.UsageCostRow) error) error {
	var (
		lastB uint32
		start time.Time
	)
	for _, i := range c.order {
		l := &c.lines[i]
		if l.b != lastB || start.IsZero() {
			lastB, start = l.b, time.Unix(int64(l.b), 0).UTC()
		}
		r.Start = start
		r.Tenant, r.Model, r.Deployment = c.tenants[l.tenant], c.models[l.model], c.deployments[l.deployment]
		r.Requests, r.InputTokens, r.CachedInputTokens, r.OutputTokens = l.requests, l.input, l.cached, l.output
		r.ListCharge, r.ListUnpricedRequests, r.CostNanos, r.BusyNanos = l.list, l.unpriced, l.cost, l.busy
		// The price versions as one value: one, unless the rows summed into
		// this one were priced with several.
		r.PriceVersions = append(r.PriceVersions[:0], c.priceVersions[l.version])
		if more, ok := c.versions[i]; ok {
			for _, v := range more {
				r.PriceVersions = append(r.PriceVersions, c.priceVersions[v])
			}
			slices.Sort(r.PriceVersions)
		}
		if err := row(r); err != nil {
			return err
		}
	}
	return nil
}

// eachUsageCostRows streams the rows of the ranges chunks of q, reading
// each chunk while the last one is streamed.
func (s *Store) eachUsageCostRows(ctx context.Context, q query.CostQuery, chunks []usageCostRange, row func(r *query.UsageCostRow) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	read := make(chan *usageCostChunk, 1) // chunks read, in order
	free := make(chan *usageCostChunk, 2) // buffers to read into
	free <- &usageCostChunk{}
	free <- &usageCostChunk{}
	go func() {
		defer close(read)
		names := &usageCostNames{newUsageNames(), newUsageNames(), newUsageNames(), newUsageNames()}
		for _, ch := range chunks {
			var c *usageCostChunk
			select {
			case c = <-free:
			case <-ctx.Done():
				return
			}
			cq := q
			cq.Start, cq.End = ch.start, ch.end
			c.err = s.readUsageCostChunk(ctx, cq, ch.rows, names, c)
			read <- c
			if c.err != nil {
				return
			}
		}
	}()
	var r query.UsageCostRow
	for c := range read {
		if c.err != nil {
			return c.err
		}
		if err := c.emit(&r, row); err != nil {
			cancel()
			for range read { // the reader stops at its next chunk
			}
			return err
		}
		free <- c
	}
	return ctx.Err()
}
