package devkafka

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// TestTrimCommitted: a broker with TrimCommitted deletes the records that
// the consumer groups have committed past, and their segment files leave
// the disk; records not yet committed, and a topic no group commits on,
// are kept whole.
func TestTrimCommitted(t *testing.T) {
	const read, unread, records = "read", "unread", 3000
	dir := t.TempDir()
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: dir, SinglePartitionTopics: []string{read, unread}, TrimCommitted: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.MaxVersions(kversion.V3_5_0())) // commits by topic name
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// 3000 records of 1 KiB each: three 1 MiB segments and a part of one.
	value := bytes.Repeat([]byte("x"), 1024)
	for _, topic := range []string{read, unread} {
		var rs []*kgo.Record
		for range records {
			rs = append(rs, &kgo.Record{Topic: topic, Value: value})
		}
		if err := client.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	partDir := func(topic string) string { return filepath.Join(dir, "partitions", topic+"-0") }
	before := dirSize(t, partDir(read))
	if _, err := os.Stat(filepath.Join(partDir(read), "0.dat")); err != nil {
		t.Fatalf("partition %s has no first segment file 0.dat: %v", read, err)
	}
	if before < 3_000_000 {
		t.Fatalf("partition %s holds %d bytes on disk, want at least 3 MB", read, before)
	}

	// Two groups committed on read; the lower offset is where trimming stops.
	commitOffset(t, ctx, client, "behind", read, 2500) // first: a trim between the two must not pass it
	commitOffset(t, ctx, client, "ahead", read, records)

	start := func(topic string) int64 { return listOffset(t, ctx, client, topic, -2) }
	deadline := time.Now().Add(4 * trimEvery)
	for start(read) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing of %s deleted after %s", read, 4*trimEvery)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := start(read); got != 2499 {
		t.Errorf("%s starts at offset %d, want 2499 (the record before the lowest committed)", read, got)
	}
	if got := start(unread); got != 0 {
		t.Errorf("%s (no group committed) starts at offset %d, want 0", unread, got)
	}
	// The first segment (file 0.dat) holds at most 1 MiB and one producer
	// batch, so it ends before offset 2499: its file leaves the disk, and
	// the partition takes less room. (How much less depends on how the
	// client batched the records, so the test asks no more.)
	if _, err := os.Stat(filepath.Join(partDir(read), "0.dat")); !os.IsNotExist(err) {
		t.Errorf("partition %s still has its first segment file 0.dat after trimming (%v)", read, err)
	}
	if after := dirSize(t, partDir(read)); after >= before {
		t.Errorf("partition %s holds %d bytes on disk after trimming, had %d: want the deleted segments gone", read, after, before)
	}
}

func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// After every record a group committed is trimmed, the partition's end
// must survive a restart of the broker, clean or not: a consumer group's
// committed offset past the end of a reloaded partition is "offset out of
// range", and meterd's consumers stopped there (make run on a used data
// directory ingested nothing). The trimmer keeps the record before the
// lowest committed offset, so the end is always on disk.
func TestTrimKeepsEndAcrossRestart(t *testing.T) {
	const topic, records = "events", 500
	dir := t.TempDir()
	b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: dir, SinglePartitionTopics: []string{topic}, TrimCommitted: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.ProducerLinger(0), kgo.MaxVersions(kversion.V3_5_0()))
	if err != nil {
		t.Fatal(err)
	}
	var rs []*kgo.Record
	for i := range records {
		rs = append(rs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint(i))})
	}
	if err := client.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	commitOffset(t, ctx, client, "meterd", topic, records) // everything read
	deadline := time.Now().Add(4 * trimEvery)
	for listOffset(t, ctx, client, topic, -2) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing of %s deleted after %s", topic, 4*trimEvery)
		}
		time.Sleep(200 * time.Millisecond)
	}
	client.Close()
	// A crash image: the data directory as it is on disk while the broker runs.
	crashed := t.TempDir()
	if err := os.CopyFS(crashed, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	b.Close()

	for name, d := range map[string]string{"clean restart": dir, "after a crash": crashed} {
		t.Run(name, func(t *testing.T) {
			b, err := Start(Config{Addr: "127.0.0.1:0", DataDir: d, SinglePartitionTopics: []string{topic}})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			client, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.MaxVersions(kversion.V3_5_0()))
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if end := listOffset(t, ctx, client, topic, -1); end != records {
				t.Errorf("%s ends at offset %d after the restart, want %d (the group committed %d)", topic, end, records, records)
			}
		})
	}
}

// commitOffset commits offset on partition 0 of topic for group (a
// generation-less commit, as an admin tool makes).
func commitOffset(t *testing.T, ctx context.Context, client *kgo.Client, group, topic string, offset int64) {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != 0 {
		t.Fatalf("commit %s: error code %d", group, code)
	}
}

// listOffset asks for partition 0's earliest (-2) or latest (-1) offset.
func listOffset(t *testing.T, ctx context.Context, client *kgo.Client, topic string, ts int64) int64 {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition, rp.Timestamp = 0, ts
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Topics[0].Partitions[0].Offset
}
