// Package scripts holds the tests of the repository's shell scripts.
package scripts

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// requireTools skips without ClickHouse, except under CI=true, where the
// test must run.
func requireTools(t *testing.T) {
	t.Helper()
	for _, p := range []string{"/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"} {
		if _, err := os.Stat(p); err == nil {
			return
		}
	}
	if _, err := exec.LookPath("clickhouse-server"); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("clickhouse-server is required under CI=true")
	}
	t.Skip("clickhouse-server not installed")
}

// buildBinaries builds the commands the demo runs into a temporary folder.
func buildBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("go", "build", "-o", bin+"/", "../cmd/meterd", "../cmd/meterctl", "../cmd/gpu-agent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// demo is one `make run`: the script with its own ports and data; events
// and days 0 keep the script's defaults (the history `make run` replays).
type demo struct {
	bin, data, http, grpc, kafka string
	events, days                 int
}

func (d demo) command(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "run-demo.sh")
	cmd.Env = append(os.Environ(), "BIN="+d.bin, "DATA="+d.data, "METER_HTTP_ADDR="+d.http, "METER_GRPC_ADDR="+d.grpc,
		"METER_KAFKA_BROKERS="+d.kafka, "DEMO_WAIT=5m")
	if d.events > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("DEMO_EVENTS=%d", d.events))
	}
	if d.days > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("DEMO_DAYS=%d", d.days))
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	return cmd
}

// run runs the demo until it says meterd keeps running, calls each of
// meanwhile with what it printed (meterd still running, as a user finds it
// after make run), then stops it as Ctrl-C would, and returns what it
// printed.
func (d demo) run(t *testing.T, meanwhile ...func(out string)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := d.command(ctx)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	sc := bufio.NewScanner(out)
	done := false
	for sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "meterd keeps running") {
			done = true
			break
		}
	}
	// Keep reading what it prints while meanwhile runs.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for sc.Scan() {
		}
	}()
	if done {
		for _, f := range meanwhile {
			f(stdout.String())
		}
	}
	stopped := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	<-drained
	werr := cmd.Wait()
	if !done {
		log, _ := os.ReadFile(d.data + ".log")
		t.Fatalf("the demo ended before it finished (%v):\n%s\nstderr:\n%s\nmeterd log tail:\n%s", werr, stdout.String(), stderr.String(), tail(log, 3000))
	}
	t.Logf("demo stopped %s after SIGTERM", time.Since(stopped).Round(100*time.Millisecond))
	return stdout.String()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// tableRows returns the lines of the table printed after the heading that
// starts with heading, up to the next blank line, header line excluded.
func tableRows(out, heading string) []string {
	var rows []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, heading):
			in = true
		case in && strings.TrimSpace(line) == "":
			if len(rows) > 0 {
				return rows[1:]
			}
		case in && !strings.HasPrefix(line, "==") && !strings.Contains(line, "stopped changing"):
			rows = append(rows, line)
		}
	}
	if len(rows) > 0 {
		return rows[1:]
	}
	return nil
}

func checkTables(t *testing.T, out string) {
	t.Helper()
	for _, heading := range []string{
		"== usage of the last 24 hours", "== latency by model", "== goodput by model",
		"== GPU usage and cost by deployment", "== GPU cost allocated to tenants",
		"== GPU cost by deployment over the", "== engine saturation by deployment", "== capacity report by deployment",
		"== billing period", "== closed statement of tenant acme",
	} {
		if rows := tableRows(out, heading); len(rows) == 0 {
			t.Errorf("%q printed no rows:\n%s", heading, out)
		}
	}
}

// cells splits a table row into its cells (two spaces or more apart).
func cells(row string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(row), -1)
}

