package devkafka

import (
	"context"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// sessions enforces the session timeout of classic consumer group members
// where kfake forgets it.
//
// kfake starts a member's session timer when it answers the member's
// JoinGroup. A member that died while its join waited for the rebalance to
// complete (a replica SIGKILLed while the group rebalances) gets that
// answer sent into its closed connection, and the send races the
// connection's end in a select: half the time kfake counts the answer as
// undelivered and starts no timer. The dead member then stays in the
// generation with its partitions, the group is Stable, and nobody consumes
// them until the next rebalance, which may never come
// (TestIngestReplicasExact: 23,002 of 24,000 events after 120 s, the group
// Stable with 4 members for 3 live replicas).
//
// Kafka expires such a member after its session timeout. sessions does the
// same from outside kfake: it watches every request that keeps a member's
// session alive (JoinGroup, SyncGroup, Heartbeat, OffsetCommit), and a
// member of a Stable or CompletingRebalance group that sent none for its
// session timeout is removed with a LeaveGroup on its behalf, which
// rebalances the group as an expiry does. It needs a plaintext listener.
type sessions struct {
	cluster *kfake.Cluster
	addr    string

	mu sync.Mutex
	// groups holds, by group, the longest session timeout its members
	// asked for and when each member was last heard of.
	groups map[string]*groupSessions
	now    func() time.Time

	stop context.CancelFunc
	done chan struct{}
}

type groupSessions struct {
	timeout time.Duration
	// epoch is the generation last looked at: a new one restarts every
	// member's session, as Kafka does when a rebalance completes.
	epoch int32
	seen  map[string]time.Time // member ID -> last request
}

// sessionsTick is how often sessions looks for expired members.
const sessionsTick = 250 * time.Millisecond

// watchSessions starts enforcing session timeouts on cluster, which
// listens on addr; close stops it.
func watchSessions(cluster *kfake.Cluster, addr string) *sessions {
	ctx, stop := context.WithCancel(context.Background())
	s := &sessions{cluster: cluster, addr: addr, groups: map[string]*groupSessions{}, now: time.Now, stop: stop, done: make(chan struct{})}
	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit} {
		cluster.ControlKey(key.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			s.observe(req)
			return nil, nil, false // kfake handles it
		})
	}
	go s.run(ctx)
	return s
}

func (s *sessions) close() {
	s.stop()
	<-s.done
}

// observe runs on kfake's loop for each request that keeps a session alive.
func (s *sessions) observe(req kmsg.Request) {
	var group, member string
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		group, member = r.Group, r.MemberID
		s.mu.Lock()
		g := s.group(group)
		g.timeout = max(g.timeout, time.Duration(r.SessionTimeoutMillis)*time.Millisecond)
		s.mu.Unlock()
	case *kmsg.SyncGroupRequest:
		group, member = r.Group, r.MemberID
	case *kmsg.HeartbeatRequest:
		group, member = r.Group, r.MemberID
	case *kmsg.OffsetCommitRequest:
		group, member = r.Group, r.MemberID
	}
	if member == "" {
		return
	}
	s.mu.Lock()
	s.group(group).seen[member] = s.now()
	s.mu.Unlock()
}

func (s *sessions) group(name string) *groupSessions {
	g := s.groups[name]
	if g == nil {
		g = &groupSessions{seen: map[string]time.Time{}}
		s.groups[name] = g
	}
	return g
}

func (s *sessions) run(ctx context.Context) {
	defer close(s.done)
	client := &kafka.Client{Addr: kafka.TCP(s.addr), Timeout: 5 * time.Second}
	tick := time.NewTicker(sessionsTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for group, members := range s.expired() {
			// An error (the member left by itself meanwhile) needs no
			// action: the next tick looks again.
			_, _ = client.LeaveGroup(ctx, &kafka.LeaveGroupRequest{GroupID: group, Members: members})
		}
	}
}

// expired returns, by group, the members whose session timed out.
func (s *sessions) expired() map[string][]kafka.LeaveGroupRequestMember {
	s.mu.Lock()
	names := make([]string, 0, len(s.groups))
	for name := range s.groups {
		names = append(names, name)
	}
	s.mu.Unlock()
	out := map[string][]kafka.LeaveGroupRequestMember{}
	for _, name := range names {
		info := s.cluster.GroupInfo(name) // not under s.mu: it waits for kfake's loop, which calls observe
		s.mu.Lock()
		g := s.groups[name]
		if info == nil || g.timeout <= 0 {
			s.mu.Unlock()
			continue
		}
		now := s.now()
		if info.Epoch != g.epoch {
			g.epoch = info.Epoch
			clear(g.seen)
		}
		live := map[string]bool{}
		for _, m := range info.Members {
			live[m.MemberID] = true
			last, ok := g.seen[m.MemberID]
			if !ok {
				// Never heard of by its ID (kfake named it in a join
				// answer): its session starts now.
				g.seen[m.MemberID] = now
				continue
			}
			if (info.State == "Stable" || info.State == "CompletingRebalance") && now.Sub(last) > g.timeout {
				out[name] = append(out[name], kafka.LeaveGroupRequestMember{ID: m.MemberID})
			}
		}
		for id := range g.seen {
			if !live[id] {
				delete(g.seen, id)
			}
		}
		s.mu.Unlock()
	}
	return out
}
