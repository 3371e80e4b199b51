package api_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"tokenmeter/api"
	"tokenmeter/ingest"
	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/testkit/certtest"
	"tokenmeter/internal/tlsfiles"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// tlsServer runs an api.Server with TLS from srvTLS whose publisher writes to
// a dev broker; it needs no ClickHouse.
func tlsServer(t *testing.T, srvTLS tlsfiles.Server) *api.Server {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEventsTopic}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	reg := prometheus.NewRegistry()
	pub, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: []string{broker.Addr()}, WriteTimeout: 5 * time.Second}, reg, logger, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{{Name: "ingest", SHA256: api.HashKey(testKeys["ingest"]), Role: api.RoleIngest}}})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := srvTLS.Config(tlsfiles.Options{CheckEvery: time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := api.New(ctx, api.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TLS: tlsCfg},
		&api.Services{Keys: keys, Publisher: pub}, func(context.Context) error { return nil }, reg, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return srv
}

// httpsClient trusts roots and presents certs; it opens a new connection
// per request, so that each sees the certificate served now.
func httpsClient(roots *x509.CertPool, certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, Certificates: certs},
		DisableKeepAlives: true,
		ForceAttemptHTTP2: true,
	}}
}

// publishREST posts one event through the REST gateway and returns the
// status and the serial of the certificate the server presented.
func publishREST(t *testing.T, c *http.Client, addr string, i int) (int, *big.Int, error) {
	t.Helper()
	req, err := http.NewRequest("POST", "https://"+addr+"/v1/events", bytes.NewReader(eventsJSON(t, ev(i, "acme"))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKeys["ingest"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber, nil
}

// publishGRPC publishes one event over a new gRPC connection and returns the
// serial of the certificate the server presented.
func publishGRPC(t *testing.T, addr string, creds credentials.TransportCredentials, i int) (*big.Int, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(withKey(testKeys["ingest"]), 10*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := meterv1.NewIngestServiceClient(conn).PublishEvents(ctx, &meterv1.PublishEventsRequest{Events: []*meterv1.InferenceEvent{ev(i, "acme")}},
		grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	if resp.GetAccepted() != 1 {
		t.Fatalf("gRPC publish: got %d accepted, want 1", resp.GetAccepted())
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("gRPC publish: got auth info %T, want TLS", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

func TestTLSListeners(t *testing.T) {
	ca := certtest.NewCA(t, "api")
	first := ca.Issue(t, "meterd", "127.0.0.1")
	certFile, keyFile := first.Files(t)
	srv := tlsServer(t, tlsfiles.Server{CertFile: certFile, KeyFile: keyFile})
	client := httpsClient(ca.Pool())
	grpcCreds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})

	// HTTPS: operational endpoints, and REST through the gateway.
	resp, err := client.Get("https://" + srv.HTTPAddr() + "/healthz/live")
	if err != nil {
		t.Fatalf("HTTPS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Errorf("HTTPS /healthz/live: got %d over HTTP/%d, want 200 over HTTP/2", resp.StatusCode, resp.ProtoMajor)
	}
	if code, serial, err := publishREST(t, client, srv.HTTPAddr(), 1); err != nil || code != 200 || serial.Cmp(first.Serial) != 0 {
		t.Fatalf("REST publish over HTTPS: got %d, serial %v, %v; want 200, serial %v", code, serial, err, first.Serial)
	}
	// gRPC over TLS.
	if serial, err := publishGRPC(t, srv.GRPCAddr(), grpcCreds, 2); err != nil || serial.Cmp(first.Serial) != 0 {
		t.Fatalf("gRPC publish over TLS: got serial %v, %v; want serial %v", serial, err, first.Serial)
	}

	// Plaintext is refused on both.
	resp, err = http.Get("http://" + srv.HTTPAddr() + "/healthz/live")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP: got %d, want 400 (client sent HTTP to an HTTPS server)", resp.StatusCode)
		}
	}
	if _, err := publishGRPC(t, srv.GRPCAddr(), insecure.NewCredentials(), 3); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext gRPC: got %v, want code Unavailable", err)
	}
	// A client that does not trust the CA is refused too.
	if _, err := http.Get("https://" + srv.HTTPAddr() + "/healthz/live"); err == nil {
		t.Error("HTTPS with the system roots: got no error, want an unknown authority")
	}

	// The certificate files are replaced: new connections get the new one.
	second := ca.Issue(t, "meterd", "127.0.0.1")
	second.Write(t, certFile, keyFile)
	time.Sleep(10 * time.Millisecond) // CheckEvery is 1ms
	if code, serial, err := publishREST(t, client, srv.HTTPAddr(), 4); err != nil || code != 200 || serial.Cmp(second.Serial) != 0 {
		t.Errorf("REST publish after the renewal: got %d, serial %v, %v; want 200, serial %v", code, serial, err, second.Serial)
	}
	if serial, err := publishGRPC(t, srv.GRPCAddr(), grpcCreds, 5); err != nil || serial.Cmp(second.Serial) != 0 {
		t.Errorf("gRPC publish after the renewal: got serial %v, %v; want serial %v", serial, err, second.Serial)
	}
}

func TestMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "api")
	certFile, keyFile := ca.Issue(t, "meterd", "127.0.0.1").Files(t)
	srv := tlsServer(t, tlsfiles.Server{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.CertFile})
	clientCert := ca.Issue(t, "billing-job").TLS(t)
	stranger := certtest.NewCA(t, "other").Issue(t, "billing-job").TLS(t)

	tests := []struct {
		name    string
		certs   []tls.Certificate
		wantErr bool
	}{
		{"no client certificate", nil, true},
		{"client certificate of another CA", []tls.Certificate{stranger}, true},
		{"client certificate of the client CA", []tls.Certificate{clientCert}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, err := publishREST(t, httpsClient(ca.Pool(), tt.certs...), srv.HTTPAddr(), 10+i)
			if tt.wantErr != (err != nil) || (err == nil && code != 200) {
				t.Errorf("REST: got %d, %v; want error: %v", code, err, tt.wantErr)
			}
			_, err = publishGRPC(t, srv.GRPCAddr(), credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: tt.certs}), 20+i)
			if tt.wantErr != (err != nil) {
				t.Errorf("gRPC: got %v; want error: %v", err, tt.wantErr)
			}
		})
	}
}
