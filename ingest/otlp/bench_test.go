package otlp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"tokenmeter/ingest"
	"tokenmeter/ingest/otlp"
	"tokenmeter/internal/adapter/devenv"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// spansPerExport is the SDK's default batch (BatchSpanProcessor's
// max export batch size).
const spansPerExport = 512

// benchRequest is one export of 512 GenAI chat spans, the resource of a
// gateway and the attributes an instrumentation sets, with span ids
// starting at first.
func benchRequest(first uint64) *coltracepb.ExportTraceServiceRequest {
	end := time.Now()
	spans := make([]*tracepb.Span, spansPerExport)
	for i := range spans {
		sp := chatSpan(str("gen_ai.response.id", "chatcmpl-0123456789"), num("gen_ai.request.max_tokens", 512),
			dbl("gen_ai.request.temperature", 0.7), str("gen_ai.response.finish_reasons", "stop"),
			str("server.address", "api.example.com"), num("server.port", 443))
		sp.SpanId = binary.BigEndian.AppendUint64(nil, first+uint64(i)+1)
		sp.TraceId = append(binary.BigEndian.AppendUint64(nil, 7), sp.SpanId...)
		sp.StartTimeUnixNano, sp.EndTimeUnixNano = uint64(end.Add(-2*time.Second).UnixNano()), uint64(end.UnixNano())
		spans[i] = sp
	}
	return request([]*commonpb.KeyValue{str("service.name", "chat-gw"), str("host.name", "gw-1"),
		str("cloud.region", "eu-west-1"), str("telemetry.sdk.language", "python")}, spans...)
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time of this process per span since start:
// the figure that holds on a busy machine, where spans/s depends on the
// share of the cores the benchmark gets.
func reportCPU(b *testing.B, start time.Duration, spans int) {
	b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(spans), "cpu-µs/span")
}

// BenchmarkConvert is the mapping alone.
func BenchmarkConvert(b *testing.B) {
	req := benchRequest(0)
	b.ReportAllocs()
	for b.Loop() {
		if bt := (otlp.Mapping{}).Convert(req, ""); len(bt.Events) != spansPerExport {
			b.Fatalf("%d events, rejected %v", len(bt.Events), bt.Rejected[:1])
		}
	}
	b.ReportMetric(float64(b.N*spansPerExport)/b.Elapsed().Seconds(), "spans/s")
}

// BenchmarkConvertWire is the mapping read from the wire.
func BenchmarkConvertWire(b *testing.B) {
	data := encode(b, "application/x-protobuf", benchRequest(0))
	b.ReportAllocs()
	for b.Loop() {
		bt, err := (otlp.Mapping{}).ConvertWire(data, "")
		if err != nil || len(bt.Events) != spansPerExport {
			b.Fatalf("%d events, %v", len(bt.Events), err)
		}
	}
	b.ReportMetric(float64(b.N*spansPerExport)/b.Elapsed().Seconds(), "spans/s")
}

// BenchmarkUnmarshalConvert is proto.Unmarshal and Convert, the path of
// the protobuf receivers before ConvertWire (and of JSON, after its own
// decoding).
func BenchmarkUnmarshalConvert(b *testing.B) {
	data := encode(b, "application/x-protobuf", benchRequest(0))
	b.ReportAllocs()
	for b.Loop() {
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			b.Fatal(err)
		}
		if bt := (otlp.Mapping{}).Convert(&req, ""); len(bt.Events) != spansPerExport {
			b.Fatalf("%d events", len(bt.Events))
		}
	}
	b.ReportMetric(float64(b.N*spansPerExport)/b.Elapsed().Seconds(), "spans/s")
}

// validating is a publisher that does what ingest.Publisher does before
// Kafka: validate and encode each event; then it drops them.
type validating struct{ limits ingest.Limits }

func (v validating) Publish(_ context.Context, events []*meterv1.InferenceEvent) (int, []ingest.Rejected, error) {
	now := time.Now()
	for _, ev := range events {
		if err := v.limits.Validate(ev, now); err != nil {
			panic(err)
		}
	}
	return len(events), nil, nil
}

// BenchmarkHTTPExport posts exports of 512 spans (protobuf, gzip as
// exporters send by default, or not, and OTLP JSON) from concurrent clients to the
// OTLP/HTTP receiver: decoding, conversion and publishing into a
// validating publisher ("validate"), or into ingest.Publisher writing to
// an in-process Kafka broker with acks=all ("kafka").
func BenchmarkHTTPExport(b *testing.B) {
	for _, pubName := range []string{"validate", "kafka"} {
		for _, format := range []string{"protobuf", "protobuf+gzip", "json"} {
			ct, gz := "application/x-protobuf", format == "protobuf+gzip"
			if format == "json" {
				ct = "application/json"
			}
			b.Run(pubName+"/"+format, func(b *testing.B) {
				var pub otlp.Publisher = validating{ingest.DefaultLimits()}
				if pubName == "kafka" {
					broker, err := devenv.StartKafka(devenv.KafkaConfig{Addr: "127.0.0.1:0", Topics: []string{ingest.DefaultEventsTopic}})
					if err != nil {
						b.Fatal(err)
					}
					defer broker.Close()
					p, err := ingest.NewPublisher(ingest.PublisherConfig{Brokers: []string{broker.Addr()}}, prometheus.NewRegistry(),
						slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
					if err != nil {
						b.Fatal(err)
					}
					defer p.Close()
					pub = p
				}
				r := startReceiver(b, pub, otlp.Config{})
				body := encode(b, ct, benchRequest(0))
				enc := ""
				if gz {
					body, enc = gzipped(b, body), "gzip"
				}
				url := "http://" + r.HTTPAddr() + otlp.TracesPath
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				b.SetBytes(int64(len(body)))
				b.SetParallelism(4) // 4 exporters per core
				b.ResetTimer()
				cpu := cpuTime(b)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
						req.Header.Set("Content-Type", ct)
						req.Header.Set("Authorization", "Bearer key-ingest")
						if enc != "" {
							req.Header.Set("Content-Encoding", enc)
						}
						resp, err := client.Do(req)
						if err != nil {
							b.Fatal(err)
						}
						out, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK || (len(out) != 0 && string(out) != "{}") {
							b.Fatalf("got %d %q", resp.StatusCode, out)
						}
					}
				})
				b.ReportMetric(float64(b.N*spansPerExport)/b.Elapsed().Seconds(), "spans/s")
				reportCPU(b, cpu, b.N*spansPerExport)
			})
		}
	}
}

// BenchmarkGRPCExport sends exports of 512 spans from concurrent clients to
// the OTLP/gRPC receiver, into a validating publisher (the clients encode
// each request: their cost is in the CPU per span).
func BenchmarkGRPCExport(b *testing.B) {
	r := startReceiver(b, validating{ingest.DefaultLimits()}, otlp.Config{})
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := coltracepb.NewTraceServiceClient(conn)
	req := benchRequest(0)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer key-ingest")
	b.SetParallelism(4)
	b.ResetTimer()
	cpu := cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Export(ctx, req)
			if err != nil || resp.GetPartialSuccess() != nil {
				b.Fatalf("got %v, %v", resp, err)
			}
		}
	})
	b.ReportMetric(float64(b.N*spansPerExport)/b.Elapsed().Seconds(), "spans/s")
	reportCPU(b, cpu, b.N*spansPerExport)
}
