package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// fakeNVML records every call and serves canned devices. Any call other
// than Init without a live Init fails the test: real NVML would answer
// NVML_ERROR_UNINITIALIZED, or not be loaded at all.
type fakeNVML struct {
	t        *testing.T
	calls    []string
	live     bool
	initErr  error
	countErr error
	gpus     []*fakeGPU
}

// fakeGPU is one GPU: its readings, and its MIG devices by slot when MIG is
// on. A nil error map entry is a success; errNVMLNotSupported and others
// stand for NVML's answers.
type fakeGPU struct {
	uuid, name string
	mig        bool
	slots      int
	migs       map[int]*fakeMIG
	util       uint32
	used, tot  uint64
	milliwatts uint32
	energy     []uint64 // counter, one per Sample; the last repeats
	temp, sm   uint32
	maxSM      uint32
	errs       map[string]error // quantity -> error
	reads      int
}

type fakeMIG struct {
	uuid, name string
	id, slices uint32
	used, tot  uint64
	utilErr    error
}

func (f *fakeNVML) record(name string) {
	f.t.Helper()
	f.calls = append(f.calls, name)
	if name != "Init" && !f.live {
		f.t.Errorf("NVML %s called without a live Init", name)
	}
}

func (f *fakeNVML) gpu(i int) (*fakeGPU, error) {
	if i < 0 || i >= len(f.gpus) {
		return nil, fmt.Errorf("no GPU %d", i)
	}
	return f.gpus[i], nil
}

func (f *fakeNVML) mig(d nvmlDev) (*fakeMIG, error) {
	g, err := f.gpu(d.GPU)
	if err != nil {
		return nil, err
	}
	m, ok := g.migs[d.MIG]
	if !ok {
		return nil, errNVMLNotFound
	}
	return m, nil
}

func (f *fakeNVML) Init() error {
	f.record("Init")
	if f.initErr != nil {
		return f.initErr
	}
	f.live = true
	return nil
}

func (f *fakeNVML) Shutdown() error {
	f.record("Shutdown")
	f.live = false
	return nil
}

func (f *fakeNVML) DeviceCount() (int, error) {
	f.record("DeviceCount")
	return len(f.gpus), f.countErr
}

func (f *fakeNVML) DeviceInfo(d nvmlDev) (nvmlDeviceInfo, error) {
	f.record("DeviceInfo")
	if d.IsMIG {
		m, err := f.mig(d)
		if err != nil {
			return nvmlDeviceInfo{}, err
		}
		return nvmlDeviceInfo{UUID: m.uuid, Name: m.name}, nil
	}
	g, err := f.gpu(d.GPU)
	if err != nil {
		return nvmlDeviceInfo{}, err
	}
	return nvmlDeviceInfo{UUID: g.uuid, Name: g.name}, nil
}

func (f *fakeNVML) MIGEnabled(gpu int) (bool, error) {
	f.record("MIGEnabled")
	g, err := f.gpu(gpu)
	if err != nil {
		return false, err
	}
	return g.mig, g.errs["mig"]
}

func (f *fakeNVML) MaxMIGDevices(gpu int) (int, error) {
	f.record("MaxMIGDevices")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	return g.slots, nil
}

func (f *fakeNVML) MIGInfo(d nvmlDev) (nvmlMIGInfo, error) {
	f.record("MIGInfo")
	m, err := f.mig(d)
	if err != nil {
		return nvmlMIGInfo{}, err
	}
	return nvmlMIGInfo{InstanceID: m.id, Slices: m.slices}, nil
}

func (f *fakeNVML) Utilization(d nvmlDev) (uint32, error) {
	f.record("Utilization")
	if d.IsMIG {
		m, err := f.mig(d)
		if err != nil {
			return 0, err
		}
		return 0, m.utilErr
	}
	g, err := f.gpu(d.GPU)
	if err != nil {
		return 0, err
	}
	return g.util, g.errs["util"]
}

func (f *fakeNVML) Memory(d nvmlDev) (uint64, uint64, error) {
	f.record("Memory")
	if d.IsMIG {
		m, err := f.mig(d)
		if err != nil {
			return 0, 0, err
		}
		return m.used, m.tot, nil
	}
	g, err := f.gpu(d.GPU)
	if err != nil {
		return 0, 0, err
	}
	return g.used, g.tot, g.errs["memory"]
}

func (f *fakeNVML) Power(gpu int) (uint32, error) {
	f.record("Power")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	return g.milliwatts, g.errs["power"]
}

