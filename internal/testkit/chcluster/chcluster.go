// Package chcluster gives tests a real ClickHouse cluster on loopback: one
// ZooKeeper server and a clickhouse-server per replica of each shard, each
// with its own directory and ports on 127.0.0.1, joined in one cluster of
// remote_servers with internal replication, {cluster}/{shard}/{replica}
// macros and a distributed DDL queue. It is what cluster mode (Replicated
// tables ON CLUSTER, Distributed tables over them) is tested on; the
// layout and what ClickHouse 18.16 does on it are in docs/cluster.md.
//
// Start starts a cluster for a test and stops it when the test ends;
// Kill and Restart take one server down and bring it back on the same data
// and ports. Every process is killed with its test binary (a parent-death
// signal on Linux), so a killed or panicking test leaves none behind.
//
// Without clickhouse-server or ZooKeeper (Debian's zookeeper package)
// installed the tests that need them skip, except under CI=true, where
// they fail. Like chtest, the package creates databases, not tables.
package chcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"golang.org/x/sync/errgroup"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
)

const (
	// startTimeout bounds a cluster's start and a server's restart.
	startTimeout = 2 * time.Minute
	// sessionTimeout is the servers' ZooKeeper session timeout (see
	// nodeConfig).
	sessionTimeout = 4 * time.Second
	// portAttempts bounds the starts of ZooKeeper, and of the servers,
	// on ports that were taken between being picked and being bound.
	portAttempts = 3
	// ddlTimeout bounds the ON CLUSTER queries of NewDB and its cleanup,
	// which wait for every server (up to distributed_ddl_task_timeout,
	// 180 s): a server that is down makes them wait for it. The query
	// carries on in the background when the wait is cut short.
	ddlTimeout = 30 * time.Second
)

// DefaultName is the cluster's name unless Layout.Name says otherwise.
const DefaultName = "meter"

// Layout is the shape of a cluster.
type Layout struct {
	// Name is the cluster's name in remote_servers (ON CLUSTER name,
	// Distributed(name, ...)) and its {cluster} macro. Empty means
	// DefaultName.
	Name string
	// Replicas is the number of replicas of each shard: {2, 1} (the
	// default when empty) is two shards, the first with two replicas.
	Replicas []int
}

func (l Layout) withDefaults() Layout {
	if l.Name == "" {
		l.Name = DefaultName
	}
	if len(l.Replicas) == 0 {
		l.Replicas = []int{2, 1}
	}
	l.Replicas = slices.Clone(l.Replicas)
	return l
}

func (l Layout) validate() error {
	var errs []error
	if !validName(l.Name) {
		errs = append(errs, fmt.Errorf("cluster name %q: want letters, digits and _, not starting with a digit", l.Name))
	}
	for s, n := range l.Replicas {
		if n < 1 {
			errs = append(errs, fmt.Errorf("shard %d: %d replicas, want at least 1", s, n))
		}
	}
	return errors.Join(errs...)
}

// Cluster is a running cluster. Shards and replicas are numbered from 0 in
// its methods (system.clusters numbers them from 1, and so do the {shard}
// macro and the replica names "s1r1", "s1r2", "s2r1").
type Cluster struct {
	layout Layout
	dir    string // the test's temporary directory: ZooKeeper's and each server's
	zk     *zooKeeper
	nodes  [][]*node // [shard][replica]
}

// node is one clickhouse-server of the cluster.
type node struct {
	srv   *devenv.ClickHouse
	ports nodePorts

	mu       sync.Mutex
	killedAt time.Time // zero unless killed by Kill and not restarted
}

// Start starts a cluster of layout (defaults filled in) for t and stops it
// when t ends. It skips t when clickhouse-server or ZooKeeper is not
// installed, or fails it under CI=true.
func Start(t testing.TB, layout Layout) *Cluster {
	t.Helper()
	checkInstalled(t)
	dir := t.TempDir()
	var c *Cluster
	// Registered after TempDir, so it runs before the directory goes.
	t.Cleanup(func() {
		if c == nil {
			return
		}
		if t.Failed() {
			c.logTails(t)
		}
		c.stop()
	})
	ctx, cancel := context.WithTimeout(t.Context(), startTimeout)
	defer cancel()
	var err error
	if c, err = start(ctx, layout, dir, t.Logf); err != nil {
		t.Fatalf("chcluster: %v", err)
	}
	return c
}

// checkInstalled skips t (fails it under CI=true) when clickhouse-server
// or ZooKeeper is not installed.
func checkInstalled(t testing.TB) {
	t.Helper()
	if _, err := devenv.FindClickHouse(); err != nil {
		notInstalled(t, err)
	}
	if _, err := findZooKeeper(); err != nil {
		notInstalled(t, err)
	}
}

// StartDir starts a cluster of layout in dir, outside tests (meterbench
// cluster); Stop stops it. Its processes die with the process that started
// them all the same.
func StartDir(ctx context.Context, layout Layout, dir string, logf func(string, ...any)) (*Cluster, error) {
	return start(ctx, layout, dir, logf)
}

