// Package chstoretest opens stores on the test ClickHouse of package chtest,
// one new database each, and fills them with events, for the tests of the
// packages that read and write through internal/adapter/chstore.
package chstoretest

import (
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"tokenmeter/ingest"
	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/testkit/chcluster"
	"tokenmeter/internal/testkit/chtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Open opens a store on a new database of the test server, closed when the
// test ends; with METER_TEST_CLUSTER=1 (chtest.EnvCluster), OpenCluster's.
func Open(t testing.TB) *chstore.Store {
	t.Helper()
	if os.Getenv(chtest.EnvCluster) == "1" {
		return OpenCluster(t)
	}
	return OpenSingle(t)
}

// OpenSingle opens a store on a new database of the test server (one
// server, whatever METER_TEST_CLUSTER says), closed when the test ends.
func OpenSingle(t testing.TB) *chstore.Store {
	t.Helper()
	addr, db := chtest.NewDB(t)
	return open(t, chstore.Config{Addr: []string{addr}, Database: db})
}

// OpenCluster opens a store in cluster mode on a new database of the
// cluster the test binary shares (chcluster.Shared: two shards, the first
// with two replicas), closed when the test ends. It talks to the server of
// the second shard, so that the first shard's rows go over the network and
// its second replica gets them by replication.
func OpenCluster(t testing.TB) *chstore.Store {
	t.Helper()
	c := chcluster.Shared(t)
	return open(t, chstore.Config{Addr: []string{c.Addr(1, 0)}, Database: c.NewDB(t), Cluster: c.Name()})
}

func open(t testing.TB, cfg chstore.Config) *chstore.Store {
	t.Helper()
	s, err := chstore.Open(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// OpenMigrated is Open with every migration applied.
func OpenMigrated(t testing.TB) *chstore.Store {
	t.Helper()
	s := Open(t)
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// Insert writes events to s in one INSERT, as ingest would (its ITL).
func Insert(t testing.TB, s *chstore.Store, events []*meterv1.InferenceEvent) {
	t.Helper()
	var b chstore.EventBatch
	for _, ev := range events {
		b.Append(ev, ingest.ITL(ev), time.Now(), sink.Source{})
	}
	if err := s.InsertEvents(t.Context(), &b); err != nil {
		t.Fatal(err)
	}
}