func (f *fakeNVML) Energy(gpu int) (uint64, error) {
	f.record("Energy")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	if err := g.errs["energy"]; err != nil {
		return 0, err
	}
	i := min(g.reads, len(g.energy)-1)
	g.reads++
	return g.energy[i], nil
}

func (f *fakeNVML) Temperature(gpu int) (uint32, error) {
	f.record("Temperature")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	return g.temp, g.errs["temperature"]
}

func (f *fakeNVML) SMClock(gpu int) (uint32, error) {
	f.record("SMClock")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	return g.sm, g.errs["sm"]
}

func (f *fakeNVML) MaxSMClock(gpu int) (uint32, error) {
	f.record("MaxSMClock")
	g, err := f.gpu(gpu)
	if err != nil {
		return 0, err
	}
	return g.maxSM, g.errs["max_sm"]
}

func h100(uuid string) *fakeGPU {
	return &fakeGPU{
		uuid: uuid, name: "NVIDIA H100 80GB HBM3", util: 73, used: 70_000 << 20, tot: 81_559 << 20,
		milliwatts: 312_500, energy: []uint64{5_000_000, 8_125_000}, temp: 41, sm: 1980, maxSM: 1980,
	}
}

func TestNVMLInitFailureMakesNoOtherCall(t *testing.T) {
	libErr := errors.New("libnvidia-ml.so.1 not found")
	f := &fakeNVML{t: t, initErr: libErr, gpus: []*fakeGPU{h100("GPU-a")}}
	src, err := newNVMLSource(f, discard())
	if src != nil {
		t.Fatal("got a source after a failed Init")
	}
	if !errors.Is(err, ErrNVMLUnavailable) || !errors.Is(err, libErr) {
		t.Errorf("got %v, want an error wrapping ErrNVMLUnavailable and the Init error", err)
	}
	if diff := cmp.Diff([]string{"Init"}, f.calls); diff != "" {
		t.Errorf("NVML calls (-want +got):\n%s", diff)
	}
}