// checkHeadlines checks what the demo must show on a fresh data directory:
// every deployment of the capacity report with a sustainable throughput,
// headroom, GPUs needed and weekly growth; the saturated deployment short
// of GPUs (negative headroom, more GPUs needed) and the idle one
// over-provisioned; last month's statement closed, with its lines; the
// exports written under the data directory.
func checkHeadlines(t *testing.T, out, data string) {
	t.Helper()
	rows := tableRows(out, "== capacity report by deployment")
	head := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "UNIT ") {
			head = line
		}
	}
	cols := cells(head)
	col := func(row []string, name string) string {
		for i, c := range cols {
			if c == name && i < len(row) {
				return row[i]
			}
		}
		t.Fatalf("capacity table has no column %s: %q", name, head)
		return ""
	}
	units := map[string][]string{}
	for _, r := range rows {
		if strings.HasPrefix(r, "Findings:") {
			break
		}
		c := cells(r)
		units[c[0]] = c
	}
	for _, dep := range []string{"llama-70b-h200-use1", "qwen-72b-h200-euw1", "r1-70b-h100-use1", "llama-8b-l4-use1", "mixtral-a100-usw2"} {
		row, ok := units[dep]
		if !ok || len(row) != len(cols) {
			t.Errorf("capacity table: deployment %s missing or malformed (%q; columns %q)", dep, row, cols)
			continue
		}
		for _, name := range []string{"SUSTAINABLE TOK/S/GPU", "HEADROOM", "GPUS NEEDED", "WEEKLY GROWTH"} {
			if v := col(row, name); v == "" || v == "-" {
				t.Errorf("capacity table: %s has no %s: %q", dep, name, row)
			}
		}
	}
	if row, ok := units["llama-70b-h200-use1"]; ok && len(row) == len(cols) {
		if h := col(row, "HEADROOM"); !strings.HasPrefix(h, "-") {
			t.Errorf("the saturated deployment has headroom %s, want a negative one", h)
		}
		if n := col(row, "GPUS NEEDED"); !strings.Contains(n, "(+") {
			t.Errorf("the saturated deployment needs %q GPUs, want more than it has", n)
		}
	}
	// The fleet plan: each deployment's forecast peak priced on its GPU
	// type (the demo's types are the price book's), a mix for each, and the
	// fleet's sum.
	for _, dep := range []string{"llama-70b-h200-use1", "qwen-72b-h200-euw1", "r1-70b-h100-use1", "llama-8b-l4-use1", "mixtral-a100-usw2"} {
		if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(dep) + `: forecast peak [0-9-]+: [0-9,.]+ tokens/s\n(    .*\n)*?    cheapest mix: (at most )?[0-9,]+ × `).MatchString(out) {
			t.Errorf("the fleet plan has no forecast peak and cheapest mix for %s", dep)
		}
	}
	if !regexp.MustCompile(`(?m)^  fleet: .* GPUs for 5 deployment\(s\), (at most )?USD [0-9,.]+ per hour$`).MatchString(out) {
		t.Errorf("the fleet plan has no fleet line for the 5 deployments:\n%s", out)
	}
	if !regexp.MustCompile(`\[over provisioned\] mixtral-a100-usw2: `).MatchString(out) {
		t.Errorf("the idle deployment is not found over-provisioned:\n%s", out)
	}
	m := regexp.MustCompile(`(?m)^Statement of acme for (\d{4}-\d{2}) \(.*\): closed `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no closed statement of acme:\n%s", out)
	}
	if !strings.Contains(out, "\nHash ") || !strings.Contains(out, "\nFinance: allocated GPU cost ") {
		t.Errorf("the closed statement has no hash or finance part:\n%s", out)
	}
	// The statement's lines: from its heading to the exports' note.
	section := out[max(0, strings.Index(out, "== closed statement of tenant acme")):]
	section = section[:max(0, strings.Index(section, "\n(every tenant's statement lines"))]
	lines := 0
	for _, r := range strings.Split(section, "\n") {
		if strings.HasPrefix(r, "usage ") {
			lines++
		}
	}
	if lines == 0 {
		t.Errorf("the closed statement has no usage lines:\n%s", out)
	}
	for _, f := range []string{"exports/statements-" + m[1] + ".csv", "exports/statements-" + m[1] + ".focus.csv", "capacity.html"} {
		if st, err := os.Stat(filepath.Join(data, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s was not written under the data directory: %v", f, err)
		}
	}
	if m := regexp.MustCompile(`gross margin (-?[0-9.]+)%`).FindStringSubmatch(out); m == nil {
		t.Errorf("no gross margin printed:\n%s", out)
	} else if v, _ := strconv.ParseFloat(m[1], 64); v < 30 || v > 70 {
		t.Errorf("gross margin %s%%, want a real provider's 30-70%%", m[1])
	}
	if took := regexp.MustCompile(`The tables above took (\d+) s`).FindStringSubmatch(out); took != nil {
		t.Logf("the demo printed its tables %s s after meterd was ready", took[1])
	}
}

