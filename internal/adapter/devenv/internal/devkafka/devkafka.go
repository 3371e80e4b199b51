// Package devkafka runs an in-process Kafka-protocol broker (franz-go's kfake)
// for the development mode and tests. Real Kafka clients (kafka-go, kcat)
// talk to it over TCP; with a data directory its topics, records and group
// offsets survive a restart.
//
// It is not a production broker: one node, no replication.
package devkafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Config configures the broker.
type Config struct {
	// Addr is the host:port to listen on. Port 0 picks a free one.
	Addr string
	// DataDir persists state when non-empty.
	DataDir string
	// Topics are created at start if they do not exist.
	Topics []string
	// Partitions is the partition count of created topics. Default 4.
	Partitions int32
	// SinglePartitionTopics are created with one partition (leases).
	SinglePartitionTopics []string
	Logger                *slog.Logger
	// TLS, when set, makes the listener speak TLS only (tests of clients'
	// TLS).
	TLS *tls.Config
	// Users, when given, require every client to authenticate with SASL as
	// one of them (tests of clients' SASL).
	Users []User
	// TrimCommitted deletes, every few seconds, the records that every
	// consumer group committing on a partition has committed past, and
	// creates topics with 1 MiB segments so that deleted records leave
	// the disk (meterd --dev). A partition no group has committed on keeps
	// everything. Plaintext listeners only.
	TrimCommitted bool
}

// User is a SASL user of the broker.
type User struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism, Name, Password string
}

// Broker is a running in-process broker.
type Broker struct {
	cluster  *kfake.Cluster
	sessions *sessions // nil on a TLS or SASL listener
	trimmer  *trimmer  // nil unless Config.TrimCommitted
}

// Start starts the broker and creates the configured topics.
func Start(cfg Config) (*Broker, error) { return start(cfg) }

// start is Start with more of kfake's options (tests).
func start(cfg Config, extra ...kfake.Opt) (*Broker, error) {
	host, portStr, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("kafka address %q: %w", cfg.Addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("kafka address %q: bad port", cfg.Addr)
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = 4
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		// kfake binds 127.0.0.1; listen on the host asked for instead.
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.DefaultNumPartitions(int(cfg.Partitions)),
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if cfg.TLS != nil {
		opts = append(opts, kfake.TLS(cfg.TLS))
	}
	if len(cfg.Users) > 0 {
		opts = append(opts, kfake.EnableSASL())
		for _, u := range cfg.Users {
			opts = append(opts, kfake.Superuser(u.Mechanism, u.Name, u.Password))
		}
	}
	cluster, err := kfake.NewCluster(append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("start dev kafka broker on %s: %w", cfg.Addr, err)
	}
	topics := map[string]int32{}
	for _, t := range cfg.Topics {
		topics[t] = cfg.Partitions
	}
	for _, t := range cfg.SinglePartitionTopics {
		topics[t] = 1
	}
	var topicConfigs map[string]string
	if cfg.TrimCommitted {
		topicConfigs = map[string]string{"segment.bytes": strconv.Itoa(trimSegmentBytes)}
	}
	for t, n := range topics {
		if err := cluster.CreateTopic(t, n, topicConfigs); err != nil && !isExists(err) {
			cluster.Close()
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	b := &Broker{cluster: cluster}
	if cfg.TLS == nil && len(cfg.Users) == 0 {
		b.sessions = watchSessions(cluster, b.Addr())
		if cfg.TrimCommitted {
			if b.trimmer, err = startTrimmer(b.Addr(), cfg.Logger); err != nil {
				b.Close()
				return nil, err
			}
		}
	}
	return b, nil
}

func isExists(err error) bool { return errors.Is(err, kerr.TopicAlreadyExists) }

// Addr is the address clients connect to.
func (b *Broker) Addr() string { return b.cluster.ListenAddrs()[0] }

// Close stops the broker, persisting its state.
func (b *Broker) Close() {
	if b.trimmer != nil {
		b.trimmer.close()
	}
	if b.sessions != nil {
		b.sessions.close()
	}
	b.cluster.Close()
}
