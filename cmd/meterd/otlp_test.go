package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"tokenmeter/internal/testkit/chtest"
)

// TestOTLPFlags: the --otlp-* flags and their checks.
func TestOTLPFlags(t *testing.T) {
	dev := []string{"--dev", "--data-dir", "d"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr []string
	}{
		{"off by default", dev, nil, nil},
		{"both receivers", append(dev, "--otlp-grpc-addr", "127.0.0.1:4317", "--otlp-http-addr", "127.0.0.1:4318", "--otlp-tenant-attribute", "app.customer", "--otlp-ttft-from-e2e"), nil, nil},
		{"from the environment", dev, map[string]string{"METER_OTLP_HTTP_ADDR": "4318"}, []string{`OTLP address "4318"`}},
		{"empty tenant attribute", append(dev, "--otlp-grpc-addr", ":4317", "--otlp-tenant-attribute", ""), nil, []string{"--otlp-tenant-attribute must not be empty"}},
		{"needs the api role", []string{"--role", "ingest", "--clickhouse", "h:9000", "--otlp-http-addr", ":4318"}, nil,
			[]string{"--otlp-grpc-addr and --otlp-http-addr need the api role"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkParse(t, tt.args, tt.env, tt.wantErr)
		})
	}
}

// TestDevOTLP runs meterd --dev with both OTLP receivers: spans made by the
// OpenTelemetry SDK, exported over OTLP/HTTP and again over OTLP/gRPC,
// are counted once each in /v1/usage, with exact tokens.
func TestDevOTLP(t *testing.T) {
	chtest.RequireLocal(t)
	bin := filepath.Join(t.TempDir(), "meterd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	m := &meterd{bin: bin, dir: t.TempDir(), http: freeAddr(t), grpc: freeAddr(t), kafka: freeAddr(t)}
	otlpGRPC, otlpHTTP := freeAddr(t), freeAddr(t)
	m.log = &bytes.Buffer{}
	m.cmd = exec.Command(m.bin, "--dev", "--data-dir", m.dir, "--http-addr", m.http, "--grpc-addr", m.grpc,
		"--kafka-brokers", m.kafka, "--batch-timeout", "100ms", "--log-level", "warn",
		"--otlp-grpc-addr", otlpGRPC, "--otlp-http-addr", otlpHTTP)
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.cmd.Process.Signal(syscall.SIGTERM)
		m.cmd.Wait()
	})
	for deadline := time.Now().Add(90 * time.Second); !m.ready(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("meterd not ready:\n%s", m.log)
		}
	}

	const n = 20
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "gw"), attribute.String("tenant.id", "acme"))))
	end := time.Now()
	var prompt, output int
	for i := range n {
		_, sp := tp.Tracer("t").Start(context.Background(), "chat m", trace.WithTimestamp(end.Add(-time.Second)))
		sp.SetAttributes(attribute.String("gen_ai.operation.name", "chat"), attribute.String("gen_ai.request.model", "m"),
			attribute.Int("gen_ai.usage.input_tokens", 1000+i), attribute.Int("gen_ai.usage.output_tokens", 7*i),
			attribute.Float64("gen_ai.response.time_to_first_chunk", 0.1))
		sp.End(trace.WithTimestamp(end))
		prompt += 1000 + i
		output += 7 * i
	}
	headers := map[string]string{"Authorization": "Bearer " + m.key(t, "ingest")}
	ctx := context.Background()
	httpExp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(otlpHTTP), otlptracehttp.WithInsecure(),
		otlptracehttp.WithHeaders(headers), otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	grpcExp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(otlpGRPC), otlptracegrpc.WithInsecure(), otlptracegrpc.WithHeaders(headers))
	if err != nil {
		t.Fatal(err)
	}
	for _, exp := range []sdktrace.SpanExporter{httpExp, grpcExp} {
		if err := exp.ExportSpans(ctx, rec.Ended()); err != nil {
			t.Fatalf("export: %v\nlog:\n%s", err, m.log)
		}
		exp.Shutdown(ctx)
	}
	from, to := end.Add(-time.Hour), end.Add(time.Hour)
	m.waitUsage(t, from, to, n)
	code, body, err := m.do("GET", fmt.Sprintf("/v1/usage?start=%s&end=%s", from.Format(time.RFC3339), to.Format(time.RFC3339)), m.key(t, "finance"), nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("usage: %d %v", code, err)
	}
	for _, want := range []string{fmt.Sprintf(`"prompt_tokens":"%d"`, prompt), fmt.Sprintf(`"output_tokens":"%d"`, output), `"requests":"20"`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("usage %s: want %s", body, want)
		}
	}
}
