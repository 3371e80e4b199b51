package ingest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
)

// DefaultStallTimeout is ConsumerConfig.StallTimeout's default: longer
// than a rebalance that waits out a dead member's session (30 s) and a
// slow batch, short enough that a wedged replica does not hold its
// tenants' metering back for long.
const DefaultStallTimeout = 2 * time.Minute

// errReaderRetired is the commit error of a batch whose reader the
// watchdog replaced: its offsets stay uncommitted and the records are
// redelivered (and deduplicated) to whoever holds the partition now.
var errReaderRetired = errors.New("reader replaced by a re-join; offsets left for redelivery")

// groupReader is one incarnation of the consumer's group member.
type groupReader struct {
	*kafka.Reader
	// clientID names this incarnation in the group (DescribeGroups), so
	// the watchdog can tell the partitions it holds.
	clientID string
	// retired ends when the reader is replaced: commits through it stop.
	retired context.Context
	retire  context.CancelFunc
}

// readerSeq numbers the readers of the process, for unique client IDs.
var readerSeq atomic.Int64

// newReader starts a new member of the consumer group.
func (c *Consumer) newReader() *groupReader {
	host, _ := os.Hostname()
	id := fmt.Sprintf("tokenmeter-%s-%d-%d", host, os.Getpid(), readerSeq.Add(1))
	cfg := c.readerCfg
	d := kafka.Dialer{Timeout: 10 * time.Second, DualStack: true} // kafka-go's default dialer
	if cfg.Dialer != nil {
		d = *cfg.Dialer
	}
	d.ClientID = id
	cfg.Dialer = &d
	r := &groupReader{Reader: kafka.NewReader(cfg), clientID: id}
	r.retired, r.retire = context.WithCancel(context.Background())
	c.wd.clientID.Store(id)
	return r
}

// commit commits msgs' offsets through the reader that fetched them; once
// that reader is retired it commits nothing.
func (r *groupReader) commit(ctx context.Context, msgs []kafka.Message) error {
	if r.retired.Err() != nil {
		return errReaderRetired
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.retired, cancel)()
	err := r.CommitMessages(ctx, msgs...)
	if err != nil && r.retired.Err() != nil {
		return errReaderRetired
	}
	return err
}

// rejoin replaces the reader: the old member leaves the group (its
// partitions go back to the group, from their committed offsets) and a
// new one joins. The fetch loop calls it with no batch in hand; batches
// the writer still holds are inserted, and their offsets, which only the
// old member could commit, are left for redelivery.
func (c *Consumer) rejoin() {
	old := c.reader
	old.retire()
	// Closed aside: kafka-go's Close waits for the reader's goroutines,
	// and a reader wedged inside kafka-go may never let it return; the
	// fetch loop must not wait for it. (Retired, it commits nothing.)
	go func() {
		done := make(chan error, 1)
		go func() { done <- old.Close() }()
		select {
		case err := <-done:
			if err != nil {
				c.logger.Warn("close the stalled reader", "error", err)
			}
		case <-time.After(time.Minute):
			c.logger.Error("the stalled reader did not close within a minute; its member is left to the broker's session timeout", "client_id", old.clientID)
		}
	}()
	c.reader = c.newReader()
	c.wd.metrics.rejoins.Inc()
	c.logger.Warn("re-joined the consumer group with a new reader", "old_client_id", old.clientID, "client_id", c.reader.clientID)
}

// fetch is the fetch loop's FetchMessage; a test's wedge makes a reader
// deliver nothing, as a wedged one would.
func (c *Consumer) fetch(ctx context.Context) (kafka.Message, error) {
	if c.wedge != nil && c.wedge(c.reader.clientID) {
		<-ctx.Done()
		return kafka.Message{}, ctx.Err()
	}
	return c.reader.FetchMessage(ctx)
}

