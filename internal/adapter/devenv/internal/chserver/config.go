package chserver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// layout names the files and folders of a server directory.
type layout struct {
	dir string
}

func (l layout) config() string    { return filepath.Join(l.dir, "config.xml") }
func (l layout) ports() string     { return filepath.Join(l.dir, "ports.json") }
func (l layout) pidFile() string   { return filepath.Join(l.dir, "clickhouse.pid") }
func (l layout) logDir() string    { return filepath.Join(l.dir, "log") }
func (l layout) stdoutLog() string { return filepath.Join(l.dir, "log", "stdout.log") }
func (l layout) serverLog() string { return filepath.Join(l.dir, "log", "server.log") }
func (l layout) errLog() string    { return filepath.Join(l.dir, "log", "err.log") }
func (l layout) data() string      { return filepath.Join(l.dir, "data") }

// statusFile is ClickHouse's own lock file in its data path; it holds the
// PID of the server that owns the directory.
func (l layout) statusFile() string { return filepath.Join(l.dir, "data", "status") }

// dirs are the folders the config refers to; ClickHouse creates some of them
// itself, but not all releases create all of them.
func (l layout) dirs() []string {
	return []string{
		l.logDir(),
		l.data(),
		filepath.Join(l.dir, "tmp"),
		filepath.Join(l.dir, "user_files"),
		filepath.Join(l.dir, "format_schemas"),
	}
}

// ports are the loopback ports a server listens on.
type ports struct {
	TCP  int `json:"tcp_port"`
	HTTP int `json:"http_port"`
	// TCPSecure is the native protocol over TLS; 0 when off. It is picked
	// at each Start, not persisted.
	TCPSecure int `json:"-"`
}

// resolvePorts returns the ports to use: those asked for, else those
// persisted in the server directory by an earlier start, else free ones,
// which are persisted so that a restart keeps its address. fresh reports
// whether any port was picked now (and so may be retried on a clash).
func resolvePorts(l layout, want ports) (p ports, fresh bool, err error) {
	p = want
	if p.TCP != 0 && p.HTTP != 0 {
		return p, false, nil
	}
	var saved ports
	b, err := os.ReadFile(l.ports())
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &saved); err != nil {
			return ports{}, false, fmt.Errorf("read %s: %w", l.ports(), err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return ports{}, false, fmt.Errorf("read ports: %w", err)
	}
	for _, pp := range []struct{ port, saved *int }{{&p.TCP, &saved.TCP}, {&p.HTTP, &saved.HTTP}} {
		if *pp.port != 0 {
			continue
		}
		if *pp.saved != 0 {
			*pp.port = *pp.saved
			continue
		}
		if *pp.port, err = freePort(p.TCP, p.HTTP); err != nil {
			return ports{}, false, err
		}
		fresh = true
	}
	if fresh {
		if err := writePorts(l, p); err != nil {
			return ports{}, false, err
		}
	}
	return p, fresh, nil
}

// repickPorts replaces the ports that were picked freshly (those not asked
// for) after a clash with another listener, and persists them.
func repickPorts(l layout, want, got ports) (ports, error) {
	p := want
	var err error
	if p.TCP == 0 {
		if p.TCP, err = freePort(got.TCP, got.HTTP); err != nil {
			return ports{}, err
		}
	}
	if p.HTTP == 0 {
		if p.HTTP, err = freePort(got.TCP, got.HTTP, p.TCP); err != nil {
			return ports{}, err
		}
	}
	return p, writePorts(l, p)
}

func writePorts(l layout, p ports) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("encode ports: %w", err)
	}
	if err := writeFileAtomic(l.ports(), append(b, '\n')); err != nil {
		return fmt.Errorf("persist ports: %w", err)
	}
	return nil
}

// freePort asks the kernel for a free loopback TCP port other than those in
// avoid. Another process may take it before ClickHouse binds it; Start
// retries with new ports when that happens to freshly picked ones.
func freePort(avoid ...int) (int, error) {
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("pick free port: %w", err)
		}
		if !slices.Contains(avoid, port) {
			return port, nil
		}
	}
	return 0, errors.New("pick free port: kernel keeps returning ports in use")
}

// User is a ClickHouse user with a password, besides "default" (which has
// none and is limited to loopback like every user here).
type User struct {
	// Name is letters, digits and _, not starting with a digit.
	Name     string
	Password string
}

// TLS is the certificate of the native protocol's TLS port (PEM files).
type TLS struct {
	CertFile, KeyFile string
}

// security is what configXML adds for Config.Users and Config.TLS.
type security struct {
	users []User
	tls   *TLS
}

