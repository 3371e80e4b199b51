package chcluster

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// fourLetterServer answers every connection with the next of answers (the
// last one again once they run out), as ZooKeeper answers a four-letter
// word: the text, then the connection closed.
func fourLetterServer(t *testing.T, answers ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4)
			io.ReadFull(c, buf)
			io.WriteString(c, answers[min(i, len(answers)-1)])
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestServing: a server that is not serving yet is not ready, one that
// reports its mode is.
func TestServing(t *testing.T) {
	notServing := "This ZooKeeper instance is not currently serving requests\n"
	standalone := "Zookeeper version: 3.8.4\nLatency min/avg/max: 0/0.0/0\nReceived: 1\nSent: 0\nConnections: 1\n" +
		"Outstanding: 0\nZxid: 0x0\nMode: standalone\nNode count: 5\n"
	if err := serving(t.Context(), fourLetterServer(t, notServing)); err == nil {
		t.Errorf("a server answering %q is taken as serving", notServing)
	}
	if err := serving(t.Context(), fourLetterServer(t, standalone)); err != nil {
		t.Errorf("a standalone server is not taken as serving: %v", err)
	}
}

// TestZooKeeperTakesSessionsOnceStarted starts ZooKeeper a few times and
// opens a session as soon as startZooKeeper returns, as a ClickHouse server
// does when it starts: ZooKeeper must take it. With the wait for "ruok"
// alone, the second of three starts had its session refused
// (docs/cluster.md, "The test cluster").
func TestZooKeeperTakesSessionsOnceStarted(t *testing.T) {
	inst, err := findZooKeeper()
	if err != nil {
		notInstalled(t, err)
	}
	for i := range 3 {
		zk, err := startZooKeeper(t.Context(), inst, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		err = openSession(t.Context(), zk.addr)
		zk.stop()
		if err != nil {
			t.Fatalf("start %d: a session opened once ZooKeeper was ready: %v", i+1, err)
		}
	}
}

// openSession opens a ZooKeeper session at addr with the protocol's
// ConnectRequest and closes it: a server not serving yet closes the
// connection instead of answering.
func openSession(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	// ConnectRequest: protocol version, last zxid seen, timeout (ms),
	// session id, password (a 16-byte buffer), read-only; each message
	// prefixed with its length.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 4000)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 16)
	req = append(req, make([]byte, 16)...)
	req = append(req, 0)
	if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(req))), req...)); err != nil {
		return err
	}
	// ConnectResponse: length, protocol version, timeout, session id, ...
	var resp [20]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return fmt.Errorf("no ConnectResponse: %w", err)
	}
	if id := binary.BigEndian.Uint64(resp[12:20]); id == 0 {
		return fmt.Errorf("ConnectResponse without a session id")
	}
	// closeSession: xid 1, type -11.
	closeReq := binary.BigEndian.AppendUint32(nil, 8)
	closeReq = binary.BigEndian.AppendUint32(closeReq, 1)
	closeReq = binary.BigEndian.AppendUint32(closeReq, uint32(0xFFFFFFF5))
	_, err = c.Write(closeReq)
	return err
}
