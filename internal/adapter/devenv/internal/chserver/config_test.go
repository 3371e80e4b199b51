package chserver

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestConfigXML(t *testing.T) {
	type parsed struct {
		XMLName  xml.Name `xml:"yandex"`
		TCPPort  int      `xml:"tcp_port"`
		HTTPPort int      `xml:"http_port"`
		Path     string   `xml:"path"`
		ErrorLog string   `xml:"logger>errorlog"`
		Listen   string   `xml:"listen_host"`
	}
	tests := []struct {
		name string
		dir  string
		p    ports
		want parsed
	}{
		{
			name: "plain",
			dir:  "/tmp/ch",
			p:    ports{TCP: 19000, HTTP: 18123},
			want: parsed{TCPPort: 19000, HTTPPort: 18123, Path: "/tmp/ch/data/", ErrorLog: "/tmp/ch/log/err.log", Listen: "127.0.0.1"},
		},
		{
			name: "markup in dir",
			dir:  "/tmp/a&b<c>",
			p:    ports{TCP: 1, HTTP: 2},
			want: parsed{TCPPort: 1, HTTPPort: 2, Path: "/tmp/a&b<c>/data/", ErrorLog: "/tmp/a&b<c>/log/err.log", Listen: "127.0.0.1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := configXML(tt.dir, tt.p, security{}, false)
			if err != nil {
				t.Fatal(err)
			}
			var got parsed
			if err := xml.Unmarshal(b, &got); err != nil {
				t.Fatalf("config does not parse: %v\n%s", err, b)
			}
			got.XMLName = xml.Name{}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConfigXMLLean: a Lean server (meterd --dev) gets small caches and
// ZSTD for every part; the tests' and benchmarks' servers keep their larger
// mark cache and ZSTD only for merged parts of 10 MiB or more (LZ4 for
// inserts); both delete replaced parts after 1 s.
func TestConfigXMLLean(t *testing.T) {
	type parsed struct {
		MarkCache         int64  `xml:"mark_cache_size"`
		UncompressedCache *int64 `xml:"uncompressed_cache_size"`
		Compression       string `xml:"compression>case>method"`
		MinPartSize       int64  `xml:"compression>case>min_part_size"`
		OldPartsLifetime  int    `xml:"merge_tree>old_parts_lifetime"`
	}
	zero := int64(0)
	for _, tt := range []struct {
		lean bool
		want parsed
	}{
		{lean: true, want: parsed{MarkCache: 64 << 20, UncompressedCache: &zero, Compression: "zstd", OldPartsLifetime: 1}},
		{lean: false, want: parsed{MarkCache: 256 << 20, Compression: "zstd", MinPartSize: 10 << 20, OldPartsLifetime: 1}},
	} {
		b, err := configXML("/tmp/ch", ports{TCP: 1, HTTP: 2}, security{}, tt.lean)
		if err != nil {
			t.Fatal(err)
		}
		var got parsed
		if err := xml.Unmarshal(b, &got); err != nil {
			t.Fatalf("config does not parse: %v\n%s", err, b)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("lean %v: config mismatch (-want +got):\n%s", tt.lean, diff)
		}
	}
}

func TestResolvePorts(t *testing.T) {
	tests := []struct {
		name      string
		saved     *ports // ports.json before the call; nil means none
		want      ports
		check     func(t *testing.T, got ports)
		wantFresh bool
		wantSaved bool // whether ports.json holds the result afterwards
	}{
		{
			name: "explicit ports are used and not persisted",
			want: ports{TCP: 1234, HTTP: 5678},
			check: func(t *testing.T, got ports) {
				if diff := cmp.Diff(ports{TCP: 1234, HTTP: 5678}, got); diff != "" {
					t.Errorf("ports mismatch (-want +got):\n%s", diff)
				}
			},
		},
		{
			name:  "saved ports are reused",
			saved: &ports{TCP: 40001, HTTP: 40002},
			check: func(t *testing.T, got ports) {
				if diff := cmp.Diff(ports{TCP: 40001, HTTP: 40002}, got); diff != "" {
					t.Errorf("ports mismatch (-want +got):\n%s", diff)
				}
			},
			wantSaved: true,
		},
		{
			name: "missing ports are picked and persisted",
			check: func(t *testing.T, got ports) {
				if got.TCP == 0 || got.HTTP == 0 || got.TCP == got.HTTP {
					t.Errorf("got ports %+v, want two distinct non-zero ports", got)
				}
			},
			wantFresh: true,
			wantSaved: true,
		},
		{
			name:  "explicit port wins over saved one",
			saved: &ports{TCP: 40001, HTTP: 40002},
			want:  ports{TCP: 1234},
			check: func(t *testing.T, got ports) {
				if diff := cmp.Diff(ports{TCP: 1234, HTTP: 40002}, got); diff != "" {
					t.Errorf("ports mismatch (-want +got):\n%s", diff)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := layout{dir: t.TempDir()}
			if tt.saved != nil {
				if err := writePorts(l, *tt.saved); err != nil {
					t.Fatal(err)
				}
			}
			got, fresh, err := resolvePorts(l, tt.want)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, got)
			if fresh != tt.wantFresh {
				t.Errorf("got fresh %v, want %v", fresh, tt.wantFresh)
			}
			if !tt.wantSaved {
				return
			}
			again, fresh, err := resolvePorts(l, ports{})
			if err != nil {
				t.Fatal(err)
			}
			if fresh || again != got {
				t.Errorf("second resolve got %+v (fresh %v), want persisted %+v", again, fresh, got)
			}
		})
	}
}

func TestReadStatusPID(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    int
		wantErr bool
	}{
		{name: "18.16", content: "PID: 2702\nStarted at: 2026-11-22 17:59:27\nRevision: 54412\n", want: 2702},
		{name: "no pid", content: "Started at: 2026-11-22 17:59:27\n", wantErr: true},
		{name: "garbage pid", content: "PID: abc\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "status")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := readStatusPID(path)
			if (err != nil) != tt.wantErr {
				t.Fatalf("got error %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got pid %d, want %d", got, tt.want)
			}
		})
	}
}

func TestServerArgs(t *testing.T) {
	tests := []struct {
		bin  string
		want []string
	}{
		{bin: "/usr/sbin/clickhouse-server", want: []string{"--config-file=/d/config.xml"}},
		{bin: "/usr/bin/clickhouse", want: []string{"server", "--config-file=/d/config.xml"}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.bin), func(t *testing.T) {
			if diff := cmp.Diff(tt.want, serverArgs(tt.bin, "/d/config.xml")); diff != "" {
				t.Errorf("args mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClashOnPicked(t *testing.T) {
	const inUse = "<Error> Application: Net Exception: Address already in use: 127.0.0.1:"
	picked := ports{TCP: 40001, HTTP: 40002}
	tests := []struct {
		name string
		err  error
		want ports // the ports asked for; zero ones were picked
		ok   bool
	}{
		{name: "picked tcp port taken", err: &exitError{logs: inUse + "40001"}, ok: true},
		{name: "picked http port taken", err: fmt.Errorf("start: %w", &exitError{logs: inUse + "40002"}), want: ports{TCP: 40001}, ok: true},
		{name: "asked-for port taken", err: &exitError{logs: inUse + "40001"}, want: ports{TCP: 40001}},
		{name: "other exit", err: &exitError{logs: "<Error> Application: DB::Exception: bad config"}},
		{name: "not an exit", err: errors.New("Address already in use: 127.0.0.1:40001")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := clashOnPicked(tt.err, tt.want, picked); got != tt.ok {
				t.Errorf("got %v, want %v", got, tt.ok)
			}
		})
	}
}

func TestServerEnv(t *testing.T) {
	env := serverEnv([]string{"PATH=/usr/bin"}, mallocConf)
	want := []string{"PATH=/usr/bin", "MALLOC_CONF=" + mallocConf, "CLICKHOUSE_WATCHDOG_ENABLE=0"}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("default environment (-want +got):\n%s", diff)
	}
	// A MALLOC_CONF of the caller's is theirs to keep.
	own := []string{"MALLOC_CONF=narenas:1", "PATH=/usr/bin"}
	want = []string{"MALLOC_CONF=narenas:1", "PATH=/usr/bin", "CLICKHOUSE_WATCHDOG_ENABLE=0"}
	if diff := cmp.Diff(want, serverEnv(own, leanMallocConf)); diff != "" {
		t.Errorf("with MALLOC_CONF set (-want +got):\n%s", diff)
	}
}

// TestMallocConfAccepted checks that the server's jemalloc takes every
// option of mallocConf and leanMallocConf: it names one it does not know on
// stderr at start.
func TestMallocConfAccepted(t *testing.T) {
	bin, err := FindBinary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("ClickHouse is required under CI=true: %v", err)
		}
		t.Skip(err)
	}
	run := func(conf string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		args := []string{"--help"}
		if filepath.Base(bin) == "clickhouse" {
			args = []string{"server", "--help"}
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "MALLOC_CONF=") }), "MALLOC_CONF="+conf)
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	if out := run("no_such_option:1"); !strings.Contains(out, "<jemalloc>") {
		t.Skipf("%s does not report jemalloc options it does not know", bin)
	}
	for _, conf := range []string{mallocConf, leanMallocConf} {
		if out := run(conf); strings.Contains(out, "<jemalloc>") {
			t.Errorf("jemalloc refused part of %q:\n%s", conf, out)
		}
	}
}

