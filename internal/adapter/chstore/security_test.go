package chstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/testkit/chtest"
	"tokenmeter/internal/tlsfiles"
)

// ClickHouse's error codes for a refused login.
const (
	codeUnknownUser   = 192
	codeWrongPassword = 193
)

// TestUserPasswordAndTLS connects to a server that has a user with a
// password and a TLS port: the right password works on both ports, a wrong
// one is refused with ClickHouse's code, and TLS needs a trusted certificate.
func TestUserPasswordAndTLS(t *testing.T) {
	ca := certtest.NewCA(t, "clickhouse")
	certFile, keyFile := ca.Issue(t, "clickhouse", "127.0.0.1", "localhost").Files(t)
	srv := chtest.StartPrivateWith(t, devenv.ClickHouseConfig{
		Users: []devenv.ClickHouseUser{{Name: "meterd", Password: "s3cret pass"}},
		TLS:   &devenv.ClickHouseTLS{CertFile: certFile, KeyFile: keyFile},
	})
	trusted, err := tlsfiles.Client{CAFile: ca.CertFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsfiles.Client{CAFile: certtest.NewCA(t, "other").CertFile}.Config(tlsfiles.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		addr     string
		user     string
		password string
		tls      *tls.Config
		wantCode int32 // ClickHouse's error code; -1: any error; 0: none
	}{
		{"password", srv.Addr(), "meterd", "s3cret pass", nil, 0},
		{"password over TLS", srv.SecureAddr(), "meterd", "s3cret pass", trusted, 0},
		{"wrong password", srv.Addr(), "meterd", "s3cret", nil, codeWrongPassword},
		{"wrong password over TLS", srv.SecureAddr(), "meterd", "S3CRET PASS", trusted, codeWrongPassword},
		{"unknown user", srv.Addr(), "mallory", "s3cret pass", nil, codeUnknownUser},
		{"TLS port without TLS", srv.SecureAddr(), "meterd", "s3cret pass", nil, -1},
		{"certificate of an unknown CA", srv.SecureAddr(), "meterd", "s3cret pass", other, -1},
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := chstore.Open(chstore.Config{Addr: []string{tt.addr}, Database: "secure_test", Username: tt.user, Password: tt.password,
				TLS: tt.tls, DialTimeout: 2 * time.Second}, logger)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err = s.Migrate(ctx)
			if refused := chstore.Refused(err); refused != (tt.wantCode != 0 && tt.name != "TLS port without TLS") {
				t.Errorf("Refused(%v) = %v", err, refused)
			}
			switch {
			case tt.wantCode == 0:
				if err != nil {
					t.Fatalf("Migrate: %v", err)
				}
				if err := s.Ping(ctx); err != nil {
					t.Fatalf("Ping: %v", err)
				}
			case err == nil:
				t.Fatal("Migrate: got no error")
			case tt.wantCode > 0:
				var ex *clickhouse.Exception
				if !errors.As(err, &ex) || ex.Code != tt.wantCode {
					t.Fatalf("Migrate: got %v, want ClickHouse error code %d", err, tt.wantCode)
				}
			}
			t.Logf("Migrate: %v", err)
		})
	}
}
