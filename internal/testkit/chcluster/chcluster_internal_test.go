package chcluster

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNodeConfig(t *testing.T) {
	all := [][]nodePorts{
		{{TCP: 9001, HTTP: 8001, Interserver: 7001}, {TCP: 9002, HTTP: 8002, Interserver: 7002}},
		{{TCP: 9003, HTTP: 8003, Interserver: 7003}},
	}
	b, err := nodeConfig("meter", "127.0.0.1:2181", 0, 1, all[0][1], all)
	if err != nil {
		t.Fatal(err)
	}
	type replica struct {
		Host string `xml:"host"`
		Port int    `xml:"port"`
	}
	type shard struct {
		InternalReplication bool      `xml:"internal_replication"`
		Replicas            []replica `xml:"replica"`
	}
	var got struct {
		InterserverHost string `xml:"interserver_http_host"`
		InterserverPort int    `xml:"interserver_http_port"`
		ZooKeeper       struct {
			Host           string `xml:"node>host"`
			Port           int    `xml:"node>port"`
			SessionTimeout int    `xml:"session_timeout_ms"`
		} `xml:"zookeeper"`
		Macros struct {
			Cluster string `xml:"cluster"`
			Shard   string `xml:"shard"`
			Replica string `xml:"replica"`
		} `xml:"macros"`
		DDLPath string  `xml:"distributed_ddl>path"`
		Shards  []shard `xml:"remote_servers>meter>shard"`
	}
	if err := xml.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v in:\n%s", err, b)
	}
	want := got
	want.InterserverHost, want.InterserverPort = "127.0.0.1", 7002
	want.ZooKeeper.Host, want.ZooKeeper.Port, want.ZooKeeper.SessionTimeout = "127.0.0.1", 2181, 4000
	want.Macros.Cluster, want.Macros.Shard, want.Macros.Replica = "meter", "1", "s1r2"
	want.DDLPath = "/clickhouse/task_queue/ddl"
	want.Shards = []shard{
		{InternalReplication: true, Replicas: []replica{{"127.0.0.1", 9001}, {"127.0.0.1", 9002}}},
		{InternalReplication: true, Replicas: []replica{{"127.0.0.1", 9003}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(b), []byte("<?xml")) || !bytes.Contains(b, []byte("<yandex>")) {
		t.Errorf("config root: want <yandex> (18.16), got:\n%s", b)
	}
}

func TestLayoutValidate(t *testing.T) {
	tests := []struct {
		layout Layout
		errs   int
	}{
		{layout: Layout{}.withDefaults()},
		{layout: Layout{Name: "c1", Replicas: []int{1}}},
		{layout: Layout{Name: "bad-name", Replicas: []int{1}}, errs: 1},
		{layout: Layout{Name: "1st", Replicas: []int{1}}, errs: 1},
		{layout: Layout{Name: "ok", Replicas: []int{2, 0, -1}}, errs: 2},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.layout), func(t *testing.T) {
			err := tt.layout.validate()
			got := 0
			if err != nil {
				got = len(strings.Split(err.Error(), "\n"))
			}
			if got != tt.errs {
				t.Errorf("validate() = %v: got %d problems, want %d", err, got, tt.errs)
			}
		})
	}
	if got := (Layout{}).withDefaults(); got.Name != DefaultName || !cmp.Equal(got.Replicas, []int{2, 1}) {
		t.Errorf("defaults: got %+v, want %s with replicas [2 1]", got, DefaultName)
	}
}

// envPidFile makes the test binary run as TestNoProcessLeftBehind's child:
// start a cluster, write its processes' pids there, wait to be killed.
const envPidFile = "CHCLUSTER_TEST_PID_FILE"

// TestNoProcessLeftBehind SIGKILLs a test binary that runs a cluster (so
// that no cleanup runs) and checks that ZooKeeper and every server go with
// it.
func TestNoProcessLeftBehind(t *testing.T) {
	if path := os.Getenv(envPidFile); path != "" {
		c := Start(t, Layout{Replicas: []int{1, 1}})
		pids := []string{strconv.Itoa(c.zk.proc.Pid)}
		for _, shard := range c.nodes {
			for _, n := range shard {
				pids = append(pids, strconv.Itoa(n.srv.Pid()))
			}
		}
		if err := os.WriteFile(path+".tmp", []byte(strings.Join(pids, " ")+"\n"+c.dir+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		t.Fatal("not killed")
	}
	if _, err := findZooKeeper(); err != nil {
		notInstalled(t, err)
	}
	pidFile := t.TempDir() + "/pids"
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoProcessLeftBehind$", "-test.count=1")
	cmd.Env = append(os.Environ(), envPidFile+"="+pidFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() // a no-op once killed below
	var pids []int
	var childDir string
	deadline := time.Now().Add(startTimeout)
	for len(pids) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("child wrote no pids; its output:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
		b, err := os.ReadFile(pidFile)
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		childDir = lines[1]
		for _, f := range strings.Fields(lines[0]) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
	}
	if len(pids) != 3 {
		t.Fatalf("got pids %v, want ZooKeeper's and 2 servers'", pids)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed
	// The child's temporary directory outlives it: its cleanup never ran.
	// Its name is the Go testing package's, under the TempDir root.
	defer os.RemoveAll(filepath.Dir(childDir))
	deadline = time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("pid %d still running 10 s after its test binary was killed", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
