package main

// meterbench bombs (make bench-bombs) sends the ingest requests that once
// took gigabytes, a 16 MB body of millions of empty events or spans, to a
// real meterd --dev on every ingest path, alone and 16 at once, and reports
// each answer, how long it took and meterd's peak memory (VmHWM).

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"tokenmeter/internal/adapter/devenv"
	"tokenmeter/internal/logsetup"
)

// bomb is one kind of request: its body, and how it is sent.
type bomb struct {
	name, what string
	body       func() []byte
	send       func(ctx context.Context, m *bombMeterd, body []byte) (answer string, err error)
}

func bombs() []bomb {
	repeat := func(open, elem, close string, n int) func() []byte {
		return func() []byte {
			b := make([]byte, 0, len(open)+n*(len(elem)+1)+len(close))
			b = append(b, open...)
			for i := range n {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, elem...)
			}
			return append(b, close...)
		}
	}
	// Protobuf: n empty messages in field num, inside the given wrappers
	// (field numbers, outermost first).
	emptyRepeated := func(num byte, n int, wrappers ...byte) func() []byte {
		return func() []byte {
			b := bytes.Repeat([]byte{num<<3 | 2, 0}, n)
			for _, w := range slices.Backward(wrappers) {
				b = append(appendVarint([]byte{w<<3 | 2}, len(b)), b...)
			}
			return b
		}
	}
	return []bomb{
		{"rest", "POST /v1/events, 5.5M empty events (JSON)", repeat(`{"events":[`, `{}`, `]}`, 5_500_000), postTo("http", "/v1/events", "application/json")},
		{"grpc", "gRPC PublishEvents, 8M empty events", emptyRepeated(1, 8_000_000), invokeOn("grpc", "/tokenmeter.v1.IngestService/PublishEvents")},
		{"otlp-json", "OTLP/HTTP JSON, 5.5M empty spans", repeat(`{"resourceSpans":[{"scopeSpans":[{"spans":[`, `{}`, `]}]}]}`, 5_500_000), postTo("otlp-http", "/v1/traces", "application/json")},
		{"otlp-proto", "OTLP/HTTP protobuf, 8M empty spans", emptyRepeated(2, 8_000_000, 1, 2), postTo("otlp-http", "/v1/traces", "application/x-protobuf")},
		{"otlp-grpc", "OTLP/gRPC, 8M empty spans", emptyRepeated(2, 8_000_000, 1, 2), invokeOn("otlp-grpc", "/opentelemetry.proto.collector.trace.v1.TraceService/Export")},
	}
}

func appendVarint(b []byte, n int) []byte {
	for n >= 0x80 {
		b = append(b, byte(n)|0x80)
		n >>= 7
	}
	return append(b, byte(n))
}

// postTo sends the body over HTTP to one of meterd's listeners.
func postTo(listener, path, contentType string) func(context.Context, *bombMeterd, []byte) (string, error) {
	return func(ctx context.Context, m *bombMeterd, body []byte) (string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+m.addrs[listener]+path, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+m.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return strconv.Itoa(resp.StatusCode), nil
	}
}

// invokeOn sends the body as a gRPC message to one of meterd's listeners.
func invokeOn(listener, method string) func(context.Context, *bombMeterd, []byte) (string, error) {
	return func(ctx context.Context, m *bombMeterd, body []byte) (string, error) {
		conn, err := grpc.NewClient(m.addrs[listener], grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+m.key)
		var out []byte
		err = conn.Invoke(ctx, method, &body, &out, grpc.ForceCodecV2(bytesCodec{}))
		return status.Code(err).String(), nil
	}
}

// bytesCodec sends and receives messages as bytes, undecoded.
type bytesCodec struct{}

