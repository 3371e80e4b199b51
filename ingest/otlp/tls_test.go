package otlp_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/credentials"

	"tokenmeter/ingest/otlp"
	"tokenmeter/internal/testkit/certtest"
)

// TestTLS: with Config.TLS both receivers serve TLS only, and the SDK's
// exporters reach them over TLS.
func TestTLS(t *testing.T) {
	ca := certtest.NewCA(t, "test CA")
	cert := ca.Issue(t, "meterd", "127.0.0.1")
	pub := &recorder{}
	r, err := otlp.New(otlp.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		TLS: &tls.Config{Certificates: []tls.Certificate{cert.TLS(t)}, MinVersion: tls.VersionTLS12}},
		pub, keySet(t), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	clientTLS := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	headers := map[string]string{"Authorization": "Bearer key-ingest"}
	grpcExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(r.GRPCAddr()), otlptracegrpc.WithHeaders(headers),
		otlptracegrpc.WithTLSCredentials(credentials.NewTLS(clientTLS)), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	httpExp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(r.HTTPAddr()), otlptracehttp.WithHeaders(headers),
		otlptracehttp.WithTLSClientConfig(clientTLS), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	plainExp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(r.HTTPAddr()), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(headers), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
	if err != nil {
		t.Fatal(err)
	}
	spans := sdkSpans(t, 2, acmeResource())
	for name, exp := range map[string]sdktrace.SpanExporter{"grpc": grpcExp, "http": httpExp} {
		if err := exp.ExportSpans(ctx, spans); err != nil {
			t.Errorf("%s over TLS: %v", name, err)
		}
		exp.Shutdown(ctx)
	}
	if err := plainExp.ExportSpans(ctx, spans); err == nil {
		t.Error("plaintext HTTP export accepted by a TLS receiver")
	}
	if got := len(pub.got()); got != 4 {
		t.Errorf("published %d events, want 4", got)
	}
}
