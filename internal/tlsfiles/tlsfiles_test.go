package tlsfiles_test

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/tlsfiles"
)

// clock is a settable Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// handshake runs a TLS handshake over a pipe and returns the serial of the
// certificate the server presented, or the client's or server's error.
func handshake(t *testing.T, server, client *tls.Config) (*big.Int, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		a, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer a.Close()
		s := tls.Server(a, server)
		err = s.Handshake()
		if err == nil {
			// Under TLS 1.3 the client learns that its certificate was
			// refused only when it reads; make it read.
			_, err = s.Write([]byte{1})
		}
		srvErr <- err
	}()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.SetDeadline(time.Now().Add(10 * time.Second))
	c := tls.Client(b, client)
	err = c.Handshake()
	if err == nil {
		_, err = c.Read(make([]byte, 1))
	}
	b.Close()
	if serr := <-srvErr; serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func TestServerReloadsCertificate(t *testing.T) {
	ca := certtest.NewCA(t, "test")
	first := ca.Issue(t, "meterd", "localhost")
	certFile, keyFile := first.Files(t)
	clk := &clock{t: time.Unix(1_000_000, 0)}
	var logs bytes.Buffer
	cfg, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile}.Config(tlsfiles.Options{
		CheckEvery: 2 * time.Second, Now: clk.now, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	serves := func(want *big.Int) {
		t.Helper()
		got, err := handshake(t, cfg, client)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if got.Cmp(want) != 0 {
			t.Fatalf("got certificate serial %v, want %v", got, want)
		}
	}
	serves(first.Serial)

	second := ca.Issue(t, "meterd", "localhost")
	second.Write(t, certFile, keyFile)
	serves(first.Serial) // not looked at again before CheckEvery
	clk.add(2 * time.Second)
	serves(second.Serial)
	if !strings.Contains(logs.String(), "reloaded") {
		t.Errorf("got logs %q, want a reload logged", logs.String())
	}

	// A certificate whose key does not match: the one in use stays, and
	// the failure is logged once.
	third := ca.Issue(t, "meterd", "localhost")
	if err := os.WriteFile(certFile, third.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		clk.add(2 * time.Second)
		serves(second.Serial)
	}
	if n := strings.Count(logs.String(), "not reloaded"); n != 1 {
		t.Errorf("got %d failures logged, want 1:\n%s", n, logs.String())
	}
	// Its key arrives: the pair loads.
	if err := os.WriteFile(keyFile, third.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Second)
	serves(third.Serial)

	// A removed file keeps the pair too.
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Second)
	serves(third.Serial)
}

func TestServerMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "clients")
	other := certtest.NewCA(t, "other")
	certFile, keyFile := ca.Issue(t, "meterd", "localhost").Files(t)
	caFile := filepath.Join(t.TempDir(), "client-ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_000_000, 0)}
	cfg, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile}.Config(tlsfiles.Options{Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	good := ca.Issue(t, "client", "client").TLS(t)
	stranger := other.Issue(t, "client", "client").TLS(t)
	tests := []struct {
		name    string
		certs   []tls.Certificate
		wantErr bool
	}{
		{"no client certificate", nil, true},
		{"certificate of another CA", []tls.Certificate{stranger}, true},
		{"certificate of the client CA", []tls.Certificate{good}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := handshake(t, cfg, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: tt.certs})
			if (err != nil) != tt.wantErr {
				t.Fatalf("got error %v, want error: %v", err, tt.wantErr)
			}
		})
	}

	// The client CA file changes to the other CA: its clients get in, the
	// first CA's no longer do.
	if err := os.WriteFile(caFile, other.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clk.add(tlsfiles.DefaultCheckEvery)
	if _, err := handshake(t, cfg, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{stranger}}); err != nil {
		t.Errorf("client of the new CA: %v", err)
	}
	if _, err := handshake(t, cfg, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{good}}); err == nil {
		t.Error("client of the old CA got in after the CA file changed")
	}
}

func TestClientConfig(t *testing.T) {
	ca := certtest.NewCA(t, "kafka")
	certFile, keyFile := ca.Issue(t, "broker", "broker.internal").Files(t)
	clientCert, clientKey := ca.Issue(t, "meterd").Files(t)
	srv, err := tlsfiles.Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.CertFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsfiles.Client{CAFile: ca.CertFile, CertFile: clientCert, KeyFile: clientKey, ServerName: "broker.internal"}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, srv, cli); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	wrongName := cli.Clone()
	wrongName.ServerName = "elsewhere"
	if _, err := handshake(t, srv, wrongName); err == nil {
		t.Error("a server name the certificate does not hold was accepted")
	}
	if cfg, err := (tlsfiles.Client{}).Config(tlsfiles.Options{}); cfg != nil || err != nil {
		t.Errorf("got %v, %v for TLS off, want nil, nil", cfg, err)
	}
}

func TestValidate(t *testing.T) {
	ca := certtest.NewCA(t, "v")
	certFile, keyFile := ca.Issue(t, "x", "localhost").Files(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want []string // substrings of the error; none: no error
	}{
		{"server off", tlsfiles.Server{}.Validate("--tls"), nil},
		{"server ok", tlsfiles.Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.CertFile}.Validate("--tls"), nil},
		{"cert without key", tlsfiles.Server{CertFile: certFile}.Validate("--tls"), []string{"--tls-cert and --tls-key go together"}},
		{"key and cert swapped, bad CA", tlsfiles.Server{CertFile: keyFile, KeyFile: certFile, ClientCAFile: notPEM}.Validate("--tls"),
			[]string{"--tls-cert, --tls-key:", "--tls-client-ca:"}},
		{"client off", tlsfiles.Client{}.Validate("--kafka-tls"), nil},
		{"client system roots", tlsfiles.Client{On: true}.Validate("--kafka-tls"), nil},
		{"client missing CA, key without cert", tlsfiles.Client{CAFile: missing, KeyFile: keyFile}.Validate("--kafka-tls"),
			[]string{"--kafka-tls-ca:", "--kafka-tls-cert and --kafka-tls-key go together"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.want) == 0 {
				if tt.err != nil {
					t.Fatalf("got error %v, want none", tt.err)
				}
				return
			}
			if tt.err == nil {
				t.Fatalf("got no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(tt.err.Error(), w) {
					t.Errorf("got error %q, want it to mention %q", tt.err, w)
				}
			}
		})
	}
}
