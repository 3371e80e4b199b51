package billing

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the \"want\" of testdata/billing/*.json from the current output")

// goldenFile is one scenario of testdata/billing: a price book, the GPU
// usage and tenant usage of one deployment-hour, the policies to allocate
// with, and the expected cost and allocations, computed by hand (the
// arithmetic is in "why").
type goldenFile struct {
	Why       []string        `json:"why"`
	PriceBook json.RawMessage `json:"price_book"`
	GPUUsage  []goldenUsage   `json:"gpu_usage"`
	Tenants   []TenantUsage   `json:"tenants"`
	Cases     []goldenCase    `json:"cases"`
	Want      goldenWant      `json:"want"`
}

type goldenUsage struct {
	GPUType     string  `json:"gpu_type"`
	Pool        string  `json:"pool"`
	Region      string  `json:"region"`
	MIGFraction float64 `json:"mig_fraction"`
	At          string  `json:"at"`
	GPUSeconds  float64 `json:"gpu_seconds"`
	BusySeconds float64 `json:"busy_seconds"`
}

type goldenCase struct {
	BusyPolicy BusyPolicy `json:"busy_policy"`
	IdlePolicy IdlePolicy `json:"idle_policy"`
}

type goldenWant struct {
	Cost        GPUCost       `json:"cost"`
	Allocations []goldenAlloc `json:"allocations"`
}

type goldenAlloc struct {
	BusyPolicy      BusyPolicy   `json:"busy_policy"`
	IdlePolicy      IdlePolicy   `json:"idle_policy"`
	Unattributed    bool         `json:"unattributed"`
	ZeroBasis       bool         `json:"zero_basis"`
	UnpricedSeconds float64      `json:"unpriced_seconds"`
	Lines           []goldenLine `json:"lines"`
}

type goldenLine struct {
	Tenant string `json:"tenant"`
	Basis  string `json:"basis"`
	Busy   Money  `json:"busy"`
	Idle   Money  `json:"idle"`
	Total  Money  `json:"total"`
}

func TestGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "testdata", "billing", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/billing")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var f goldenFile
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&f); err != nil {
				t.Fatalf("decode: %v", err)
			}
			got := runGolden(t, f)
			if *update {
				f.Want = got
				out, err := json.MarshalIndent(f, "", "  ")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, append(collapseFlatObjects(out), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if diff := cmp.Diff(f.Want, got); diff != "" {
				t.Errorf("output differs from the hand-computed want (-want +got); rerun with -update only if the new output is right:\n%s", diff)
			}
		})
	}
}

// collapseFlatObjects puts each object of indented JSON that holds no
// object or array on one line, so that rows (samples, tenants, lines) read
// as rows.
func collapseFlatObjects(indented []byte) []byte {
	lines := strings.Split(string(indented), "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasSuffix(l, "{") {
			out = append(out, l)
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
		var inner []string
		j := i + 1
		for ; j < len(lines); j++ {
			t := strings.TrimSpace(lines[j])
			if strings.HasPrefix(lines[j], indent+"}") && len(lines[j])-len(strings.TrimLeft(lines[j], " ")) == len(indent) {
				break
			}
			if strings.HasSuffix(t, "{") || strings.HasSuffix(t, "[") {
				j = -1
				break
			}
			inner = append(inner, t)
		}
		if j < 0 || j >= len(lines) {
			out = append(out, l)
			continue
		}
		out = append(out, l+strings.Join(inner, " ")+strings.TrimSpace(lines[j]))
		i = j
	}
	return []byte(strings.Join(out, "\n"))
}

func runGolden(t *testing.T, f goldenFile) goldenWant {
	t.Helper()
	book, err := ParsePriceBook(f.PriceBook)
	if err != nil {
		t.Fatalf("price book: %v", err)
	}
	usage := make([]GPUUsage, len(f.GPUUsage))
	for i, u := range f.GPUUsage {
		at, err := time.Parse(time.RFC3339Nano, u.At)
		if err != nil {
			t.Fatalf("gpu_usage[%d].at: %v", i, err)
		}
		usage[i] = GPUUsage{
			GPUType: u.GPUType, Pool: u.Pool, Region: u.Region, MIGFraction: u.MIGFraction,
			At: at, GPUSeconds: u.GPUSeconds, BusySeconds: u.BusySeconds,
		}
	}
	cost, err := book.GPUCost(usage)
	if err != nil {
		t.Fatalf("GPUCost: %v", err)
	}
	want := goldenWant{Cost: cost, Allocations: []goldenAlloc{}}
	for _, c := range f.Cases {
		p := book.Allocation
		p.Busy, p.Idle = c.BusyPolicy, c.IdlePolicy
		a, err := AllocateHour(cost, f.Tenants, p)
		if err != nil {
			t.Fatalf("AllocateHour(%s, %s): %v", c.BusyPolicy, c.IdlePolicy, err)
		}
		checkReconciles(t, cost, a)
		ga := goldenAlloc{
			BusyPolicy: a.BusyPolicy, IdlePolicy: a.IdlePolicy,
			Unattributed: a.Unattributed, ZeroBasis: a.ZeroBasis, UnpricedSeconds: a.UnpricedSeconds,
			Lines: []goldenLine{},
		}
		for _, l := range a.Lines {
			ga.Lines = append(ga.Lines, goldenLine{Tenant: l.Tenant, Basis: l.Basis.String(), Busy: l.Busy, Idle: l.Idle, Total: l.Total})
		}
		want.Allocations = append(want.Allocations, ga)
	}
	return want
}

// checkReconciles checks the invariants every allocation must keep.
func checkReconciles(t testing.TB, cost GPUCost, a Allocation) {
	t.Helper()
	if cost.BusyCost+cost.IdleCost != cost.Cost {
		t.Errorf("busy %s + idle %s != cost %s", cost.BusyCost, cost.IdleCost, cost.Cost)
	}
	if cost.Cost < 0 || cost.BusyCost < 0 || cost.IdleCost < 0 {
		t.Errorf("negative cost: %+v", cost)
	}
	var busy, idle, total Money
	for _, l := range a.Lines {
		if l.Busy < 0 || l.Idle < 0 || l.Total != l.Busy+l.Idle {
			t.Errorf("line %+v: negative or busy + idle != total", l)
		}
		busy += l.Busy
		idle += l.Idle
		total += l.Total
	}
	if a.Unattributed {
		if total != 0 {
			t.Errorf("unattributed allocation charges %s", total)
		}
		return
	}
	if total != cost.Cost || busy != cost.BusyCost || idle != cost.IdleCost || a.Cost != cost.Cost {
		t.Errorf("lines add up to busy %s idle %s total %s; cost has busy %s idle %s total %s (allocation says %s)",
			busy, idle, total, cost.BusyCost, cost.IdleCost, cost.Cost, a.Cost)
	}
}
