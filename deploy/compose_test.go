package deploy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// loadCompose loads compose.yaml with the compose-spec loader as docker
// compose does: checked against the compose schema (an unknown key is an
// error), interpolated with env, paths resolved against deploy/, and the
// consistency checks (depends_on, volumes and the like exist).
func loadCompose(t *testing.T, env map[string]string) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: env,
	}, func(o *loader.Options) { o.ResolvePaths = true })
	if err != nil {
		t.Fatalf("load compose.yaml: %v", err)
	}
	return p
}

// TestCompose checks deploy/compose.yaml: Kafka in KRaft mode, ClickHouse
// with ZooKeeper, the topics created before meterd starts, the three meterd
// roles with real flags and environment variables, health checks on every
// long-running service, and the start order in depends_on conditions.
func TestCompose(t *testing.T) {
	p := loadCompose(t, map[string]string{})
	want := []string{"clickhouse", "demo-traffic", "gpu-agent", "gpu-samples", "kafka", "kafka-init", "meterd-api", "meterd-ingest", "meterd-rollup", "zookeeper"}
	if got := p.ServiceNames(); !slices.Equal(sorted(got), want) {
		t.Fatalf("services %v, want %v", sorted(got), want)
	}
	svc := func(name string) types.ServiceConfig {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Kafka: KRaft, broker and controller in one process, no ZooKeeper.
	kafka := svc("kafka")
	if !strings.HasPrefix(kafka.Image, "apache/kafka:") {
		t.Errorf("kafka image %s, want the official apache/kafka", kafka.Image)
	}
	if roles := envValue(kafka.Environment, "KAFKA_PROCESS_ROLES"); roles != "broker,controller" {
		t.Errorf("KAFKA_PROCESS_ROLES=%q, want broker,controller (KRaft)", roles)
	}
	for k := range kafka.Environment {
		if strings.Contains(k, "ZOOKEEPER") {
			t.Errorf("kafka: %s: KRaft mode needs no ZooKeeper", k)
		}
	}
	if !strings.HasPrefix(svc("clickhouse").Image, "clickhouse/clickhouse-server:") {
		t.Errorf("clickhouse image %s, want clickhouse/clickhouse-server", svc("clickhouse").Image)
	}

	// Start order: conditions, not just names.
	deps := map[string]map[string]string{
		"clickhouse":    {"zookeeper": types.ServiceConditionHealthy},
		"kafka-init":    {"kafka": types.ServiceConditionHealthy},
		"meterd-ingest": {"kafka-init": types.ServiceConditionCompletedSuccessfully, "clickhouse": types.ServiceConditionHealthy},
		"meterd-rollup": {"kafka-init": types.ServiceConditionCompletedSuccessfully, "clickhouse": types.ServiceConditionHealthy},
		"meterd-api":    {"kafka-init": types.ServiceConditionCompletedSuccessfully, "clickhouse": types.ServiceConditionHealthy},
		"demo-traffic":  {"meterd-api": types.ServiceConditionHealthy, "meterd-ingest": types.ServiceConditionHealthy},
		"gpu-samples":   {"meterd-api": types.ServiceConditionHealthy},
		"gpu-agent":     {"gpu-samples": types.ServiceConditionCompletedSuccessfully, "kafka-init": types.ServiceConditionCompletedSuccessfully},
	}
	for name, want := range deps {
		got := map[string]string{}
		for dep, d := range svc(name).DependsOn {
			got[dep] = d.Condition
		}
		if !mapsEqual(got, want) {
			t.Errorf("%s depends_on %v, want %v", name, got, want)
		}
	}

	// Health checks on every service that keeps running.
	for _, s := range p.Services {
		oneShot := s.Restart == "no"
		hc := s.HealthCheck
		switch {
		case oneShot && hc != nil && !hc.Disable:
			t.Errorf("%s runs once (restart: no) but has a health check", s.Name)
		case !oneShot && (hc == nil || hc.Disable || len(hc.Test) < 2):
			t.Errorf("%s keeps running without a health check", s.Name)
		}
	}

	// The topics: kafka-init creates every topic meterd reads or writes, the
	// lease with exactly one partition.
	initCmd := strings.Join(svc("kafka-init").Command, " ")
	for _, topic := range []string{"meter.events.v1", "meter.gpu.v1", "meter.dlq.v1", "meter.rollup.lease.v1"} {
		if !regexp.MustCompile(`--create\b.*--topic ` + regexp.QuoteMeta(topic) + `\b`).MatchString(initCmd) {
			t.Errorf("kafka-init does not create %s:\n%s", topic, initCmd)
		}
	}
	if !regexp.MustCompile(`--topic meter\.rollup\.lease\.v1 --partitions 1\n`).MatchString(initCmd + "\n") {
		t.Errorf("kafka-init: the rollup lease topic needs exactly one partition:\n%s", initCmd)
	}
	if !strings.Contains(initCmd, "--topic meter.events.v1 --partitions 6") {
		t.Errorf("kafka-init: meter.events.v1 without EVENTS_PARTITIONS' default 6:\n%s", initCmd)
	}

	// meterd: real flags and METER_* variables, roles, health checks on the
	// port meterd listens on.
	for _, role := range roles {
		s := svc("meterd-" + role)
		where := "compose service " + s.Name
		checkFlags(t, where, "meterd", s.Command)
		checkEnv(t, where, "meterd", envNames(s.Environment))
		if got := argValue(s.Command, "role"); got != role {
			t.Errorf("%s: --role=%q, want %s", where, got, role)
		}
		if s.Build == nil || s.Build.Target != "meterd" {
			t.Errorf("%s: want a build of the Dockerfile's meterd target, got %+v", where, s.Build)
		}
		checkComposeHealth(t, where, s, envValue(s.Environment, "METER_HTTP_ADDR"))
		if !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") {
			t.Errorf("%s: want read_only and cap_drop ALL", where)
		}
		checkComposeFiles(t, where, s)
	}
	for _, name := range []string{"demo-traffic", "gpu-samples"} {
		s := svc(name)
		if len(s.Entrypoint) != 1 || filepath.Base(s.Entrypoint[0]) != "meterctl" || s.Image != svc("meterd-api").Image {
			t.Errorf("%s: entrypoint %v, image %s: want meterctl of the meterd image", name, s.Entrypoint, s.Image)
		}
	}
	api := svc("meterd-api")
	if u := argValue(svc("demo-traffic").Command, "addr"); !strings.HasPrefix(u, "http://meterd-api:8080") {
		t.Errorf("demo-traffic --addr=%s, want the api service's port", u)
	}
	if len(api.Ports) == 0 || api.Ports[0].HostIP != "127.0.0.1" {
		t.Errorf("meterd-api ports %+v: want them published on the laptop's loopback only", api.Ports)
	}
	checkDemoKey(t, api, svc("demo-traffic"))

	// gpu-agent: replay of the file gpu-samples writes, through the shared
	// volume, with real flags.
	ga := svc("gpu-agent")
	checkFlags(t, "compose service gpu-agent", "gpu-agent", ga.Command)
	checkEnv(t, "compose service gpu-agent", "gpu-agent", envNames(ga.Environment))
	if ga.Build == nil || ga.Build.Target != "gpu-agent" {
		t.Errorf("gpu-agent: want a build of the Dockerfile's gpu-agent target, got %+v", ga.Build)
	}
	if argValue(ga.Command, "source") != "replay" {
		t.Errorf("gpu-agent --source=%s, want replay (no GPU on a laptop)", argValue(ga.Command, "source"))
	}
	out := argValue(svc("gpu-samples").Command, "out")
	in := argValue(ga.Command, "file")
	if mountedAs(svc("gpu-samples"), out) == "" || mountedAs(svc("gpu-samples"), out) != mountedAs(ga, in) || filepath.Base(out) != filepath.Base(in) {
		t.Errorf("gpu-agent --file=%s is not the file gpu-samples writes (--out=%s) through one volume", in, out)
	}
	checkComposeFiles(t, "gpu-agent", ga)

	// The build context and Dockerfile exist, and the targets are stages.
	stages := map[string]bool{}
	for _, s := range parseDockerfile(t, "Dockerfile").stages {
		stages[s.Name] = true
	}
	for _, s := range p.Services {
		if s.Build == nil {
			continue
		}
		df := filepath.Join(s.Build.Context, s.Build.Dockerfile)
		if _, err := os.Stat(df); err != nil {
			t.Errorf("%s: build context %s, dockerfile %s: %v", s.Name, s.Build.Context, s.Build.Dockerfile, err)
		}
		if !stages[s.Build.Target] {
			t.Errorf("%s: build target %q is no stage of the Dockerfile", s.Name, s.Build.Target)
		}
	}
}

