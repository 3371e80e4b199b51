package kafkalock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/segmentio/kafka-go"

	"tokenmeter/internal/adapter/devenv"
)

const lockTopic = "meter.rollup.lease.v1"

// startBroker starts a broker with the one-partition lock topic.
func startBroker(t *testing.T) string {
	t.Helper()
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", SinglePartitionTopics: []string{lockTopic}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	return broker.Addr()
}

// newLocker is one replica's Locker.
func newLocker(t *testing.T, addr string) *Locker {
	t.Helper()
	return newLockerAt(t, addr, time.Now)
}

// newLockerAt is one replica's Locker with its clock.
func newLockerAt(t *testing.T, addr string, now func() time.Time) *Locker {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	l, err := New(Config{Brokers: []string{addr}, Topic: lockTopic, Now: now, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lockAsync starts Lock and returns the channel of its result.
func lockAsync(ctx context.Context, l *Locker, name string) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		unlock, err := l.Lock(ctx, name)
		ch <- lockResult{unlock, err, time.Now()}
	}()
	return ch
}

type lockResult struct {
	unlock func()
	err    error
	at     time.Time
}

// mustLock takes the lock or fails the test.
func mustLock(t *testing.T, l *Locker, name string) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unlock, err := l.Lock(ctx, name)
	if err != nil {
		t.Fatalf("lock %s: %v", name, err)
	}
	return unlock
}

// notYet fails the test if ch delivers within d.
func notYet(t *testing.T, ch <-chan lockResult, d time.Duration, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Lock returned while another replica held the lock (err %v)", what, r.err)
	case <-time.After(d):
	}
}

// got waits for ch's result.
func got(t *testing.T, ch <-chan lockResult, what string) lockResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Lock did not return", what)
		return lockResult{}
	}
}

func TestLockWaitsForUnlock(t *testing.T) {
	addr := startBroker(t)
	a, b := newLocker(t, addr), newLocker(t, addr)

	start := time.Now()
	unlockA := mustLock(t, a, "billing-close")
	t.Logf("uncontended Lock took %s", time.Since(start))

	ch := lockAsync(context.Background(), b, "billing-close")
	notYet(t, ch, 2*time.Second, "second replica")
	// Another name is another lock.
	mustLock(t, b, "other")()

	released := time.Now()
	unlockA()
	r := got(t, ch, "lock after unlock")
	t.Logf("the waiter took the lock %s after unlock", r.at.Sub(released))
	r.unlock()
	r.unlock() // a second unlock does nothing
}

// TestLockStaysWithHolder: members that join while the lock is held (each
// join a rebalance of the group) do not take it from its holder, and the
// waiters take it in the order they came.
func TestLockStaysWithHolder(t *testing.T) {
	addr := startBroker(t)
	lockers := []*Locker{newLocker(t, addr), newLocker(t, addr), newLocker(t, addr), newLocker(t, addr)}
	unlock := mustLock(t, lockers[0], "billing-close")
	var waiting []<-chan lockResult
	for i, l := range lockers[1:] {
		waiting = append(waiting, lockAsync(context.Background(), l, "billing-close"))
		notYet(t, waiting[i], 700*time.Millisecond, fmt.Sprintf("waiter %d", i+1))
	}
	for _, ch := range waiting {
		notYet(t, ch, 0, "after every waiter joined")
	}
	for i, ch := range waiting {
		unlock()
		r := got(t, ch, fmt.Sprintf("waiter %d", i+1))
		for _, later := range waiting[i+1:] {
			notYet(t, later, 300*time.Millisecond, fmt.Sprintf("a waiter behind waiter %d", i+1))
		}
		unlock = r.unlock
	}
	unlock()
}

// TestLockStaysWithHolderAgainstSkew: a replica whose clock is behind
// (so it seems to have waited longer than the holder) does not take the
// lock from its holder.
func TestLockStaysWithHolderAgainstSkew(t *testing.T) {
	addr := startBroker(t)
	a := newLocker(t, addr)
	behind := newLockerAt(t, addr, func() time.Time { return time.Now().Add(-time.Hour) })
	unlock := mustLock(t, a, "billing-close")
	ch := lockAsync(context.Background(), behind, "billing-close")
	notYet(t, ch, 2*time.Second, "replica with a clock behind")
	unlock()
	got(t, ch, "lock after unlock").unlock()
}