// Stop kills every server and ZooKeeper: the data is the caller's to
// remove.
func (c *Cluster) Stop() { c.stop() }

// start starts a cluster of layout in dir. A cluster it fails to start
// is stopped.
func start(ctx context.Context, layout Layout, dir string, logf func(string, ...any)) (*Cluster, error) {
	layout = layout.withDefaults()
	if err := layout.validate(); err != nil {
		return nil, err
	}
	inst, err := findZooKeeper()
	if err != nil {
		return nil, err
	}
	began := time.Now()
	c := &Cluster{layout: layout, dir: dir}
	if c.zk, err = startZooKeeper(ctx, inst, filepath.Join(dir, "zookeeper")); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		err := c.startServers(ctx, dir)
		if err == nil {
			break
		}
		if attempt == portAttempts || !strings.Contains(err.Error(), "Address already in use") {
			c.stop()
			return nil, err
		}
		c.killServers()
		logf("chcluster: a port was taken meanwhile; starting the servers on others (%v)", err)
	}
	logf("chcluster: cluster %s (replicas per shard %v, ZooKeeper %s) up in %v",
		layout.Name, layout.Replicas, c.zk.addr, time.Since(began).Round(time.Millisecond))
	return c, nil
}

// shared is the cluster of the tests of a test binary that share one
// (Shared), stopped by StopShared.
var shared struct {
	once sync.Once
	dir  string
	c    *Cluster
	err  error
}

// Shared returns a cluster of the default layout shared by every test of
// the test binary that asks for it, starting it on first use; tests that
// kill servers use Start. StopShared stops it (chtest.Main calls it). It
// skips t when clickhouse-server or ZooKeeper is not installed, or fails
// it under CI=true.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	checkInstalled(t)
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "chcluster-"); shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.c, shared.err = start(ctx, Layout{}, shared.dir, t.Logf)
	})
	if shared.err != nil {
		t.Fatalf("chcluster: shared cluster: %v", shared.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			shared.c.logTails(t)
		}
	})
	return shared.c
}

// StopShared stops the shared cluster, if a test started it, and removes
// its directory.
func StopShared() error {
	if shared.c != nil {
		shared.c.stop()
	}
	if shared.dir != "" {
		return os.RemoveAll(shared.dir)
	}
	return nil
}

// startServers writes each server's cluster config and starts them all at
// once, each in dir/sNrM.
func (c *Cluster) startServers(ctx context.Context, dir string) error {
	all, err := pickPorts(c.layout.Replicas)
	if err != nil {
		return err
	}
	c.nodes = make([][]*node, len(all))
	g, gctx := errgroup.WithContext(ctx)
	for s, shard := range all {
		c.nodes[s] = make([]*node, len(shard))
		for r, p := range shard {
			g.Go(func() error {
				ndir := filepath.Join(dir, replicaName(s, r))
				conf, err := nodeConfig(c.layout.Name, c.zk.addr, s, r, p, all)
				if err != nil {
					return err
				}
				if err := os.MkdirAll(filepath.Join(ndir, "config.d"), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(ndir, "config.d", "cluster.xml"), conf, 0o644); err != nil {
					return err
				}
				srv, err := devenv.StartClickHouse(gctx, devenv.ClickHouseConfig{
					Dir:      ndir,
					TCPPort:  p.TCP,
					HTTPPort: p.HTTP,
					Logger:   logsetup.Warnings(os.Stderr),
				})
				if err != nil {
					return fmt.Errorf("server %s: %w", replicaName(s, r), err)
				}
				c.nodes[s][r] = &node{srv: srv, ports: p} // each goroutine its own element
				return c.waitMember(gctx, srv.Addr())
			})
		}
	}
	return g.Wait()
}

// waitMember waits until the server at addr lists every server of the
// cluster in system.clusters and reaches ZooKeeper.
func (c *Cluster) waitMember(ctx context.Context, addr string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer conn.Close()
	want := uint64(0)
	for _, n := range c.layout.Replicas {
		want += uint64(n)
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var members, zk uint64
		err := conn.QueryRow(ctx, "SELECT count() FROM system.clusters WHERE cluster = ?", c.layout.Name).Scan(&members)
		if err == nil && members != want {
			err = fmt.Errorf("system.clusters lists %d servers of %s, want %d", members, c.layout.Name, want)
		}
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT count() FROM system.zookeeper WHERE path = '/'").Scan(&zk)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server %s not a member of cluster %s: %w (%w)", addr, c.layout.Name, err, ctx.Err())
		case <-t.C:
		}
	}
}

// stop kills every server, then ZooKeeper. Killing rather than stopping:
// the data goes with the test, and a server that shuts down waits for its
// replicated tables' ZooKeeper work.
func (c *Cluster) stop() {
	c.killServers()
	if c.zk != nil {
		c.zk.stop()
	}
}