// watchdog notices partitions of the group that have records to consume
// and whose committed offset has not moved for the stall timeout. One the
// consumer itself holds makes it unready and re-join with a new reader
// (while its writes are failing, the stall is theirs, already reported,
// and a re-join would not help). One another member holds is reported in
// the metrics and the log: that member's watchdog re-joins, and the broker
// expires a member that is gone.
type watchdog struct {
	metrics  *watchdogMetrics
	clientID atomic.Value // string: the current reader's

	mu sync.Mutex
	// rejoin ends the fetch loop's fetch context: a request to re-join.
	rejoin context.CancelFunc
	// stalled is the readiness error while partitions this consumer holds
	// stand still; nil otherwise.
	stalled error
	// since is, by partition with lag, its committed offset and since when
	// it has stayed there.
	since map[int]offsetSince
	// stuck are the partitions found stalled while this consumer held
	// them, until they move or have nothing left to consume.
	stuck map[int]int64 // partition -> records to consume
}

type offsetSince struct {
	committed int64
	at        time.Time
}

type watchdogMetrics struct {
	stalled  *prometheus.GaugeVec
	stalls   *prometheus.CounterVec
	rejoins  prometheus.Counter
	checkErr prometheus.Counter
}

// Values of the held_by label of meter_ingest_partition_stalls_total.
const (
	heldBySelf  = "this_replica"
	heldByOther = "other_member"
)

func newWatchdogMetrics(reg prometheus.Registerer) (*watchdogMetrics, error) {
	m := &watchdogMetrics{
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meter_ingest_partition_stalled",
			Help: "1 while the partition has records to consume and the consumer group's committed offset has not moved for the stall timeout (the group's view, the same from every replica: alert on max), else 0.",
		}, []string{"partition"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meter_ingest_partition_stalls_total",
			Help: "Partitions found stalled, by holder: this_replica (it re-joins the group with a new reader) or other_member.",
		}, []string{"held_by"}),
		rejoins: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_consumer_rejoins_total", Help: "Times the consumer replaced its Kafka reader (left and re-joined the group) because partitions it held stood still.",
		}),
		checkErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meter_ingest_stall_check_errors_total", Help: "Stall checks that could not read the group's offsets or members.",
		}),
	}
	for _, c := range []prometheus.Collector{m.stalled, m.stalls, m.rejoins, m.checkErr} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.stalls.WithLabelValues(heldBySelf)
	m.stalls.WithLabelValues(heldByOther)
	return m, nil
}

// Stalled is non-nil while partitions this consumer holds have had records
// to consume and no progress for the stall timeout; it says which. The
// consumer re-joins the group by itself; readiness reports it meanwhile.
func (c *Consumer) Stalled() error {
	c.wd.mu.Lock()
	defer c.wd.mu.Unlock()
	return c.wd.stalled
}

// armRejoin returns the fetch loop's fetch context, which the watchdog
// ends to ask for a re-join, and its cancel.
func (c *Consumer) armRejoin(ctx context.Context) (context.Context, context.CancelFunc) {
	fctx, cancel := context.WithCancel(ctx)
	c.wd.mu.Lock()
	c.wd.rejoin = cancel
	c.wd.mu.Unlock()
	return fctx, cancel
}