// TestLockExcludes: replicas that take the same lock in a loop never
// overlap.
func TestLockExcludes(t *testing.T) {
	addr := startBroker(t)
	var inside, overlaps, entries atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		l := newLocker(t, addr)
		wg.Go(func() {
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				unlock, err := l.Lock(ctx, "billing-close")
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				entries.Add(1)
				time.Sleep(50 * time.Millisecond)
				inside.Add(-1)
				unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if overlaps.Load() != 0 || entries.Load() != 9 {
		t.Fatalf("overlaps and entries: got %d, %d, want 0, 9", overlaps.Load(), entries.Load())
	}
}

func TestLockCancelWhileWaiting(t *testing.T) {
	addr := startBroker(t)
	a, b, c := newLocker(t, addr), newLocker(t, addr), newLocker(t, addr)
	unlock := mustLock(t, a, "billing-close")

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := b.Lock(ctx, "billing-close")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock with a context that ends: got %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("lock with a context that ends after 1s returned after %s", took)
	}

	// The waiter that gave up has left: the next one is not held behind it.
	ch := lockAsync(context.Background(), c, "billing-close")
	notYet(t, ch, 500*time.Millisecond, "third replica")
	unlock()
	got(t, ch, "lock after unlock").unlock()

	// A context ended before Lock.
	ended, cancelEnded := context.WithCancel(context.Background())
	cancelEnded()
	if _, err := a.Lock(ended, "billing-close"); !errors.Is(err, context.Canceled) {
		t.Errorf("lock with an ended context: got %v, want context.Canceled", err)
	}
}

func TestLockMissingTopic(t *testing.T) {
	addr := startBroker(t)
	l, err := New(Config{Brokers: []string{addr}, Topic: "meter.missing.v1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.Lock(ctx, "billing-close"); !errors.Is(err, kafka.UnknownTopicOrPartition) {
		t.Errorf("lock on a missing topic: got %v, want kafka.UnknownTopicOrPartition", err)
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"valid", Config{Brokers: []string{"b:9092"}, Topic: "t"}, true},
		{"no brokers", Config{Topic: "t"}, false},
		{"no topic", Config{Brokers: []string{"b:9092"}}, false},
		{"negative session", Config{Brokers: []string{"b:9092"}, Topic: "t", SessionTimeout: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); (err == nil) != tt.ok {
				t.Errorf("New: got %v, want ok %v", err, tt.ok)
			}
		})
	}
}

func TestAssignGroups(t *testing.T) {
	claimOf := func(held bool, since int64) []byte {
		m := &member{since: time.Unix(0, since)}
		m.held.Store(held)
		b, _ := m.UserData()
		return b
	}
	parts := []kafka.Partition{{Topic: "other", ID: 0}, {Topic: "lock", ID: 3}, {Topic: "lock", ID: 1}}
	tests := []struct {
		name       string
		members    []kafka.GroupMember
		partitions []kafka.Partition
		want       string // the member given the lock; "" none
	}{
		{"holder keeps the lock", []kafka.GroupMember{
			{ID: "a", UserData: claimOf(false, 1)}, {ID: "b", UserData: claimOf(true, 5)}, {ID: "c", UserData: claimOf(false, 2)},
		}, parts, "b"},
		{"longest waiter", []kafka.GroupMember{
			{ID: "a", UserData: claimOf(false, 3)}, {ID: "b", UserData: claimOf(false, 2)}, {ID: "c", UserData: claimOf(false, 4)},
		}, parts, "b"},
		{"tie by member ID", []kafka.GroupMember{
			{ID: "c", UserData: claimOf(false, 2)}, {ID: "b", UserData: claimOf(false, 2)},
		}, parts, "b"},
		{"two claims: the longest waiter", []kafka.GroupMember{
			{ID: "a", UserData: claimOf(true, 7)}, {ID: "b", UserData: claimOf(true, 6)},
		}, parts, "b"},
		{"foreign metadata waits last", []kafka.GroupMember{
			{ID: "a", UserData: nil}, {ID: "b", UserData: claimOf(false, 9)},
		}, parts, "b"},
		{"no partition of the topic", []kafka.GroupMember{{ID: "a", UserData: claimOf(false, 1)}},
			[]kafka.Partition{{Topic: "other", ID: 0}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &member{topic: "lock"}
			want := kafka.GroupMemberAssignments{}
			for _, mem := range tt.members {
				want[mem.ID] = map[string][]int{}
			}
			if tt.want != "" {
				want[tt.want]["lock"] = []int{1}
			}
			if diff := cmp.Diff(want, m.AssignGroups(tt.members, tt.partitions)); diff != "" {
				t.Errorf("assignments (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkLockUnlock: an uncontended Lock and its unlock (a join, a sync
// and a leave of the group) on the in-process broker.
func BenchmarkLockUnlock(b *testing.B) {
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", SinglePartitionTopics: []string{lockTopic}})
	if err != nil {
		b.Fatal(err)
	}
	defer broker.Close()
	l, err := New(Config{Brokers: []string{broker.Addr()}, Topic: lockTopic})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for b.Loop() {
		unlock, err := l.Lock(ctx, "billing-close")
		if err != nil {
			b.Fatal(err)
		}
		unlock()
	}
}
