package gpu

import "testing"

func TestGPUType(t *testing.T) {
	tests := map[string]string{
		"NVIDIA H100 80GB HBM3":          "H100-SXM-80GB",
		"NVIDIA H200":                    "H200-SXM-141GB",
		"NVIDIA A100-SXM4-80GB":          "A100-SXM4-80GB",
		"NVIDIA A30":                     "A30-24GB",
		"Tesla T4":                       "T4-16GB",
		"NVIDIA B200":                    "B200",
		"NVIDIA RTX 6000 Ada Generation": "RTX-6000-ADA-GENERATION",
		"":                               "",
	}
	for model, want := range tests {
		if got := GPUType(model); got != want {
			t.Errorf("GPUType(%q) = %q, want %q", model, got, want)
		}
	}
}

func TestMIGFraction(t *testing.T) {
	tests := []struct {
		gpuType, profile string
		slices           int
		want             float64
	}{
		{"H100-SXM-80GB", "1g.10gb", 0, 1.0 / 7},
		{"H100-SXM-80GB", "1g.20gb", 0, 1.0 / 7},
		{"H100-SXM-80GB", "1g.10gb+me", 0, 1.0 / 7},
		{"H100-SXM-80GB", "3g.40gb", 0, 3.0 / 7},
		{"H100-SXM-80GB", "7g.80gb", 0, 1},
		{"H200-SXM-141GB", "2g.35gb", 0, 2.0 / 7},
		{"A100-SXM4-40GB", "4g.20gb", 0, 4.0 / 7},
		{"A30-24GB", "1g.6gb", 0, 1.0 / 4},
		{"A30-24GB", "4g.24gb", 0, 1},
		{"B200", "1g.23gb", 0, 1.0 / 7}, // unknown model: 7 slices
		{"H100-SXM-80GB", "whatever", 2, 2.0 / 7},
		{"H100-SXM-80GB", "whatever", 0, 0},
		{"H100-SXM-80GB", "", 0, 0},
	}
	for _, tt := range tests {
		if got := MIGFraction(tt.gpuType, tt.profile, tt.slices); got != tt.want {
			t.Errorf("MIGFraction(%q, %q, %d) = %v, want %v", tt.gpuType, tt.profile, tt.slices, got, tt.want)
		}
	}
}

func TestEnergyMeter(t *testing.T) {
	m := newEnergyMeter()
	steps := []struct {
		uuid    string
		counter float64
		want    float64
		ok      bool
	}{
		{"a", 1_000_000, 0, false}, // no baseline
		{"b", 50, 0, false},
		{"a", 1_004_500, 4.5, true},
		{"a", 1_004_500, 0, true},
		{"a", 200, 0, false}, // went back: driver reload
		{"a", 1_200, 1, true},
	}
	for i, s := range steps {
		got, ok := m.delta(s.uuid, s.counter)
		if got != s.want || ok != s.ok {
			t.Errorf("step %d: delta(%q, %v) = %v, %v; want %v, %v", i, s.uuid, s.counter, got, ok, s.want, s.ok)
		}
	}
}

func TestRatio(t *testing.T) {
	for in, want := range map[float64]float64{-0.1: 0, 0: 0, 0.5: 0.5, 1: 1, 1.0000002: 1} {
		if got := ratio(in); got != want {
			t.Errorf("ratio(%v) = %v, want %v", in, got, want)
		}
	}
}
