package devenv_test

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/chtest"
)

func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// partitions returns the partition count of each topic on the broker.
func partitions(t *testing.T, addr string) map[string]int {
	t.Helper()
	conn, err := kafka.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial broker: %v", err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions()
	if err != nil {
		t.Fatalf("read partitions: %v", err)
	}
	got := map[string]int{}
	for _, p := range parts {
		got[p.Topic]++
	}
	return got
}

func TestStartRunsBrokerAndClickHouseUntilClose(t *testing.T) {
	chtest.RequireLocal(t)
	dir := filepath.Join(t.TempDir(), "data") // Start creates it
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	env, err := devenv.Start(ctx, devenv.Config{
		DataDir: dir, KafkaAddr: "127.0.0.1:0",
		Topics: []string{"events", "dlq"}, SinglePartitionTopics: []string{"lease"},
		Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			env.Close()
		}
	}()

	if got, want := partitions(t, env.KafkaAddr), map[string]int{"events": 4, "dlq": 4, "lease": 1}; !maps.Equal(got, want) {
		t.Errorf("topics: got %v, want %v", got, want)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{env.ClickHouseAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Ping(ctx); err != nil {
		t.Fatalf("ping ClickHouse at %s: %v", env.ClickHouseAddr, err)
	}
	for _, sub := range []string{"kafka", "clickhouse"} {
		if _, err := os.Stat(filepath.Join(dir, sub)); err != nil {
			t.Errorf("data dir: %v", err)
		}
	}

	env.Close()
	closed = true
	for name, addr := range map[string]string{"broker": env.KafkaAddr, "ClickHouse": env.ClickHouseAddr} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s at %s still answers after Close", name, addr)
		}
	}
}

func TestStartUsesGivenClickHouse(t *testing.T) {
	dir := t.TempDir()
	env, err := devenv.Start(t.Context(), devenv.Config{
		DataDir: dir, KafkaAddr: "127.0.0.1:0", Topics: []string{"events"},
		ClickHouse: "clickhouse.example:9000", Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	if got, want := env.ClickHouseAddr, "clickhouse.example:9000"; got != want {
		t.Errorf("ClickHouseAddr: got %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "clickhouse")); !os.IsNotExist(err) {
		t.Errorf("a private ClickHouse was set up beside the given one: stat: %v", err)
	}
	if got, want := partitions(t, env.KafkaAddr), map[string]int{"events": 4}; !maps.Equal(got, want) {
		t.Errorf("topics: got %v, want %v", got, want)
	}
}

func TestStartFailsOnBusyKafkaAddr(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = devenv.Start(t.Context(), devenv.Config{DataDir: t.TempDir(), KafkaAddr: l.Addr().String(), ClickHouse: "127.0.0.1:9000"})
	if err == nil {
		t.Fatal("got no error, want one for an address in use")
	}
}