func (bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (bytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (bytesCodec) Name() string { return "proto" }

func runBombs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("meterbench bombs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("meterd", "bin/meterd", "meterd binary to measure (make build)")
	cases := fs.String("cases", "rest,grpc,otlp-json,otlp-proto,otlp-grpc", "requests to send (comma-separated)")
	concurrency := fs.String("concurrency", "1,16", "requests sent at once, one meterd per case and count (comma-separated)")
	memLimit := fs.Int("memory-limit-mib", 256, "meterd --memory-limit-mib (the Helm chart's api value)")
	rssCap := fs.Int("rss-cap-mib", 3072, "kill meterd when its RSS passes this (an unbounded build would take the machine)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(*bin); err != nil {
		return fmt.Errorf("meterd binary: %w (run make build)", err)
	}
	var counts []int
	for _, s := range strings.Split(*concurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("--concurrency %q: want positive counts", *concurrency)
		}
		counts = append(counts, n)
	}
	all := bombs()
	var chosen []bomb
	for _, name := range strings.Split(*cases, ",") {
		i := slices.IndexFunc(all, func(b bomb) bool { return b.name == strings.TrimSpace(name) })
		if i < 0 {
			return fmt.Errorf("--cases: no case %q", name)
		}
		chosen = append(chosen, all[i])
	}
	dir, err := os.MkdirTemp("", "meterbench-bombs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ch, err := devenv.StartClickHouse(ctx, devenv.ClickHouseConfig{Dir: filepath.Join(dir, "clickhouse"), Logger: logsetup.Warnings(stderr)})
	if err != nil {
		return err
	}
	defer ch.Stop(context.WithoutCancel(ctx))

	fmt.Fprintf(stdout, "meterbench bombs: %s, --memory-limit-mib %d; peak memory is meterd's VmHWM, base its VmHWM when ready\n", *bin, *memLimit)
	fmt.Fprintf(stdout, "%-11s %-42s %5s %9s %7s %9s  %s\n", "case", "request", "bytes", "at once", "base", "peak", "answers (slowest)")
	for _, b := range chosen {
		body := b.body()
		for _, n := range counts {
			fmt.Fprintf(stderr, "meterbench: %s x%d\n", b.name, n)
			m, err := startBombMeterd(ctx, *bin, filepath.Join(dir, fmt.Sprintf("%s-%d", b.name, n)), ch.Addr(), *memLimit)
			if err != nil {
				return err
			}
			res := m.fire(ctx, b, body, n, int64(*rssCap)<<20)
			m.stop()
			fmt.Fprintf(stdout, "%-11s %-42s %4.1fM %9d %6.0fM %8s  %s\n", b.name, b.what, float64(len(body))/1e6, n,
				float64(m.base)/(1<<20), res.peak, res.answers)
		}
	}
	return nil
}

// bombMeterd is a meterd --dev with its OTLP receivers, on free ports.
type bombMeterd struct {
	cmd   *exec.Cmd
	addrs map[string]string
	key   string
	base  int64 // VmHWM once ready
	log   *bytes.Buffer
}

func startBombMeterd(ctx context.Context, bin, dir, chAddr string, memLimit int) (*bombMeterd, error) {
	m := &bombMeterd{addrs: map[string]string{"http": freeAddr(), "grpc": freeAddr(), "otlp-http": freeAddr(), "otlp-grpc": freeAddr()}, log: &bytes.Buffer{}}
	m.cmd = exec.CommandContext(ctx, bin, "--dev", "--data-dir", dir, "--clickhouse", chAddr, "--kafka-brokers", freeAddr(),
		"--http-addr", m.addrs["http"], "--grpc-addr", m.addrs["grpc"], "--otlp-http-addr", m.addrs["otlp-http"], "--otlp-grpc-addr", m.addrs["otlp-grpc"],
		"--memory-limit-mib", strconv.Itoa(memLimit), "--log-level", "warn")
	m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start meterd: %w", err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get("http://" + m.addrs["http"] + "/healthz/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			m.stop()
			return nil, fmt.Errorf("meterd not ready after 2 min:\n%s", m.log)
		}
	}
	key, err := os.ReadFile(filepath.Join(dir, "keys", "ingest.key"))
	if err != nil {
		m.stop()
		return nil, err
	}
	m.key = strings.TrimSpace(string(key))
	m.base = vm(m.cmd.Process.Pid, "VmHWM")
	return m, nil
}

func (m *bombMeterd) stop() {
	m.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { m.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		m.cmd.Process.Kill()
		<-done
	}
}

type bombResult struct {
	peak, answers string
}

// fire sends n copies of body at once and waits for every answer; meterd
// is killed if its RSS passes rssCap.
func (m *bombMeterd) fire(ctx context.Context, b bomb, body []byte, n int, rssCap int64) bombResult {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	killed := make(chan struct{})
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if vm(m.cmd.Process.Pid, "VmRSS") > rssCap {
					m.cmd.Process.Kill()
					close(killed)
					return
				}
			}
		}
	}()
	type answer struct {
		what string
		took time.Duration
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			a, err := b.send(ctx, m, body)
			if err != nil {
				a = "error: " + firstLine(err.Error())
			}
			answers[i] = answer{a, time.Since(start)}
		})
	}
	wg.Wait()
	peak := vm(m.cmd.Process.Pid, "VmHWM")
	res := bombResult{peak: fmt.Sprintf("%.0fM", float64(peak)/(1<<20))}
	select {
	case <-killed:
		res.peak = fmt.Sprintf(">%dM", rssCap>>20)
	default:
	}
	byAnswer := map[string]int{}
	var slowest time.Duration
	for _, a := range answers {
		byAnswer[a.what]++
		slowest = max(slowest, a.took)
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(byAnswer)) {
		parts = append(parts, fmt.Sprintf("%d × %s", byAnswer[k], k))
	}
	res.answers = fmt.Sprintf("%s (%s)", strings.Join(parts, ", "), slowest.Round(time.Millisecond))
	return res
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}

// vm is procStatus's field in bytes, 0 once the process is gone.
func vm(pid int, field string) int64 {
	n, _ := procStatus(pid, field)
	return int64(n)
}