// TestComposeInterpolation: the settings documented at the top of
// compose.yaml take effect.
func TestComposeInterpolation(t *testing.T) {
	p := loadCompose(t, map[string]string{"EVENTS_PARTITIONS": "12", "CLICKHOUSE_PASSWORD": "laptop-pw", "DEMO_EVENTS": "500"})
	init, _ := p.GetService("kafka-init")
	if cmd := strings.Join(init.Command, " "); !strings.Contains(cmd, "--topic meter.events.v1 --partitions 12") {
		t.Errorf("EVENTS_PARTITIONS=12 not applied:\n%s", cmd)
	}
	ch, _ := p.GetService("clickhouse")
	for _, name := range roles {
		s, _ := p.GetService("meterd-" + name)
		if got, want := envValue(s.Environment, "METER_CLICKHOUSE_PASSWORD"), envValue(ch.Environment, "CLICKHOUSE_PASSWORD"); got != "laptop-pw" || got != want {
			t.Errorf("meterd-%s: METER_CLICKHOUSE_PASSWORD=%q, ClickHouse's CLICKHOUSE_PASSWORD=%q, want both laptop-pw", name, got, want)
		}
	}
	demo, _ := p.GetService("demo-traffic")
	if got := argValue(demo.Command, "synthetic"); got != "500" {
		t.Errorf("DEMO_EVENTS=500: got --synthetic=%s", got)
	}
}

