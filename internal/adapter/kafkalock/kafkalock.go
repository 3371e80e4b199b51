// Package kafkalock provides named locks that the replicas of meterd share
// through Kafka, for work that must run on one replica at a time for as
// long as one request lasts (a billing close). A lock is a consumer group,
// "<prefix>-<name>", on a topic that already exists (meterd uses the rollup
// lease's one-partition topic; other groups there do not interfere): the
// member that the group assigns the topic's lowest partition holds the lock.
//
// Unlike a plain consumer group, whose assignment moves at every rebalance,
// the assignment here stays with its holder: each member tells the group's
// leader, in its join metadata, whether it holds the lock and since when it
// has waited, and the leader gives the partition to the holder, or else to
// the member that has waited longest. Unlock leaves the group, so the next
// waiter takes the lock at once.
//
// Like every lease, it holds while the holder's session does: a holder that
// stops heartbeating for SessionTimeout (a dead or frozen process) loses
// the lock to the next waiter, and is told so only in the log.
//
// A Lock that finds the group empty (the usual case: nobody holds the
// lock) waits for the broker's group.initial.rebalance.delay.ms before its
// first generation: 3s on a broker with Kafka's default, none on the dev
// broker (kfake), where a Lock takes a few milliseconds. A waiter takes
// the lock within about a HeartbeatInterval of the unlock.
//
// It does not create the topic.
package kafkalock

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/kafkaconn"
)

// DefaultGroupPrefix starts the consumer group of every lock.
const DefaultGroupPrefix = "tokenmeter-lock"

// Config configures a Locker.
type Config struct {
	Brokers []string
	// Kafka is how to connect (TLS, SASL); nil is plaintext.
	Kafka *kafkaconn.Conn
	// Topic is an existing topic; its lowest partition stands for the lock
	// in every lock's group.
	Topic string
	// GroupPrefix starts the groups' names; default DefaultGroupPrefix.
	GroupPrefix string
	// SessionTimeout is how long a holder that stopped heartbeating keeps
	// the lock. Default 10s (brokers refuse less than their
	// group.min.session.timeout.ms, 6s by default).
	SessionTimeout time.Duration
	// HeartbeatInterval is how often members heartbeat; a waiter sees
	// that the lock is free within about one interval. Default 250ms.
	HeartbeatInterval time.Duration
	// Now is the clock that orders waiters (replicas' clocks may differ:
	// that changes only who waits longest); default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Locker takes named locks through Kafka; its Lock has the shape of
// billing/closing's Locker.
type Locker struct {
	cfg    Config
	client *kafka.Client
}

// New returns a Locker of cfg; it connects only when locking.
func New(cfg Config) (*Locker, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("kafka lock: no Kafka brokers"))
	}
	if cfg.Topic == "" {
		errs = append(errs, errors.New("kafka lock: no topic"))
	}
	if cfg.SessionTimeout < 0 || cfg.HeartbeatInterval < 0 {
		errs = append(errs, fmt.Errorf("kafka lock: session timeout %s and heartbeat interval %s must not be negative",
			cfg.SessionTimeout, cfg.HeartbeatInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.GroupPrefix == "" {
		cfg.GroupPrefix = DefaultGroupPrefix
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Locker{
		cfg:    cfg,
		client: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Timeout: 10 * time.Second, Transport: cfg.Kafka.Transport()},
	}, nil
}

// Group is the consumer group of the lock name.
func (l *Locker) Group(name string) string { return l.cfg.GroupPrefix + "-" + name }

// Lock returns once this process holds the lock name, or with ctx's error
// (wrapped) when ctx ends first. unlock releases the lock: it leaves the
// group, so that the longest waiter takes it next; call it once the work is
// done, whatever ctx has become since.
func (l *Locker) Lock(ctx context.Context, name string) (unlock func(), err error) {
	if name == "" {
		return nil, errors.New("kafka lock: no lock name")
	}
	group := l.Group(name)
	if err := l.checkTopic(ctx); err != nil {
		return nil, fmt.Errorf("kafka lock %s: %w", group, err)
	}
	m := &member{topic: l.cfg.Topic, since: l.cfg.Now()}
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                group,
		Brokers:           l.cfg.Brokers,
		Dialer:            l.cfg.Kafka.Dialer(),
		Topics:            []string{l.cfg.Topic},
		GroupBalancers:    []kafka.GroupBalancer{m},
		HeartbeatInterval: l.cfg.HeartbeatInterval,
		SessionTimeout:    l.cfg.SessionTimeout,
		RebalanceTimeout:  l.cfg.SessionTimeout,
		JoinGroupBackoff:  500 * time.Millisecond,
		Timeout:           5 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("kafka lock %s: %w", group, err)
	}
	var last error // the last error of joining, told when ctx ends
	for {
		gen, err := g.Next(ctx)
		switch {
		case ctx.Err() != nil:
			g.Close()
			if last != nil {
				return nil, fmt.Errorf("kafka lock %s: %w (last error: %w)", group, ctx.Err(), last)
			}
			return nil, fmt.Errorf("kafka lock %s: %w", group, ctx.Err())
		case err != nil:
			// kafka-go joins again by itself (after a backoff).
			if !errors.Is(err, kafka.RebalanceInProgress) {
				last = err
				l.cfg.Logger.Debug("kafka lock: join group", "group", group, "error", err)
			}
			continue
		case len(gen.Assignments[l.cfg.Topic]) == 0:
			continue
		}
		// The holder must claim the lock in every later join. If this
		// generation ended before the claim was made, a join may have gone
		// out without it: take the lock only from a generation that was
		// still on after the claim.
		m.held.Store(true)
		if !stillOn(gen) {
			m.held.Store(false)
			continue
		}
		l.cfg.Logger.Debug("kafka lock taken", "group", group, "generation", gen.ID, "waited", l.cfg.Now().Sub(m.since))
		return l.hold(ctx, g, m, group), nil
	}
}

// hold keeps the group's generations coming while the lock is held (a
// member that stops taking them cannot join the next one, and loses the
// lock), and returns unlock. The lock outlives ctx: only unlock ends it.
func (l *Locker) hold(ctx context.Context, g *kafka.ConsumerGroup, m *member, group string) (unlock func()) {
	ctx = context.WithoutCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			gen, err := g.Next(ctx)
			switch {
			case errors.Is(err, kafka.ErrGroupClosed):
				return
			case err != nil:
				continue
			case len(gen.Assignments[l.cfg.Topic]) == 0 && m.held.Load():
				// Only after a lapse of the session (or a broker that lost
				// the group): another member may hold the lock now.
				m.held.Store(false)
				l.cfg.Logger.Error("kafka lock lost before unlock: work under it may overlap another replica's",
					"group", group, "generation", gen.ID)
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.Close() // leaves the group
			<-done
		})
	}
}