func TestConfigXMLSecurity(t *testing.T) {
	type user struct {
		XMLName  xml.Name
		Password string `xml:"password"`
		SHA256   string `xml:"password_sha256_hex"`
	}
	type parsed struct {
		TCPSecure int    `xml:"tcp_port_secure"`
		Cert      string `xml:"openSSL>server>certificateFile"`
		Key       string `xml:"openSSL>server>privateKeyFile"`
		Users     struct {
			Any []user `xml:",any"`
		} `xml:"users"`
	}
	b, err := configXML("/tmp/ch", ports{TCP: 1, HTTP: 2, TCPSecure: 3}, security{
		users: []User{{Name: "meterd", Password: "s3cret"}},
		tls:   &TLS{CertFile: "/etc/c&.pem", KeyFile: "/etc/k.pem"},
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "s3cret") {
		t.Errorf("the config holds the password in clear:\n%s", b)
	}
	var got parsed
	if err := xml.Unmarshal(b, &got); err != nil {
		t.Fatalf("config does not parse: %v\n%s", err, b)
	}
	want := parsed{TCPSecure: 3, Cert: "/etc/c&.pem", Key: "/etc/k.pem"}
	want.Users.Any = []user{
		{XMLName: xml.Name{Local: "default"}},
		// printf s3cret | sha256sum
		{XMLName: xml.Name{Local: "meterd"}, SHA256: "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config mismatch (-want +got):\n%s", diff)
	}

	for _, name := range []string{"", "default", "9lives", "a-b", "<x>"} {
		if _, err := configXML("/tmp/ch", ports{TCP: 1, HTTP: 2}, security{users: []User{{Name: name, Password: "p"}}}, false); err == nil {
			t.Errorf("user name %q: got no error", name)
		}
	}
}