// TestDemoOnUsedDataDir runs `make run`'s script on a fresh data directory
// (the whole history `make run` replays): it prints every table, every
// capacity figure and last month's closed statement (checkHeadlines).
// Then, after a meterd start killed halfway, it runs again on a day of
// traffic: the tables are there again (last month's close answers the
// same statements), and the run says that earlier events are counted.
func TestDemoOnUsedDataDir(t *testing.T) {
	requireTools(t)
	d := demo{bin: buildBinaries(t), data: filepath.Join(t.TempDir(), "data"),
		http: freeAddr(t), grpc: freeAddr(t), kafka: freeAddr(t)}

	// The footprint is sampled from the start to after the README's
	// commands and the dashboard, as a user would run them.
	fp := sampleFootprint(d.data)
	defer fp.end()
	out := d.run(t, func(string) {
		t.Run("README", func(t *testing.T) { runDocBlocks(t, "../README.md", d) })
		t.Run("dashboard", func(t *testing.T) { screenshotDashboard(t, d) })
		fp.end()
	})
	t.Logf("footprint, %d samples 1 s apart: data directory peak %.1f MiB on disk (at %s), dev ClickHouse RSS peak %.1f MiB (at %s)",
		fp.samples, float64(fp.peakData)/(1<<20), fp.atData.Round(time.Second), float64(fp.peakRSS)/(1<<20), fp.atRSS.Round(time.Second))
	if fp.peakData > maxDataBytes {
		t.Errorf("the data directory reached %.1f MiB on disk, over %d MiB", float64(fp.peakData)/(1<<20), maxDataBytes>>20)
	}
	if fp.peakRSS > maxCHRSS {
		t.Errorf("the dev ClickHouse reached %.1f MiB resident, over 1 GiB", float64(fp.peakRSS)/(1<<20))
	}
	if fp.peakRSS == 0 {
		t.Errorf("the dev ClickHouse's memory was never sampled (no clickhouse/clickhouse.pid in %s?)", d.data)
	}
	checkTables(t, out)
	checkHeadlines(t, out, d.data)
	if strings.Contains(out, "holds the events of earlier runs") {
		t.Errorf("a fresh data directory was said to hold earlier events:\n%s", out)
	}
	if t.Failed() {
		return
	}

	// An aborted start: meterd killed while it starts its ClickHouse.
	m := exec.Command(filepath.Join(d.bin, "meterd"), "--dev", "--data-dir", d.data, "--http-addr", d.http,
		"--grpc-addr", d.grpc, "--kafka-brokers", d.kafka)
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	m.Process.Kill()
	m.Wait()

	d.events, d.days = 2000, 1
	out = d.run(t)
	checkTables(t, out)
	if !strings.Contains(out, "holds the events of earlier runs") {
		t.Errorf("the second run did not say that earlier events are counted:\n%s", out)
	}
	if _, err := os.Stat(d.data + ".log.1"); err != nil {
		t.Errorf("the previous run's log was not kept: %v", err)
	}
}

// With a port taken by another program, the script says which and how to
// choose another, and starts nothing.
func TestDemoPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := demo{bin: t.TempDir(), data: filepath.Join(t.TempDir(), "data"),
		http: ln.Addr().String(), grpc: freeAddr(t), kafka: freeAddr(t), events: 10}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := d.command(ctx)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the demo started with its HTTP port taken:\n%s", out)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, want := range []string{"port " + port, "METER_HTTP_ADDR", "is taken"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not mention %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(d.data); err == nil {
		t.Errorf("the data directory was created although nothing started")
	}
}
