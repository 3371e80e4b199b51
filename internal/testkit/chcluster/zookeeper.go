package chcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"tokenmeter/internal/childproc"
)

// ErrZooKeeperNotInstalled reports that no ZooKeeper server (its jars and a
// java binary) was found.
var ErrZooKeeperNotInstalled = errors.New("zookeeper not installed")

const (
	// zkStartTimeout bounds a ZooKeeper start; the JVM and ZooKeeper
	// answered after 3.5-4 s on the 2-core development VM.
	zkStartTimeout = time.Minute
	// zkTickMillis is ZooKeeper's tick: sessions may last 2 to 20 ticks,
	// so ClickHouse's 4 s session timeout (sessionTimeout) is allowed.
	zkTickMillis = 500
)

// zooKeeperInstall is what it takes to run a ZooKeeper server.
type zooKeeperInstall struct {
	java      string
	classpath string
}

// findZooKeeper looks for java and the ZooKeeper server jars: Debian's
// zookeeper package (3.8) puts zookeeper.jar in /usr/share/java, whose
// manifest names its dependencies there; an upstream tarball unpacked in
// /usr/share/zookeeper has them in lib/. slf4j-simple, when present, makes
// ZooKeeper log its warnings (the jar alone logs nothing).
func findZooKeeper() (zooKeeperInstall, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		if !isFile("/usr/bin/java") {
			return zooKeeperInstall{}, fmt.Errorf("look for java on PATH and /usr/bin/java"+
				" (install ZooKeeper with `apt-get install -y zookeeper`): %w", ErrZooKeeperNotInstalled)
		}
		java = "/usr/bin/java"
	}
	var cp []string
	switch {
	case isFile("/usr/share/java/zookeeper.jar"):
		cp = append(cp, "/usr/share/java/zookeeper.jar")
	default:
		jars, _ := filepath.Glob("/usr/share/zookeeper/zookeeper-*.jar") // only bad patterns fail
		libs, _ := filepath.Glob("/usr/share/zookeeper/lib/*.jar")
		cp = append(jars, libs...)
	}
	if len(cp) == 0 {
		return zooKeeperInstall{}, fmt.Errorf("look for /usr/share/java/zookeeper.jar and /usr/share/zookeeper/lib"+
			" (install it with `apt-get install -y zookeeper`): %w", ErrZooKeeperNotInstalled)
	}
	if isFile("/usr/share/java/slf4j-simple.jar") {
		cp = append(cp, "/usr/share/java/slf4j-simple.jar")
	}
	return zooKeeperInstall{java: java, classpath: strings.Join(cp, ":")}, nil
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// zooKeeper is a standalone ZooKeeper server on loopback, killed by stop
// (its data is a test's).
type zooKeeper struct {
	addr string
	log  string
	proc *childproc.Proc
}

// zooCfg renders the server's configuration. forceSync=no (passed on as
// the zookeeper.forceSync property) spares an fsync per write: the data
// dies with the test. The admin server (Jetty on port 8080) is off; the
// four-letter words cover the readiness check.
func zooCfg(dataDir string, port int) string {
	return fmt.Sprintf(`# Written by tokenmeter's chcluster.
tickTime=%d
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr,stat
forceSync=no
`, zkTickMillis, dataDir, port)
}

// startZooKeeper starts a server in dir on a free loopback port and waits
// until it serves clients (waitReady).
func startZooKeeper(ctx context.Context, inst zooKeeperInstall, dir string) (*zooKeeper, error) {
	ctx, cancel := context.WithTimeout(ctx, zkStartTimeout)
	defer cancel()
	var lastErr error
	for range portAttempts {
		port, err := freePort(nil)
		if err != nil {
			return nil, err
		}
		zk, err := tryZooKeeper(ctx, inst, dir, port)
		if err == nil {
			return zk, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("start zookeeper: %w", lastErr)
}

func tryZooKeeper(ctx context.Context, inst zooKeeperInstall, dir string, port int) (*zooKeeper, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfg, []byte(zooCfg(filepath.Join(dir, "data"), port)), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "zookeeper.log")
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// A small heap, the serial collector and the C1 compiler only: the
	// server handles a few clients, and a JVM that starts JIT-compiling
	// competes for the CPU with the ClickHouse servers starting beside it.
	cmd := exec.Command(inst.java,
		"-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Djava.net.preferIPv4Stack=true",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-cp", inst.classpath,
		"org.apache.zookeeper.server.ZooKeeperServerMain", cfg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	// SIGKILL when this process dies: a killed test binary leaves no
	// ZooKeeper behind (the ClickHouse servers get SIGTERM from chserver).
	p, err := childproc.Start(cmd, out, syscall.SIGKILL)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", inst.java, err)
	}
	zk := &zooKeeper{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: logPath, proc: p}
	if err := zk.waitReady(ctx); err != nil {
		zk.stop()
		return nil, err
	}
	return zk, nil
}

// waitReady polls "srvr" until the server reports its mode (it serves
// clients), exits, or ctx ends. "ruok" is not enough: ZooKeeper answers
// "imok" as soon as its client port is open, and for 0.3–0.8 s more (10
// starts out of 10 on the development VM) refuses sessions ("ZooKeeperServer
// not running" in its log) while "srvr" answers that it is not serving. A
// ClickHouse server whose first sessions are refused that way logs "All
// connection tries failed" from DDLWorker::run, and 18.16 then crashes (a
// NULL pointer in zkutil::ZooKeeper::createImpl) on the first ON CLUSTER
// query sent to it: 2 cluster starts out of 20 under load.
func (zk *zooKeeper) waitReady(ctx context.Context) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var lastErr error
	for {
		if lastErr = serving(ctx, zk.addr); lastErr == nil {
			return nil
		}
		select {
		case <-zk.proc.Done():
			return fmt.Errorf("zookeeper exited during startup (%v); %s ends with:\n%s", zk.proc.Err(), zk.log, tail(zk.log))
		case <-ctx.Done():
			return fmt.Errorf("zookeeper not serving on %s (last: %v; %s ends with:\n%s): %w",
				zk.addr, lastErr, zk.log, tail(zk.log), ctx.Err())
		case <-t.C:
		}
	}
}

// serving asks the server at addr "srvr" and returns nil if it serves
// clients: its answer has a "Mode:" line (standalone, leader, follower).
func serving(ctx context.Context, addr string) error {
	got, err := fourLetter(ctx, addr, "srvr")
	if err != nil {
		return err
	}
	for line := range strings.Lines(got) {
		if strings.HasPrefix(line, "Mode: ") {
			return nil
		}
	}
	return fmt.Errorf("srvr: %q", strings.TrimSpace(got))
}

// fourLetter sends a four-letter command to the server at addr and returns
// its answer.
func fourLetter(ctx context.Context, addr, cmd string) (string, error) {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	// The server closes the connection after its answer.
	got, err := io.ReadAll(io.LimitReader(c, 64<<10))
	return string(got), err
}

// stop kills the server and waits for it.
func (zk *zooKeeper) stop() {
	zk.proc.KillGroup()
}

// tail returns the last few KiB of the file at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	const n = 4 << 10
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
