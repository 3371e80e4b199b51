package gpu

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/gpu")

const testdataDir = "../../testdata/gpu"

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// goldenReading is the golden form of an exporterReading.
type goldenReading struct {
	Sample          json.RawMessage `json:"sample"`
	EnergyCounterMJ *float64        `json:"energy_counter_mj,omitempty"`
}

func TestParseExporterGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdataDir, "exporter-*.prom"))
	if err != nil || len(files) < 4 {
		t.Fatalf("exporter scrapes in %s: %v, %v", testdataDir, files, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := parseExporter(f)
			if err != nil {
				t.Fatalf("parseExporter: %v", err)
			}
			golden := strings.TrimSuffix(file, ".prom") + ".golden.json"
			if *update {
				writeGolden(t, golden, got)
			}
			want := readGolden(t, golden)
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(exporterReading{}), protocmp.Transform()); diff != "" {
				t.Errorf("readings differ from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func writeGolden(t *testing.T, path string, readings []exporterReading) {
	t.Helper()
	out := make([]goldenReading, 0, len(readings))
	for _, r := range readings {
		b, err := protojson.Marshal(r.sample)
		if err != nil {
			t.Fatal(err)
		}
		g := goldenReading{Sample: b}
		if r.hasEnergy {
			e := r.energyMJ
			g.EnergyCounterMJ = &e
		}
		out = append(out, g)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readGolden(t *testing.T, path string) []exporterReading {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	var in []goldenReading
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := make([]exporterReading, 0, len(in))
	for _, g := range in {
		m := &meterv1.GpuSample{}
		if err := protojson.Unmarshal(g.Sample, m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		r := exporterReading{sample: m}
		if g.EnergyCounterMJ != nil {
			r.energyMJ, r.hasEnergy = *g.EnergyCounterMJ, true
		}
		out = append(out, r)
	}
	return out
}

// TestParseExporterRules checks the mapping rules one by one on small
// expositions, independently of the golden files.
func TestParseExporterRules(t *testing.T) {
	const h100 = `modelName="NVIDIA H100 80GB HBM3"`
	tests := []struct {
		name string
		text string
		want []*meterv1.GpuSample
	}{
		{
			name: "GR_ENGINE_ACTIVE wins over GPU_UTIL",
			text: `DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-a",` + h100 + `,Hostname="n1"} 0.25
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-a",` + h100 + `,Hostname="n1"} 90
`,
			want: []*meterv1.GpuSample{{Node: "n1", GpuUuid: "GPU-a", GpuIndex: 1, GpuType: "H100-SXM-80GB", Utilization: 0.25}},
		},
		{
			name: "GPU_UTIL percent when GR_ENGINE_ACTIVE is absent; ratio clamped",
			text: `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",hostname="n2"} 45
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b",hostname="n2"} 1.0000003
`,
			want: []*meterv1.GpuSample{
				{Node: "n2", GpuUuid: "GPU-a", Utilization: 0.45},
				{Node: "n2", GpuUuid: "GPU-b", GpuIndex: 1, Utilization: 1},
			},
		},
		{
			name: "SM activity and the maximum SM clock where the exporter's counters include them",
			text: `DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",` + h100 + `} 0.8
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",` + h100 + `} 0.55
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",` + h100 + `} 1500
DCGM_FI_DEV_MAX_SM_CLOCK{gpu="0",UUID="GPU-a",` + h100 + `} 1980
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b",` + h100 + `} 0.3
`,
			want: []*meterv1.GpuSample{
				{GpuUuid: "GPU-a", GpuType: "H100-SXM-80GB", Utilization: 0.8, SmActive: proto.Float64(0.55), SmClockMhz: 1500, SmClockMaxMhz: 1980},
				{GpuUuid: "GPU-b", GpuIndex: 1, GpuType: "H100-SXM-80GB", Utilization: 0.3},
			},
		},
		{
			name: "framebuffer total is used+free+reserved, in bytes",
			text: `DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 1000
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 2000
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-a"} 24
`,
			want: []*meterv1.GpuSample{{GpuUuid: "GPU-a", FbUsedBytes: 1000 << 20, FbTotalBytes: 3024 << 20}},
		},
		{
			name: "direct scrape: pod and namespace name the workload; empty labels are absent",
			text: `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pod="",namespace=""} 1
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="web-x2k4q",namespace="ns"} 1
`,
			want: []*meterv1.GpuSample{
				{GpuUuid: "GPU-a", Utilization: 0.01},
				{GpuUuid: "GPU-b", GpuIndex: 1, Pod: "web-x2k4q", Namespace: "ns", Utilization: 0.01},
			},
		},
		{
			name: "renamed scrape: exported_ forms win, plain pod is the exporter's",
			text: `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pod="dcgm-exporter-abcde",namespace="gpu-operator",exported_pod="llm-6f7b8c9d5-x2k4q",exported_namespace="prod"} 10
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="dcgm-exporter-abcde",namespace="gpu-operator"} 20
`,
			want: []*meterv1.GpuSample{
				{GpuUuid: "GPU-a", Pod: "llm-6f7b8c9d5-x2k4q", Namespace: "prod", Utilization: 0.1},
				{GpuUuid: "GPU-b", GpuIndex: 1, Utilization: 0.2},
			},
		},
		{
			name: "MIG: card-wide power split by fraction; a whole-GPU series of a MIG card only lends card values",
			text: `DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-m",` + h100 + `} 350
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-m",` + h100 + `} 50
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-m",` + h100 + `,GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"} 0.5
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-m",` + h100 + `,GPU_I_PROFILE="1g.10gb",GPU_I_ID="13"} 0.75
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-m",` + h100 + `,GPU_I_PROFILE="1g.10gb",GPU_I_ID="13"} 51
`,
			want: []*meterv1.GpuSample{
				{GpuUuid: "GPU-m", GpuType: "H100-SXM-80GB", MigProfile: "3g.40gb", MigInstanceId: 2, MigFraction: 3.0 / 7, Utilization: 0.5, PowerWatts: 150, TemperatureC: 50},
				{GpuUuid: "GPU-m", GpuType: "H100-SXM-80GB", MigProfile: "1g.10gb", MigInstanceId: 13, MigFraction: 1.0 / 7, Utilization: 0.75, PowerWatts: 50, TemperatureC: 51},
			},
		},
		{
			name: "A30 MIG has 4 slices",
			text: `DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-c",modelName="NVIDIA A30",GPU_I_PROFILE="2g.12gb",GPU_I_ID="1"} 0.5
`,
			want: []*meterv1.GpuSample{{GpuUuid: "GPU-c", GpuType: "A30-24GB", MigProfile: "2g.12gb", MigInstanceId: 1, MigFraction: 0.5, Utilization: 0.5}},
		},
		{
			name: "series without a UUID and other families are ignored",
			text: `DCGM_FI_DEV_GPU_UTIL{gpu="0"} 10
DCGM_FI_DEV_MEM_CLOCK{gpu="0",UUID="GPU-a"} 2619
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a"} 1980
`,
			want: []*meterv1.GpuSample{{GpuUuid: "GPU-a", SmClockMhz: 1980}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			readings, err := parseExporter(strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			var got []*meterv1.GpuSample
			for _, r := range readings {
				got = append(got, r.sample)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
				t.Errorf("samples (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseExporterErrors(t *testing.T) {
	if _, err := parseExporter(strings.NewReader("# HELP x\nDCGM_FI_DEV_SM_CLOCK{gpu=\"0\",UUID=\"GPU-a\" 1\n")); err == nil {
		t.Error("malformed exposition: got nil error")
	}
	if _, err := parseExporter(strings.NewReader("go_goroutines 12\n")); !errors.Is(err, errNoSeries) {
		t.Errorf("exposition without DCGM series: got %v, want errNoSeries", err)
	}
}

// TestExporterSourceScrapes serves two scrapes of the MIG node over HTTP:
// the first has no energy baseline, the second gives each instance its
// share of the card's counter delta.
func TestExporterSourceScrapes(t *testing.T) {
	first, err := os.ReadFile(filepath.Join(testdataDir, "exporter-mig-h100.prom"))
	if err != nil {
		t.Fatal(err)
	}
	// 10 s later: card 0 used 4,123.4 J, card 1 3,500 J.
	second := strings.NewReplacer("503221987004", "503226110404", "498731002551", "498734502551").Replace(string(first))
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		if calls.Add(1) == 1 {
			w.Write(first)
		} else {
			io.WriteString(w, second)
		}
	}))
	defer srv.Close()

	src, err := NewExporterSource(ExporterConfig{URL: srv.URL + "/metrics"}, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	s1, err := src.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1) != 11 {
		t.Fatalf("got %d samples, want 11 (4 instances of GPU 0, 7 of GPU 1)", len(s1))
	}
	for _, m := range s1 {
		if m.EnergyJoules != 0 {
			t.Errorf("first scrape, %s/%d: got energy %v J, want 0 (no baseline)", m.GpuUuid, m.MigInstanceId, m.EnergyJoules)
		}
	}
	s2, err := src.Sample(ctx)
	if err != nil {
		t.Fatal(err)
	}
	perCard := map[uint32]float64{}
	for _, m := range s2 {
		perCard[m.GpuIndex] += m.EnergyJoules
		if want := map[uint32]float64{0: 4123.4, 1: 3500}[m.GpuIndex] * m.MigFraction; !approx(m.EnergyJoules, want) {
			t.Errorf("GPU %d instance %d (%s): got %v J, want %v", m.GpuIndex, m.MigInstanceId, m.MigProfile, m.EnergyJoules, want)
		}
	}
	if !approx(perCard[0], 4123.4) || !approx(perCard[1], 3500) {
		t.Errorf("energy summed over instances: got %v, want 4123.4 J and 3500 J (every slice is carved)", perCard)
	}

	bad, err := NewExporterSource(ExporterConfig{URL: srv.URL + "/nope"}, discard())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Sample(ctx); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("scrape of a 404: got %v, want an error naming HTTP 404", err)
	}
}

func TestExporterSourceNodeOverride(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="dcgm-exporter-x2k4q"} 10`)
	}))
	defer srv.Close()
	src, err := NewExporterSource(ExporterConfig{URL: srv.URL, Node: "node-7"}, discard())
	if err != nil {
		t.Fatal(err)
	}
	got, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Node != "node-7" {
		t.Errorf("got %v, want one sample of node-7", got)
	}
}

func TestNewExporterSourceRejectsBadURL(t *testing.T) {
	for _, u := range []string{"localhost:9400/metrics", "ftp://x/metrics", "http://"} {
		if _, err := NewExporterSource(ExporterConfig{URL: u}, discard()); err == nil {
			t.Errorf("URL %q: got nil error", u)
		}
	}
}

func approx(a, b float64) bool {
	d := a - b
	return d < 1e-6 && d > -1e-6
}