// validUserName is what a user name must look like to be an XML element
// name in the config.
func validUserName(name string) bool {
	if name == "" || name == "default" || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// configXML renders the server config for directory dir; lean sizes its
// caches for a laptop (Config.Lean). The root element is <yandex>, which
// 18.x requires and current releases still accept. Users, profiles and
// quotas are inline, so no users.xml is needed. Passwords are written as
// their SHA-256 only.
func configXML(dir string, p ports, sec security, lean bool) ([]byte, error) {
	d, err := escape(dir)
	if err != nil {
		return nil, err
	}
	var users, secure strings.Builder
	for _, u := range sec.users {
		if !validUserName(u.Name) {
			return nil, fmt.Errorf("user name %q: want letters, digits and _, not default", u.Name)
		}
		sum := sha256.Sum256([]byte(u.Password))
		fmt.Fprintf(&users, `    <%[1]s>
      <password_sha256_hex>%[2]s</password_sha256_hex>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </%[1]s>
`, u.Name, hex.EncodeToString(sum[:]))
	}
	if sec.tls != nil {
		cert, err := escape(sec.tls.CertFile)
		if err != nil {
			return nil, err
		}
		key, err := escape(sec.tls.KeyFile)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&secure, `  <tcp_port_secure>%d</tcp_port_secure>
  <openSSL>
    <server>
      <certificateFile>%s</certificateFile>
      <privateKeyFile>%s</privateKeyFile>
      <verificationMode>none</verificationMode>
      <loadDefaultCAFile>false</loadDefaultCAFile>
      <cacheSessions>true</cacheSessions>
      <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
      <preferServerCiphers>true</preferServerCiphers>
    </server>
  </openSSL>
`, p.TCPSecure, cert, key)
	}
	// The mark cache is required by 18.16 (its packaged config has 5 GiB).
	// The uncompressed cache is off unless configured in 18.16 and off by
	// default in current releases' queries: say so explicitly when lean.
	caches := "  <mark_cache_size>268435456</mark_cache_size>\n" + mergedCompression
	if lean {
		caches = "  <mark_cache_size>67108864</mark_cache_size>\n  <uncompressed_cache_size>0</uncompressed_cache_size>\n" + leanCompression
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<?xml version="1.0"?>
<!-- Written by tokenmeter's chserver on every start; edits are lost. -->
<yandex>
  <logger>
    <level>warning</level>
    <log>%[1]s/log/server.log</log>
    <errorlog>%[1]s/log/err.log</errorlog>
    <size>100M</size>
    <count>3</count>
    <console>0</console>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <http_port>%[3]d</http_port>
%[4]s  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
%[6]s  <!-- A part replaced by a merge or by the rollup job's rewrites is
       deleted 1 s after it goes inactive (the default is 8 minutes, kept
       in case the server's host crashes before the merged part reaches
       the disk: a dev or test server's data can be made again). While
       events arrive the job rewrites the hours they touch every few
       seconds, and merges replace those parts again: with 30 s a dev data
       directory held 2,500 part folders, 1 GB on disk (each part is two
       4 KiB files per column) for 50 MB of data. -->
  <merge_tree>
    <old_parts_lifetime>1</old_parts_lifetime>
  </merge_tree>
  <max_concurrent_queries>100</max_concurrent_queries>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
%[5]s  </users>
  <profiles><default></default></profiles>
  <quotas><default></default></quotas>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
</yandex>
`, d, p.TCP, p.HTTP, secure.String(), users.String(), caches)
	return b.Bytes(), nil
}

// leanCompression makes a Lean server compress every part with ZSTD instead
// of LZ4 (18.16 and current releases read the section): the data directory
// of a make run demo (360,000 events) peaked at 219 MB with LZ4 and 166 MB
// with ZSTD, and settled at 150 and 111 MB.
const leanCompression = `  <compression>
    <case>
      <min_part_size>0</min_part_size>
      <min_part_size_ratio>0</min_part_size_ratio>
      <method>zstd</method>
    </case>
  </compression>
`

// mergedCompression is the tests' and benchmarks' servers' <compression>:
// ZSTD for the parts of at least 10 MiB that merges write, LZ4 (the
// default) for inserts and the small merges that follow them, so that an
// INSERT's CPU is unchanged while the parts that hold nearly all the bytes
// are smaller (docs/operations.md, "ClickHouse settings for production", and
// docs/performance.md, "Storage in issue 34"). 18.16 and current releases
// read the section; a part's method is chosen when it is written.
const mergedCompression = `  <compression>
    <case>
      <min_part_size>10485760</min_part_size>
      <min_part_size_ratio>0</min_part_size_ratio>
      <method>zstd</method>
    </case>
  </compression>
`

func escape(s string) (string, error) {
	var esc strings.Builder
	if err := xml.EscapeText(&esc, []byte(s)); err != nil {
		return "", fmt.Errorf("escape %q: %w", s, err)
	}
	return esc.String(), nil
}

// writeFileAtomic replaces path with data so that a crash never leaves a
// half-written file behind.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
