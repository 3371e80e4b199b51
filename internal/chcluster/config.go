package chcluster

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"slices"
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

// freePort asks the kernel for a free loopback TCP port not in taken.
// Another process may take it before the server binds it; the servers of
// a cluster name each other's ports, so a clash fails the start.
func freePort(taken []int) (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		if !slices.Contains(taken, port) {
			return port, nil
		}
	}
	return 0, errors.New("pick free port: kernel keeps returning ports in use")
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
