package chcluster

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// nodePorts are the loopback ports of one clickhouse-server.
type nodePorts struct {
	TCP, HTTP, Interserver int
}

// replicaName is the {replica} macro of replica r (0-based) of shard s
// (0-based): unique in the cluster, so that logs and ZooKeeper paths name
// the server.
func replicaName(s, r int) string { return fmt.Sprintf("s%dr%d", s+1, r+1) }

// shardName is the {shard} macro of shard s (0-based): system.clusters'
// shard_num.
func shardName(s int) string { return fmt.Sprintf("%d", s+1) }

// nodeConfig renders the part of server (s, r)'s configuration that makes
// it a member of the cluster: ClickHouse merges every file of config.d/
// into the config.xml beside it (chserver writes that one), so the
// single-node config stays chserver's own.
//
//   - interserver_http_port/host: where the shard's other replicas fetch
//     parts from; the host is the loopback address, not the machine's name.
//   - zookeeper: replication and ON CLUSTER queries; the session timeout is
//     short so that a killed server's ephemeral nodes (its replicas'
//     is_active) expire soon and its restart takes its replicas back
//     within seconds instead of the default 30 s.
//   - macros: {cluster}, {shard} and {replica} for the tables' ZooKeeper
//     paths and replica names.
//   - remote_servers: the cluster; internal_replication makes Distributed
//     tables write each block to one replica of its shard and leave the
//     rest to replication.
//   - distributed_ddl: the ZooKeeper queue of ON CLUSTER queries.
//   - the default profile's load_balancing in_order: a Distributed table
//     reads from and writes to the first live replica of each shard, as
//     cluster mode asks (docs/cluster.md, "Reading"), so that a read
//     sees what the insert before it wrote; the profiles of chserver's
//     config.xml are merged with this one.
func nodeConfig(name, zkAddr string, s, r int, self nodePorts, all [][]nodePorts) ([]byte, error) {
	zkHost, zkPort, err := net.SplitHostPort(zkAddr)
	if err != nil {
		return nil, fmt.Errorf("zookeeper address: %w", err)
	}
	if !validName(name) {
		return nil, fmt.Errorf("cluster name %q: want letters, digits and _, not starting with a digit", name)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0"?>
<!-- Written by tokenmeter's chcluster; merged into config.xml by ClickHouse. -->
<yandex>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <interserver_http_port>%d</interserver_http_port>
  <zookeeper>
    <node><host>%s</host><port>%s</port></node>
    <session_timeout_ms>%d</session_timeout_ms>
  </zookeeper>
  <macros>
    <cluster>%s</cluster>
    <shard>%s</shard>
    <replica>%s</replica>
  </macros>
  <distributed_ddl>
    <path>/clickhouse/task_queue/ddl</path>
  </distributed_ddl>
  <profiles><default><load_balancing>in_order</load_balancing></default></profiles>
  <remote_servers>
    <%s>
`, self.Interserver, zkHost, zkPort, sessionTimeout.Milliseconds(), name, shardName(s), replicaName(s, r), name)
	for _, shard := range all {
		b.WriteString("      <shard>\n        <internal_replication>true</internal_replication>\n")
		for _, p := range shard {
			fmt.Fprintf(&b, "        <replica><host>127.0.0.1</host><port>%d</port></replica>\n", p.TCP)
		}
		b.WriteString("      </shard>\n")
	}
	fmt.Fprintf(&b, "    </%s>\n  </remote_servers>\n</yandex>\n", name)
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		return nil, fmt.Errorf("render cluster config: %w", err)
	}
	return b.Bytes(), nil
}

// validName reports whether name can be a cluster name: an XML element
// name in remote_servers and an identifier in SQL.
func validName(name string) bool {
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// freePort returns a loopback TCP port that is free now and not in taken,
// picked at random below the kernel's ephemeral port range. The servers of
// a cluster name each other's ports in their configs, so a port must stay
// free from the moment it is picked until its server binds it, a second
// later; a port the kernel hands out (port 0) is from the ephemeral range,
// where the servers starting meanwhile take their outgoing connections'
// source ports (a server of a test run failed to bind its port that way).
func freePort(taken []int) (int, error) {
	lo, hi := pickRange()
	for range 100 {
		port := lo + rand.IntN(hi-lo)
		if slices.Contains(taken, port) {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		return port, nil
	}
	return 0, fmt.Errorf("pick free port: no free port found in [%d, %d)", lo, hi)
}

// pickRange is where freePort picks ports: from 10000 to the start of the
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range; Linux's
// default starts at 32768), or 20000-30000 when that cannot be read or
// leaves too little room.
func pickRange() (lo, hi int) {
	lo, hi = 20000, 30000
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	if eph, err := strconv.Atoi(f[0]); err == nil && eph >= 12000 {
		return 10000, eph
	}
	return lo, hi
}

// pickPorts picks distinct free ports for every server of replicas (the
// number of replicas of each shard).
func pickPorts(replicas []int) ([][]nodePorts, error) {
	var taken []int
	pick := func() (int, error) {
		p, err := freePort(taken)
		taken = append(taken, p)
		return p, err
	}
	all := make([][]nodePorts, len(replicas))
	for s, n := range replicas {
		all[s] = make([]nodePorts, n)
		for r := range n {
			var err error
			p := &all[s][r]
			for _, port := range []*int{&p.TCP, &p.HTTP, &p.Interserver} {
				if *port, err = pick(); err != nil {
					return nil, err
				}
			}
		}
	}
	return all, nil
}