// killServers kills every server that was started.
func (c *Cluster) killServers() {
	var wg sync.WaitGroup
	for _, shard := range c.nodes {
		for _, n := range shard {
			if n == nil {
				continue
			}
			wg.Go(func() {
				if err := n.srv.Kill(); err != nil {
					fmt.Fprintf(os.Stderr, "chcluster: %v\n", err)
				}
			})
		}
	}
	wg.Wait()
}

// logTails logs the end of every server's error log and of ZooKeeper's
// log, for a test that failed.
func (c *Cluster) logTails(t testing.TB) {
	for s, shard := range c.nodes {
		for r, n := range shard {
			if n != nil {
				t.Logf("chcluster: server %s (%s), log/err.log ends with:\n%s",
					replicaName(s, r), n.srv.Addr(), tail(filepath.Join(n.srv.Dir(), "log", "err.log")))
			}
		}
	}
	if c.zk != nil {
		t.Logf("chcluster: ZooKeeper (%s), %s ends with:\n%s", c.zk.addr, c.zk.log, tail(c.zk.log))
	}
}

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.layout.Name }

// Layout returns the cluster's layout, defaults filled in.
func (c *Cluster) Layout() Layout {
	l := c.layout
	l.Replicas = slices.Clone(l.Replicas)
	return l
}

// ZooKeeperAddr returns ZooKeeper's client address, "127.0.0.1:PORT".
func (c *Cluster) ZooKeeperAddr() string { return c.zk.addr }

// Addr returns the native protocol address of replica replica of shard
// shard (both from 0). It panics on a server that is not in the layout.
func (c *Cluster) Addr(shard, replica int) string { return c.nodes[shard][replica].srv.Addr() }

// HTTPAddr returns the HTTP interface address of a server.
func (c *Cluster) HTTPAddr(shard, replica int) string { return c.nodes[shard][replica].srv.HTTPAddr() }

// Addrs returns the native protocol addresses of every server, shard by
// shard.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, shard := range c.nodes {
		for _, n := range shard {
			addrs = append(addrs, n.srv.Addr())
		}
	}
	return addrs
}

// Kill kills a server with SIGKILL, as a crash would, and waits for it to
// exit. Its ZooKeeper session, and with it its replicas' is_active nodes,
// expires about 4 s later (sessionTimeout).
func (c *Cluster) Kill(shard, replica int) error {
	n := c.nodes[shard][replica]
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.srv.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", replicaName(shard, replica), err)
	}
	n.killedAt = time.Now()
	return nil
}

// Restart starts a stopped or killed server again on the same data and
// ports and waits until it is back in the cluster; its replicated tables
// then catch up by themselves.
//
// After Kill it first waits for the killed server's ZooKeeper session to
// expire: until then its replicas' is_active nodes exist, and 18.16 refuses
// to take a replica back ("appears to be already active") and tries again
// only 10 s later, so a restart within the session timeout caught up
// after about 11 s instead of 1 s.
func (c *Cluster) Restart(shard, replica int) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	n := c.nodes[shard][replica]
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.killedAt.IsZero() {
		time.Sleep(time.Until(n.killedAt.Add(sessionTimeout + time.Second)))
		n.killedAt = time.Time{}
	}
	srv := n.srv
	if err := srv.Start(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", replicaName(shard, replica), err)
	}
	if err := c.waitMember(ctx, srv.Addr()); err != nil {
		return fmt.Errorf("restart %s: %w", replicaName(shard, replica), err)
	}
	return nil
}

// Exec runs query on server (shard, replica) alone.
func (c *Cluster) Exec(shard, replica int, query string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(shard, replica)}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", c.Addr(shard, replica), err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), ddlTimeout)
	defer cancel()
	if err := conn.Exec(ctx, query); err != nil {
		return fmt.Errorf("%s on %s: %w", query, replicaName(shard, replica), err)
	}
	return nil
}

// NewDB creates a database with a fresh name on every server (CREATE
// DATABASE ... ON CLUSTER) and drops it the same way when t ends. Every
// server must be up at both times.
func (c *Cluster) NewDB(t testing.TB) string {
	t.Helper()
	db := fmt.Sprintf("t_%08x", rand.Uint32())
	ctx, cancel := context.WithTimeout(t.Context(), ddlTimeout)
	defer cancel()
	if err := c.onCluster(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatalf("chcluster: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ddlTimeout)
		defer cancel()
		if err := c.onCluster(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
			t.Errorf("chcluster: %v", err)
		}
	})
	return db
}

// onCluster runs query ON CLUSTER from the first server and waits for
// every server to have run it, or for ctx to end.
func (c *Cluster) onCluster(ctx context.Context, query string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{c.Addr(0, 0)}, DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", c.Addr(0, 0), err)
	}
	defer conn.Close()
	q := query + " ON CLUSTER " + c.layout.Name
	if err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("%s: %w", q, err)
	}
	return nil
}

// notInstalled fails t under CI=true and skips it otherwise.
func notInstalled(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("chcluster: ClickHouse and ZooKeeper are required under CI=true: %v", err)
	}
	t.Skipf("chcluster: skipping, ClickHouse and ZooKeeper are needed: %v", strings.TrimSpace(err.Error()))
}