// watch checks the group every quarter of the stall timeout until ctx ends.
func (c *Consumer) watch(ctx context.Context) {
	lags, err := NewLagChecker(LagConfig{Brokers: c.cfg.Brokers, Kafka: c.cfg.Kafka, GroupID: c.cfg.GroupID, Topics: []string{c.cfg.Topic}})
	if err != nil {
		c.logger.Error("stall watchdog not started", "error", err)
		return
	}
	client := &kafka.Client{Addr: kafka.TCP(c.cfg.Brokers...), Timeout: 10 * time.Second, Transport: c.cfg.Kafka.Transport()}
	tick := time.NewTicker(max(c.cfg.StallTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := c.checkStalls(ctx, lags, client); err != nil && ctx.Err() == nil {
			c.wd.metrics.checkErr.Inc()
			c.logger.Debug("stall check", "error", err)
		}
	}
}

// checkStalls looks at the group once.
func (c *Consumer) checkStalls(ctx context.Context, lags *LagChecker, client *kafka.Client) error {
	groups, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{c.cfg.GroupID}})
	if err != nil {
		return fmt.Errorf("describe group %s: %w", c.cfg.GroupID, err)
	}
	lag, err := lags.Lag(ctx)
	if err != nil {
		return err
	}
	stable := false
	holder := map[int]kafka.DescribeGroupsResponseMember{}
	for _, g := range groups.Groups {
		stable = g.Error == nil && g.GroupState == "Stable"
		for _, m := range g.Members {
			for _, t := range m.MemberAssignments.Topics {
				if t.Topic == c.cfg.Topic {
					for _, p := range t.Partitions {
						holder[p] = m
					}
				}
			}
		}
	}
	me, _ := c.wd.clientID.Load().(string)
	now := time.Now()
	wd := c.wd
	wd.mu.Lock()
	defer wd.mu.Unlock()
	var mine []int
	var waiting int64
	for _, p := range lag.Partitions {
		label := strconv.Itoa(p.Partition)
		prev, seen := wd.since[p.Partition]
		switch {
		case p.Messages() == 0:
			delete(wd.since, p.Partition)
			delete(wd.stuck, p.Partition)
			wd.metrics.stalled.WithLabelValues(label).Set(0)
			continue
		case !stable:
			// A rebalance, which pauses every partition for a while, is
			// under way.
			delete(wd.since, p.Partition)
			continue
		case !seen || prev.committed != p.Committed:
			if seen {
				delete(wd.stuck, p.Partition)
			}
			wd.since[p.Partition] = offsetSince{committed: p.Committed, at: now}
			wd.metrics.stalled.WithLabelValues(label).Set(0)
			continue
		case now.Sub(prev.at) < c.cfg.StallTimeout:
			continue
		}
		wd.metrics.stalled.WithLabelValues(label).Set(1)
		m, held := holder[p.Partition]
		if held && m.ClientID == me {
			mine = append(mine, p.Partition)
			waiting += p.Messages()
			wd.stuck[p.Partition] = p.Messages()
			continue
		}
		if prev.at.Add(c.cfg.StallTimeout + c.cfg.StallTimeout/4).After(now) {
			// Report once per stall, when it is first seen.
			wd.metrics.stalls.WithLabelValues(heldByOther).Inc()
			c.logger.Warn("partition stalled, held by another member", "partition", p.Partition, "committed", p.Committed,
				"end", p.End, "for", now.Sub(prev.at).Round(time.Second), "member", m.MemberID, "client_id", m.ClientID, "client_host", m.ClientHost)
		}
	}
	wd.stalled = nil
	if len(wd.stuck) > 0 {
		stuck := slices.Sorted(maps.Keys(wd.stuck))
		var records int64
		for _, n := range wd.stuck {
			records += n
		}
		wd.stalled = fmt.Errorf("partitions %v of %s, held by this replica, stood still for %s with %d records to consume; it re-joined the group",
			stuck, c.cfg.Topic, c.cfg.StallTimeout, records)
	}
	if len(mine) == 0 {
		return nil
	}
	if !c.healthy.Load() {
		// The writer is retrying failed writes: that is the stall, already
		// reported as unhealthy, and a new reader would not help.
		return nil
	}
	wd.metrics.stalls.WithLabelValues(heldBySelf).Add(float64(len(mine)))
	c.logger.Warn("partitions held by this replica stalled", "partitions", mine, "records", waiting, "for", c.cfg.StallTimeout, "client_id", me)
	for _, p := range mine {
		// Counted again from the re-join.
		wd.since[p] = offsetSince{committed: wd.since[p].committed, at: now}
	}
	if wd.rejoin != nil {
		wd.rejoin()
	}
	return nil
}
