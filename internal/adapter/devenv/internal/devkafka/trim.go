package devkafka

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// trimSegmentBytes is the segment size of the topics a trimming broker
// creates: kfake deletes a segment's file once every record in it is
// deleted, and its default segment is 100 MiB, more than a dev topic holds.
const trimSegmentBytes = 1 << 20

// trimEvery is how often a trimming broker deletes committed records.
const trimEvery = 5 * time.Second

// trimmer deletes, every trimEvery, the records of each partition that
// every consumer group with a committed offset there has committed past
// (Kafka's DeleteRecords), but the last of them: a dev data directory otherwise kept every event
// ever sent, 60 MB for make run's demo. A partition that no group has
// committed on is left whole, and so are records a group has not committed
// yet; a group that starts reading a topic later finds only what is left.
type trimmer struct {
	client *kgo.Client
	logger *slog.Logger
	stop   context.CancelFunc
	done   chan struct{}
}

// startTrimmer starts trimming the broker at addr; close stops it.
func startTrimmer(addr string, logger *slog.Logger) (*trimmer, error) {
	// Kafka 3.5's request versions: later OffsetFetch and OffsetCommit
	// versions name topics by ID only.
	client, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.MaxVersions(kversion.V3_5_0()))
	if err != nil {
		return nil, fmt.Errorf("trim client: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	t := &trimmer{client: client, logger: logger, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(trimEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := t.trim(ctx); err != nil && ctx.Err() == nil {
				t.logger.Debug("dev kafka: delete committed records", "error", err)
			}
		}
	}()
	return t, nil
}

func (t *trimmer) close() {
	t.stop()
	<-t.done
	t.client.Close()
}

// trim deletes the records every group has committed past, once.
func (t *trimmer) trim(ctx context.Context) error {
	upTo, err := t.committed(ctx)
	if err != nil {
		return err
	}
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.TimeoutMillis = 5000
	for topic, parts := range upTo {
		rt := kmsg.NewDeleteRecordsRequestTopic()
		rt.Topic = topic
		for p, offset := range parts {
			// Keep the record before the lowest committed offset: kfake
			// reloads a partition's end from the records on disk (its
			// snapshot keeps the log start, not the end of an empty
			// partition), and a group committed past the end of a
			// reloaded partition gets "offset out of range" for ever.
			if offset <= 1 {
				continue
			}
			rp := kmsg.NewDeleteRecordsRequestTopicPartition()
			rp.Partition, rp.Offset = p, offset-1
			rt.Partitions = append(rt.Partitions, rp)
		}
		if len(rt.Partitions) == 0 {
			continue
		}
		req.Topics = append(req.Topics, rt)
	}
	if len(req.Topics) == 0 {
		return nil
	}
	resp, err := req.RequestWith(ctx, t.client)
	if err != nil {
		return fmt.Errorf("delete records: %w", err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				return fmt.Errorf("delete records of %s/%d: error code %d", rt.Topic, rp.Partition, rp.ErrorCode)
			}
		}
	}
	return nil
}

// committed returns, by topic and partition, the lowest offset committed
// there by any group.
func (t *trimmer) committed(ctx context.Context) (map[string]map[int32]int64, error) {
	lg, err := kmsg.NewPtrListGroupsRequest().RequestWith(ctx, t.client)
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	upTo := map[string]map[int32]int64{}
	for _, g := range lg.Groups {
		of := kmsg.NewPtrOffsetFetchRequest()
		of.Group = g.Group // every topic the group committed on
		resp, err := of.RequestWith(ctx, t.client)
		if err != nil {
			return nil, fmt.Errorf("offsets of group %s: %w", g.Group, err)
		}
		if resp.ErrorCode != 0 {
			return nil, fmt.Errorf("offsets of group %s: error code %d", g.Group, resp.ErrorCode)
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if rp.ErrorCode != 0 || rp.Offset < 0 {
					continue
				}
				parts := upTo[rt.Topic]
				if parts == nil {
					parts = map[int32]int64{}
					upTo[rt.Topic] = parts
				}
				if cur, ok := parts[rp.Partition]; !ok || rp.Offset < cur {
					parts[rp.Partition] = rp.Offset
				}
			}
		}
	}
	return upTo, nil
}