// stillOn tells whether gen had not ended by the time of the call.
func stillOn(gen *kafka.Generation) bool {
	on := make(chan bool, 1)
	// A function started in a generation that has ended sees its context
	// done at once; otherwise the generation waits for it to return, which
	// it does when the generation ends.
	gen.Start(func(ctx context.Context) {
		on <- ctx.Err() == nil
		<-ctx.Done()
	})
	return <-on
}

// checkTopic makes sure the topic exists: in a group whose topic does not,
// nobody is ever assigned the lock.
func (l *Locker) checkTopic(ctx context.Context) error {
	meta, err := l.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{l.cfg.Topic}})
	if err != nil {
		return err
	}
	for _, t := range meta.Topics {
		if t.Name == l.cfg.Topic {
			if t.Error != nil {
				return fmt.Errorf("topic %q: %w", l.cfg.Topic, t.Error)
			}
			return nil
		}
	}
	return fmt.Errorf("topic %q: %w", l.cfg.Topic, kafka.UnknownTopicOrPartition)
}

// member is the group balancer of one Lock: it tells the leader, in its
// join metadata, what this member claims, and as the leader it gives the
// lock to the holder, or else to the longest waiter.
type member struct {
	topic string
	since time.Time
	held  atomic.Bool
}

// protocolName is the group protocol of every lock's members.
const protocolName = "tokenmeter-lock-v1"

func (m *member) ProtocolName() string { return protocolName }

// UserData is the member's claim: version 1, held (0 or 1), and the
// instant it started waiting (Unix nanoseconds, big-endian).
func (m *member) UserData() ([]byte, error) {
	b := make([]byte, 10)
	b[0] = 1
	if m.held.Load() {
		b[1] = 1
	}
	binary.BigEndian.PutUint64(b[2:], uint64(m.since.UnixNano()))
	return b, nil
}

// claim is a member's UserData read back; a member whose data is not a
// claim waits behind every other.
type claim struct {
	held  bool
	since int64
}

func readClaim(b []byte) claim {
	if len(b) != 10 || b[0] != 1 {
		return claim{since: math.MaxInt64}
	}
	return claim{held: b[1] == 1, since: int64(binary.BigEndian.Uint64(b[2:]))}
}

// AssignGroups gives the topic's lowest partition to the member that
// claims to hold the lock (the one waiting longest if several claim: at
// most one did so in a generation that was still on), else to the longest
// waiter; ties go to the lowest member ID.
func (m *member) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	out := kafka.GroupMemberAssignments{}
	for _, mem := range members {
		out[mem.ID] = map[string][]int{}
	}
	lock := -1
	for _, p := range partitions {
		if p.Topic == m.topic && (lock < 0 || p.ID < lock) {
			lock = p.ID
		}
	}
	if lock < 0 || len(members) == 0 {
		return out
	}
	first := slices.MinFunc(members, func(a, b kafka.GroupMember) int {
		ca, cb := readClaim(a.UserData), readClaim(b.UserData)
		if ca.held != cb.held {
			if ca.held {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(ca.since, cb.since), cmp.Compare(a.ID, b.ID))
	})
	out[first.ID][m.topic] = []int{lock}
	return out
}
