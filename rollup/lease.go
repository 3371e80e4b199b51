package rollup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/kafkaconn"
)

// Lease defaults: a one-partition topic whose single partition is the lease,
// assigned by Kafka's group coordinator to one member of the group at a time.
const (
	DefaultLeaseTopic = "meter.rollup.lease.v1"
	DefaultLeaseGroup = "tokenmeter-rollup"
)

// HoldLease runs fn whenever this process holds the lease, until ctx ends.
// The lease is Kafka's: the members of the consumer group share the topic's
// one partition, so exactly one is assigned it; fn's context ends when a
// rebalance takes the lease away (or the session expires), and fn runs again
// when it comes back. The other members wait, ready to take over. conn is
// how to connect to the brokers (TLS, SASL); nil is plaintext.
func HoldLease(ctx context.Context, brokers []string, conn *kafkaconn.Conn, topic, group string, logger *slog.Logger, fn func(context.Context)) error {
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                group,
		Brokers:           brokers,
		Dialer:            conn.Dialer(),
		Topics:            []string{topic},
		HeartbeatInterval: time.Second,
		SessionTimeout:    10 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		JoinGroupBackoff:  time.Second,
		Timeout:           5 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("rollup lease: %w", err)
	}
	defer g.Close()
	for {
		gen, err := g.Next(ctx)
		switch {
		case ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed):
			return nil
		case err != nil:
			logger.Warn("rollup lease: join group", "error", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		if len(gen.Assignments[topic]) == 0 {
			logger.Info("rollup lease held by another replica", "generation", gen.ID)
			continue
		}
		logger.Info("rollup lease acquired", "generation", gen.ID)
		gen.Start(fn)
	}
}
