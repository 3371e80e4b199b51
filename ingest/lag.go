package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/kafkaconn"
)

// ErrLagging marks a consumer group that has not yet consumed every record
// of its topics; the error is a *LagError, which carries the numbers.
var ErrLagging = errors.New("ingest lagging")

// LagError says how far behind a consumer group is. It wraps ErrLagging.
type LagError struct {
	Lag Lag
}

func (e *LagError) Error() string {
	s := fmt.Sprintf("%d messages not yet ingested (group %s", e.Lag.Total(), e.Lag.Group)
	if n := e.Lag.Uncommitted(); n > 0 {
		s += fmt.Sprintf("; no committed offset on %d of %d partitions", n, len(e.Lag.Partitions))
	}
	return s + ")"
}

// Is makes errors.Is(err, ErrLagging) true.
func (e *LagError) Is(target error) bool { return target == ErrLagging }

// Lag is how far a consumer group is behind the end of its topics.
type Lag struct {
	Group string
	// Partitions are every partition of the topics, by topic and partition.
	Partitions []PartitionLag
}

// Total is the number of records the group has not yet consumed.
func (l Lag) Total() int64 {
	var n int64
	for _, p := range l.Partitions {
		n += p.Messages()
	}
	return n
}

// Uncommitted counts the partitions that hold records but no committed
// offset of the group (all of them, for a group that never committed).
func (l Lag) Uncommitted() int {
	n := 0
	for _, p := range l.Partitions {
		if p.Committed < 0 && p.Messages() > 0 {
			n++
		}
	}
	return n
}

// PartitionLag is one partition's offsets.
type PartitionLag struct {
	Topic     string
	Partition int
	// Start and End are the partition's earliest offset and its log end
	// offset (the next offset to be written).
	Start, End int64
	// Committed is the group's committed offset, the next one it reads;
	// -1 when it has none.
	Committed int64
}

// Messages is the partition's lag: the records from the committed offset
// to the end, or from the earliest offset when the group has committed
// none (or an offset that the log no longer holds).
func (p PartitionLag) Messages() int64 {
	from := max(p.Committed, p.Start)
	return max(p.End-from, 0)
}

// LagConfig configures a LagChecker.
type LagConfig struct {
	Brokers []string
	// Kafka is how to connect (TLS, SASL); nil is plaintext.
	Kafka *kafkaconn.Conn
	// GroupID is the consumer group (default DefaultGroupID) and Topics are
	// the topics it consumes (default DefaultEventsTopic).
	GroupID string
	Topics  []string
	// Wait bounds how long CaughtUp waits for the group to commit the
	// records that were in the topics when it was called. Default 10s;
	// negative: it does not wait.
	Wait time.Duration
	// Timeout bounds each request to Kafka. Default 10s.
	Timeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// DefaultLagWait is the default of LagConfig.Wait: a few of the consumer's
// batches (each committed within its BatchTimeout plus the insert).
const DefaultLagWait = 10 * time.Second

// lagPoll is how often CaughtUp asks for the group's committed offsets
// while it waits.
const lagPoll = 100 * time.Millisecond

// LagChecker measures a consumer group's lag on its topics: the records
// written that the group has not yet committed.
type LagChecker struct {
	cfg    LagConfig
	client *kafka.Client
}

// NewLagChecker returns a LagChecker of cfg.
func NewLagChecker(cfg LagConfig) (*LagChecker, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("ingest lag: no Kafka brokers")
	}
	if cfg.GroupID == "" {
		cfg.GroupID = DefaultGroupID
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{DefaultEventsTopic}
	}
	if cfg.Wait == 0 {
		cfg.Wait = DefaultLagWait
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &LagChecker{
		cfg:    cfg,
		client: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: cfg.Timeout, Transport: cfg.Kafka.Transport()},
	}, nil
}

// Lag measures the group's lag now: the log end offsets of every partition
// of the topics, then the group's committed offsets. An error names a topic
// that does not exist (wrapping kafka.UnknownTopicOrPartition).
func (c *LagChecker) Lag(ctx context.Context) (Lag, error) {
	lag, err := c.ends(ctx)
	if err != nil {
		return Lag{}, err
	}
	if err := c.committed(ctx, &lag); err != nil {
		return Lag{}, err
	}
	return lag, nil
}