// checkComposeHealth checks a meterd service's health check: httpcheck
// (the image has no shell) GETs /healthz/ready on the port meterd listens on.
func checkComposeHealth(t *testing.T, where string, s types.ServiceConfig, httpAddr string) {
	t.Helper()
	hc := s.HealthCheck
	if hc == nil || len(hc.Test) != 3 || hc.Test[0] != "CMD" || filepath.Base(hc.Test[1]) != "httpcheck" {
		t.Errorf("%s: health check %v, want [CMD /usr/local/bin/httpcheck URL] (no shell in the image)", where, hc)
		return
	}
	u, err := url.Parse(hc.Test[2])
	if err != nil {
		t.Errorf("%s: health check URL %q: %v", where, hc.Test[2], err)
		return
	}
	_, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Errorf("%s: METER_HTTP_ADDR=%q: %v", where, httpAddr, err)
		return
	}
	if u.Port() != port || u.Path != "/healthz/ready" {
		t.Errorf("%s: health check GETs %s, want /healthz/ready on port %s (METER_HTTP_ADDR)", where, u, port)
	}
}

// checkComposeFiles checks that every file a flag names is bind-mounted
// from a file that exists, or lies in a named volume.
func checkComposeFiles(t *testing.T, where string, s types.ServiceConfig) {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind {
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("%s: bind mount of %s: %v", where, v.Source, err)
			}
		}
	}
	for _, a := range s.Command {
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(val, "/") || name == "addr" {
			continue
		}
		if mountedAs(s, val) == "" {
			t.Errorf("%s: --%s=%s lies in no volume of the service", where, name, val)
		}
	}
}

// mountedAs returns the source of the volume or bind mount that holds path
// in s ("" when none does).
func mountedAs(s types.ServiceConfig, path string) string {
	for _, v := range s.Volumes {
		if path == v.Target || strings.HasPrefix(path, strings.TrimSuffix(v.Target, "/")+"/") {
			return v.Source
		}
	}
	return ""
}

// checkDemoKey checks that the demo key the README and demo-traffic use is
// an admin key of the keys file the api service mounts.
func checkDemoKey(t *testing.T, api, demo types.ServiceConfig) {
	t.Helper()
	key := envValue(demo.Environment, "METER_API_KEY")
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if key == "" || !strings.Contains(string(readme), key) {
		t.Errorf("the demo key %q of demo-traffic is not the one deploy/README.md gives", key)
	}
	src := mountedAs(api, argValue(api.Command, "auth-keys"))
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("keys file of meterd-api: %v", err)
	}
	var file struct {
		Keys []struct{ Name, SHA256, Role string }
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	sum := sha256.Sum256([]byte(key))
	if !slices.ContainsFunc(file.Keys, func(k struct{ Name, SHA256, Role string }) bool {
		return k.SHA256 == hex.EncodeToString(sum[:]) && k.Role == "admin"
	}) {
		t.Errorf("%s holds no admin key whose SHA-256 is that of demo-traffic's METER_API_KEY", src)
	}
}

func envValue(env types.MappingWithEquals, k string) string {
	if v := env[k]; v != nil {
		return *v
	}
	return ""
}

func envNames(env types.MappingWithEquals) []string {
	var names []string
	for k := range env {
		names = append(names, k)
	}
	return names
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