func TestNVMLStartFailureShutsDown(t *testing.T) {
	tests := []struct {
		name      string
		f         *fakeNVML
		wantCalls []string
		wantErr   error
	}{
		{
			name:      "count fails",
			f:         &fakeNVML{countErr: errors.New("GPU is lost")},
			wantCalls: []string{"Init", "DeviceCount", "Shutdown"},
		},
		{
			name:      "no GPU",
			f:         &fakeNVML{},
			wantCalls: []string{"Init", "DeviceCount", "Shutdown"},
			wantErr:   ErrNVMLUnavailable,
		},
		{
			name:      "MIG mode fails",
			f:         &fakeNVML{gpus: []*fakeGPU{{uuid: "GPU-a", errs: map[string]error{"mig": errors.New("Unknown Error")}}}},
			wantCalls: []string{"Init", "DeviceCount", "DeviceInfo", "MIGEnabled", "Shutdown"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.f.t = t
			_, err := newNVMLSource(tt.f, discard())
			if err == nil {
				t.Fatal("got nil error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("got %v, want an error wrapping %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.wantCalls, tt.f.calls); diff != "" {
				t.Errorf("NVML calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNVMLNoCallAfterClose(t *testing.T) {
	f := &fakeNVML{t: t, gpus: []*fakeGPU{h100("GPU-a")}}
	src, err := newNVMLSource(f, discard())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	n := len(f.calls)
	if _, err := src.Sample(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Sample after Close: got %v, want ErrClosed", err)
	}
	if err := src.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if len(f.calls) != n {
		t.Errorf("calls after Close: %v", f.calls[n:])
	}
	want := []string{"Init", "DeviceCount", "DeviceInfo", "MIGEnabled",
		"Temperature", "SMClock", "MaxSMClock", "Power", "Energy", "Utilization", "Memory", "Shutdown"}
	if diff := cmp.Diff(want, f.calls); diff != "" {
		t.Errorf("NVML calls (-want +got):\n%s", diff)
	}
}

// TestNVMLSampleMapping: GPU 0 whole, GPU 1 an A100 in MIG mode with two
// GPU instances in MIG device slots 0 and 3-4 (of 7), GPU 2 a T4 without an energy counter
// or temperature sensor.
func TestNVMLSampleMapping(t *testing.T) {
	a100 := &fakeGPU{
		uuid: "GPU-1", name: "NVIDIA A100-SXM4-40GB", mig: true, slots: 7,
		milliwatts: 350_000, energy: []uint64{9_000_000, 12_500_000}, temp: 35, sm: 1410,
		errs: map[string]error{"util": errNVMLNotSupported, "memory": errNVMLNotSupported},
		migs: map[int]*fakeMIG{
			0: {uuid: "MIG-b", name: "NVIDIA A100-SXM4-40GB MIG 1g.5gb", id: 13, slices: 1, used: 1 << 30, tot: 4_864 << 20, utilErr: errNVMLNotSupported},
			3: {uuid: "MIG-a", name: "NVIDIA A100-SXM4-40GB MIG 2c.3g.20gb", id: 1, slices: 3, used: 19 << 30, tot: 19_968 << 20, utilErr: errNVMLNotSupported},
			// A second compute instance of GPU instance 1: not a second sample.
			4: {uuid: "MIG-c", name: "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", id: 1, slices: 3, used: 19 << 30, tot: 19_968 << 20, utilErr: errNVMLNotSupported},
		},
	}
	t4 := &fakeGPU{
		uuid: "GPU-2", name: "Tesla T4", util: 150, used: 1 << 30, tot: 15_360 << 20, milliwatts: 70_250, sm: 1590,
		errs: map[string]error{"energy": errNVMLNotSupported, "temperature": errNVMLNotSupported},
	}
	f := &fakeNVML{t: t, gpus: []*fakeGPU{h100("GPU-0"), a100, t4}}
	src, err := newNVMLSource(f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if src.Name() != SourceNVML {
		t.Errorf("Name() = %q, want %q", src.Name(), SourceNVML)
	}

	got, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []*meterv1.GpuSample{
		{GpuUuid: "GPU-0", GpuType: "H100-SXM-80GB", Utilization: 0.73, FbUsedBytes: 70_000 << 20, FbTotalBytes: 81_559 << 20,
			PowerWatts: 312.5, TemperatureC: 41, SmClockMhz: 1980, SmClockMaxMhz: 1980},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "3g.20gb", MigInstanceId: 1, MigFraction: 3.0 / 7,
			FbUsedBytes: 19 << 30, FbTotalBytes: 19_968 << 20, PowerWatts: 150, TemperatureC: 35, SmClockMhz: 1410},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "1g.5gb", MigInstanceId: 13, MigFraction: 1.0 / 7,
			FbUsedBytes: 1 << 30, FbTotalBytes: 4_864 << 20, PowerWatts: 50, TemperatureC: 35, SmClockMhz: 1410},
		{GpuUuid: "GPU-2", GpuIndex: 2, GpuType: "T4-16GB", Utilization: 1, FbUsedBytes: 1 << 30, FbTotalBytes: 15_360 << 20,
			PowerWatts: 70.25, SmClockMhz: 1590},
	}
	opts := cmp.Options{protocmp.Transform(), cmpopts.EquateApprox(0, 1e-9)}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("first sample (-want +got):\n%s", diff)
	}

	got, err = src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	energy := map[string]float64{}
	for _, m := range got {
		energy[fmt.Sprintf("%s/%d", m.GpuUuid, m.MigInstanceId)] = m.EnergyJoules
	}
	wantEnergy := map[string]float64{"GPU-0/0": 3125, "GPU-1/1": 3500 * 3.0 / 7, "GPU-1/13": 3500.0 / 7, "GPU-2/0": 0}
	if diff := cmp.Diff(wantEnergy, energy, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("energy of the second sample, J (-want +got):\n%s", diff)
	}
}

// TestNVMLEnergyThroughAgent checks the energy contract with the Agent:
// the first reading has no counter delta, so the Agent estimates power x
// interval; later readings carry the delta; a counter reset (driver
// reload) estimates again.
func TestNVMLEnergyThroughAgent(t *testing.T) {
	g := h100("GPU-0")
	g.energy = []uint64{5_000_000, 8_125_000, 1_000}
	f := &fakeNVML{t: t, gpus: []*fakeGPU{g}}
	src, err := newNVMLSource(f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	clk := newClock(t0)
	pub := &memPublisher{}
	agent, _ := newTestAgent(t, AgentConfig{Interval: 10 * time.Second, Node: "node-1"}, src, pub, clk.now)
	for i := range 3 {
		clk.set(t0.Add(time.Duration(i) * 10 * time.Second))
		if _, err := agent.Collect(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var got []float64
	for _, m := range pub.got {
		if m.Source != SourceNVML || m.IntervalS != 10 {
			t.Errorf("sample %v: want source nvml, interval 10 s", m)
		}
		got = append(got, m.EnergyJoules)
	}
	if diff := cmp.Diff([]float64{312.5 * 10, 3125, 312.5 * 10}, got, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("energy per sample, J (-want +got):\n%s", diff)
	}
}

func TestNVMLSampleLeavesOutFailedGPU(t *testing.T) {
	lost := errors.New("GPU is lost")
	bad := h100("GPU-1")
	bad.errs = map[string]error{"power": lost}
	f := &fakeNVML{t: t, gpus: []*fakeGPU{h100("GPU-0"), bad}}
	src, err := newNVMLSource(f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].GpuUuid != "GPU-0" {
		t.Errorf("got %v, want GPU-0 only", got)
	}

	f.gpus[0].errs = map[string]error{"memory": lost}
	if _, err := src.Sample(context.Background()); !errors.Is(err, lost) {
		t.Errorf("every GPU failing: got %v, want an error wrapping %v", err, lost)
	}
}

func TestNVMLSampleHonoursContext(t *testing.T) {
	f := &fakeNVML{t: t, gpus: []*fakeGPU{h100("GPU-0")}}
	src, err := newNVMLSource(f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := len(f.calls)
	if _, err := src.Sample(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if len(f.calls) != n {
		t.Errorf("calls with a cancelled context: %v", f.calls[n:])
	}
}

func TestMIGProfileOf(t *testing.T) {
	tests := map[string]string{
		"NVIDIA H100 80GB HBM3 MIG 1g.10gb":     "1g.10gb",
		"NVIDIA A100-SXM4-40GB MIG 1g.5gb+me":   "1g.5gb+me",
		"NVIDIA H100 80GB HBM3 MIG 7g.80gb ":    "7g.80gb",
		"NVIDIA H100 80GB HBM3":                 "",
		"NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb":  "3g.40gb",
		"NVIDIA GH200 480GB MIG 2c.4g.48gb+gfx": "4g.48gb+gfx",
	}
	for name, want := range tests {
		if got := migProfileOf(name); got != want {
			t.Errorf("migProfileOf(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestNVMLSourceHere runs the real binding. On a machine without the
// NVIDIA driver (CI, laptops), Init fails cleanly, naming
// libnvidia-ml.so.1. On a GPU machine it reads twice, a second apart, and
// checks the readings: identity, ranges, and an energy delta that matches
// the power draw.
func TestNVMLSourceHere(t *testing.T) {
	src, err := NewNVMLSource(discard())
	if err != nil {
		if !errors.Is(err, ErrNVMLUnavailable) {
			t.Errorf("got %v, want an error wrapping ErrNVMLUnavailable", err)
		}
		if !strings.Contains(err.Error(), "libnvidia-ml.so.1") {
			t.Errorf("error %q does not name libnvidia-ml.so.1", err)
		}
		t.Log(err)
		return
	}
	defer func() {
		if err := src.Close(); err != nil {
			t.Error(err)
		}
	}()
	first, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(time.Second)
	second, err := src.Sample(context.Background())
	elapsed := time.Since(start).Seconds()
	if err != nil {
		t.Fatal(err)
	}
	if len(first) == 0 || len(second) != len(first) {
		t.Fatalf("got %d then %d samples, want the same number, at least one", len(first), len(second))
	}
	for i, m := range second {
		t.Logf("%v", m)
		if !strings.HasPrefix(m.GpuUuid, "GPU-") || m.GpuType == "" || m.FbTotalBytes == 0 || m.FbUsedBytes > m.FbTotalBytes ||
			m.Utilization < 0 || m.Utilization > 1 || m.PowerWatts <= 0 || m.SmClockMhz <= 0 {
			t.Errorf("sample %d: implausible %v", i, m)
		}
		if first[i].EnergyJoules != 0 {
			t.Errorf("first sample %d: energy %v J, want 0 (no counter baseline)", i, first[i].EnergyJoules)
		}
		// The counter's draw over the second against the instantaneous
		// power: the same order of magnitude unless the load changed.
		if w := m.EnergyJoules / elapsed; w < m.PowerWatts/3 || w > m.PowerWatts*3 {
			t.Errorf("sample %d: counter gives %.1f W over %.2f s, power reads %.1f W", i, w, elapsed, m.PowerWatts)
		}
	}
}
