package devkafka

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestMemberDeadInJoinIsEvicted: a consumer that dies while its JoinGroup
// waits at the coordinator (a replica SIGKILLed during a rebalance) must
// lose its membership after its session timeout, as on Kafka. kfake made
// it a member of the next generation, handed it partitions and never
// started its session timer, so the group stayed Stable with a dead
// member holding partitions that nobody consumed (TestIngestReplicasExact:
// 23,002 of 24,000 events, 4 members for 3 live replicas).
func TestMemberDeadInJoinIsEvicted(t *testing.T) {
	const topic, group, partitions = "t", "g", 12
	// Sessions of 1 s (Kafka's least is 6 s) keep the rounds short.
	b, err := start(Config{Addr: "127.0.0.1:0", Topics: []string{topic}, Partitions: partitions},
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	w := &kafka.Writer{Addr: kafka.TCP(b.Addr()), Topic: topic, Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond}
	defer w.Close()
	produce := func(round string) {
		t.Helper()
		var msgs []kafka.Message
		for p := range partitions {
			msgs = append(msgs, kafka.Message{Value: fmt.Appendf(nil, "%s-%d", round, p)})
		}
		if err := w.WriteMessages(context.Background(), msgs...); err != nil {
			t.Fatal(err)
		}
	}

	const session = time.Second
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{b.Addr()}, GroupID: group, Topic: topic,
		SessionTimeout: session, RebalanceTimeout: session, HeartbeatInterval: 200 * time.Millisecond,
		MaxWait: 500 * time.Millisecond, StartOffset: kafka.FirstOffset})
	defer r.Close()
	var mu sync.Mutex
	got := map[string]bool{}
	go func() {
		for {
			m, err := r.FetchMessage(context.Background())
			if err != nil {
				return
			}
			mu.Lock()
			got[string(m.Value)] = true
			mu.Unlock()
		}
	}()
	waitFor := func(what string, timeout time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(timeout); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s; group %+v; consumed %v", what, timeout, b.cluster.GroupInfo(group), got)
			}
		}
	}
	received := func(round string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for p := range partitions {
				if !got[fmt.Sprintf("%s-%d", round, p)] {
					return false
				}
			}
			return true
		}
	}
	produce("first")
	waitFor("the reader consumes every partition", 30*time.Second, received("first"))

	// Each round, a consumer joins and dies while its join waits for the
	// reader to rejoin. kfake then answers the join into the closed
	// connection, and starts the member's session timer only if that send
	// wins a random select against the connection's end: half the dead
	// members never expire. Ten rounds leave the bug unseen once in 1,024
	// runs.
	for round := range 10 {
		conn, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		join := kmsg.NewPtrJoinGroupRequest()
		join.Version = 1 // what kafka-go sends
		join.Group, join.ProtocolType = group, "consumer"
		join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = int32(session/time.Millisecond), int32(session/time.Millisecond)
		meta := kmsg.NewConsumerMemberMetadata()
		meta.Topics = []string{topic}
		join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
		if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("doomed")).AppendRequest(nil, join, 1)); err != nil {
			t.Fatal(err)
		}
		waitFor("the join waits at the coordinator", 10*time.Second, func() bool {
			g := b.cluster.GroupInfo(group)
			return g != nil && g.State == "PreparingRebalance" && len(g.Members) == 2
		})
		conn.Close()
		// The reader rejoins; the generation it completes holds the dead
		// member, with partitions.
		waitFor("the rebalance completes", 30*time.Second, func() bool {
			g := b.cluster.GroupInfo(group)
			return g != nil && g.State == "Stable"
		})
		// Within a few session timeouts the dead member is gone and the
		// reader holds, and consumes, every partition again.
		name := fmt.Sprint("round-", round)
		produce(name)
		waitFor(name+": the reader consumes every partition after the dead member's session timeout", 20*session, received(name))
	}
	if g := b.cluster.GroupInfo(group); len(g.Members) != 1 {
		t.Errorf("group %+v, want one member", g)
	}
}