// CaughtUp returns the instant up to which the group has consumed every
// record: the time of the call, once the group has committed every record
// that was in the topics then (the end offsets are measured after that
// instant is taken, so a record written before it is counted). It waits up
// to LagConfig.Wait for the group to get there, so that a steady stream,
// whose lag is seldom zero at any one instant, still catches up. Past the
// wait the error is a *LagError (errors.Is ErrLagging) with the lag left.
// Its shape is that of billing/closing's Deps.CaughtUp.
func (c *LagChecker) CaughtUp(ctx context.Context) (time.Time, error) {
	at := c.cfg.Now()
	deadline := time.Now().Add(c.cfg.Wait)
	lag, err := c.ends(ctx)
	if err != nil {
		return time.Time{}, err
	}
	for {
		if err := c.committed(ctx, &lag); err != nil {
			return time.Time{}, err
		}
		if lag.Total() == 0 {
			return at, nil
		}
		if !time.Now().Before(deadline) {
			return time.Time{}, &LagError{Lag: lag}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("ingest lag of group %s: %w", c.cfg.GroupID, ctx.Err())
		case <-time.After(lagPoll):
		}
	}
}

// ends lists the partitions of the topics with their earliest and log end
// offsets; Committed is left at -1.
func (c *LagChecker) ends(ctx context.Context) (Lag, error) {
	lag := Lag{Group: c.cfg.GroupID}
	meta, err := c.client.Metadata(ctx, &kafka.MetadataRequest{Topics: c.cfg.Topics})
	if err != nil {
		return lag, fmt.Errorf("ingest lag of group %s: %w", c.cfg.GroupID, err)
	}
	req := map[string][]kafka.OffsetRequest{}
	for _, name := range c.cfg.Topics {
		i := slices.IndexFunc(meta.Topics, func(t kafka.Topic) bool { return t.Name == name })
		switch {
		case i < 0:
			return lag, fmt.Errorf("ingest lag of group %s: topic %q: %w", c.cfg.GroupID, name, kafka.UnknownTopicOrPartition)
		case meta.Topics[i].Error != nil:
			return lag, fmt.Errorf("ingest lag of group %s: topic %q: %w", c.cfg.GroupID, name, meta.Topics[i].Error)
		}
		for _, p := range meta.Topics[i].Partitions {
			req[name] = append(req[name], kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
		}
	}
	resp, err := c.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: req})
	if err != nil {
		return lag, fmt.Errorf("ingest lag of group %s: list offsets: %w", c.cfg.GroupID, err)
	}
	for topic, parts := range resp.Topics {
		for _, p := range parts {
			if p.Error != nil {
				return lag, fmt.Errorf("ingest lag of group %s: offsets of %s/%d: %w", c.cfg.GroupID, topic, p.Partition, p.Error)
			}
			lag.Partitions = append(lag.Partitions, PartitionLag{Topic: topic, Partition: p.Partition,
				Start: p.FirstOffset, End: p.LastOffset, Committed: -1})
		}
	}
	slices.SortFunc(lag.Partitions, func(a, b PartitionLag) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return lag, nil
}

// committed sets the group's committed offset of every partition of lag.
func (c *LagChecker) committed(ctx context.Context, lag *Lag) error {
	req := map[string][]int{}
	for _, p := range lag.Partitions {
		req[p.Topic] = append(req[p.Topic], p.Partition)
	}
	resp, err := c.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.cfg.GroupID, Topics: req})
	if err == nil {
		err = resp.Error
	}
	type key struct {
		topic     string
		partition int
	}
	got := map[key]int64{}
	var topics map[string][]kafka.OffsetFetchPartition
	switch {
	case errors.Is(err, kafka.GroupIdNotFound):
		// A group that does not exist has committed nothing (Kafka answers
		// with no offsets, some brokers with this error).
	case err != nil:
		return fmt.Errorf("ingest lag of group %s: committed offsets: %w", c.cfg.GroupID, err)
	default:
		topics = resp.Topics
	}
	for topic, parts := range topics {
		for _, p := range parts {
			if p.Error != nil {
				return fmt.Errorf("ingest lag of group %s: committed offset of %s/%d: %w", c.cfg.GroupID, topic, p.Partition, p.Error)
			}
			got[key{topic, p.Partition}] = p.CommittedOffset
		}
	}
	for i := range lag.Partitions {
		p := &lag.Partitions[i]
		p.Committed = -1
		if off, ok := got[key{p.Topic, p.Partition}]; ok && off >= 0 {
			p.Committed = off
		}
	}
	return nil
}
