package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// fakeDCGM records every call and serves canned answers. Like go-dcgm, it
// treats any call other than Init without a live Init as fatal: the test
// fails instead of the process dying.
type fakeDCGM struct {
	t           *testing.T
	calls       []string
	live        bool
	initErr     error
	devicesErr  error
	devices     []dcgmDevice
	instances   []dcgmInstance
	profiles    map[uint]string // instance entity -> MIG profile
	profWatch   error           // error of the profiling watch
	rounds      []map[string][]dcgmValue
	roundOfProf map[int]int
	watchFields map[int][]uint16
	nextWatch   int
}

func (f *fakeDCGM) record(name string) {
	f.t.Helper()
	f.calls = append(f.calls, name)
	if name != "Init" && !f.live {
		f.t.Errorf("DCGM %s called without a live Init (go-dcgm would kill the process)", name)
	}
}

func (f *fakeDCGM) Init(mode DCGMMode, address string) error {
	f.record("Init")
	if f.initErr != nil {
		return f.initErr
	}
	f.live = true
	return nil
}

func (f *fakeDCGM) Shutdown() error {
	f.record("Shutdown")
	f.live = false
	return nil
}

func (f *fakeDCGM) SupportedDevices() ([]uint, error) {
	f.record("SupportedDevices")
	var ids []uint
	for _, d := range f.devices {
		ids = append(ids, d.ID)
	}
	return ids, f.devicesErr
}

func (f *fakeDCGM) DeviceInfo(gpu uint) (dcgmDevice, error) {
	f.record("DeviceInfo")
	for _, d := range f.devices {
		if d.ID == gpu {
			return dcgmDevice{UUID: d.UUID, Model: d.Model}, nil
		}
	}
	return dcgmDevice{}, fmt.Errorf("no GPU %d", gpu)
}

func (f *fakeDCGM) InstanceHierarchy() ([]dcgmInstance, error) {
	f.record("InstanceHierarchy")
	return f.instances, nil
}

func (f *fakeDCGM) LatestValues(entities []dcgmEntity, fields []uint16) ([]dcgmValue, error) {
	f.record("LatestValues")
	var out []dcgmValue
	for _, e := range entities {
		if slices.Contains(fields, fieldName) && e.Kind == entityInstance {
			out = append(out, dcgmValue{Entity: e, Field: fieldName, Type: dcgmTypeString, Str: f.profiles[e.ID]})
		}
	}
	return out, nil
}

func (f *fakeDCGM) Watch(name string, entities []dcgmEntity, fields []uint16, every, keep time.Duration) (int, error) {
	f.record("Watch")
	if slices.Contains(fields, fieldGREngineActive) && f.profWatch != nil {
		return 0, f.profWatch
	}
	f.nextWatch++
	if f.watchFields == nil {
		f.watchFields, f.roundOfProf = map[int][]uint16{}, map[int]int{}
	}
	f.watchFields[f.nextWatch] = fields
	return f.nextWatch, nil
}

// ValuesSince serves the next round of values whose fields the watch covers.
func (f *fakeDCGM) ValuesSince(watch int, since time.Time) ([]dcgmValue, time.Time, error) {
	f.record("ValuesSince")
	r := f.roundOfProf[watch]
	f.roundOfProf[watch]++
	if r >= len(f.rounds) {
		return nil, since, nil
	}
	var out []dcgmValue
	for _, vals := range f.rounds[r] {
		for _, v := range vals {
			if slices.Contains(f.watchFields[watch], v.Field) {
				out = append(out, v)
			}
		}
	}
	return out, since.Add(time.Second), nil
}

func (f *fakeDCGM) Unwatch(watch int) error {
	f.record("Unwatch")
	return nil
}

func TestDCGMInitFailureMakesNoOtherCall(t *testing.T) {
	for _, mode := range []DCGMMode{DCGMEmbedded, DCGMStandalone} {
		t.Run(string(mode), func(t *testing.T) {
			libErr := errors.New("libdcgm.so.4 not found")
			f := &fakeDCGM{t: t, initErr: libErr}
			src, err := newDCGMSource(DCGMConfig{Mode: mode, Address: "10.0.0.5:5555"}, f, discard())
			if src != nil {
				t.Fatal("got a source after a failed Init")
			}
			if !errors.Is(err, ErrDCGMUnavailable) || !errors.Is(err, libErr) {
				t.Errorf("got %v, want an error wrapping ErrDCGMUnavailable and the Init error", err)
			}
			if !strings.Contains(err.Error(), "libdcgm.so.4") {
				t.Errorf("error %q does not name libdcgm.so.4", err)
			}
			if mode == DCGMStandalone && !strings.Contains(err.Error(), "nv-hostengine listening at 10.0.0.5:5555") {
				t.Errorf("error %q does not name the nv-hostengine address", err)
			}
			if diff := cmp.Diff([]string{"Init"}, f.calls); diff != "" {
				t.Errorf("DCGM calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDCGMBadConfigMakesNoCall(t *testing.T) {
	for _, cfg := range []DCGMConfig{{Mode: "remote"}, {Mode: DCGMStandalone, Address: "no-port"}} {
		f := &fakeDCGM{t: t}
		if _, err := newDCGMSource(cfg, f, discard()); err == nil {
			t.Errorf("%+v: got nil error", cfg)
		}
		if len(f.calls) != 0 {
			t.Errorf("%+v: got calls %v, want none", cfg, f.calls)
		}
	}
}

func TestDCGMStartFailureShutsDownAndStops(t *testing.T) {
	f := &fakeDCGM{t: t, devicesErr: errors.New("NVML not loaded")}
	if _, err := newDCGMSource(DCGMConfig{}, f, discard()); err == nil {
		t.Fatal("got nil error")
	}
	if diff := cmp.Diff([]string{"Init", "SupportedDevices", "Shutdown"}, f.calls); diff != "" {
		t.Errorf("DCGM calls (-want +got):\n%s", diff)
	}
}

func TestDCGMNoCallAfterClose(t *testing.T) {
	f := &fakeDCGM{t: t, devices: []dcgmDevice{{ID: 0, UUID: "GPU-a", Model: "NVIDIA H100 80GB HBM3"}}}
	src, err := newDCGMSource(DCGMConfig{}, f, discard())
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
	want := []string{"Init", "SupportedDevices", "DeviceInfo", "InstanceHierarchy", "Watch", "Watch",
		"ValuesSince", "ValuesSince", "Unwatch", "Unwatch", "Shutdown"}
	if diff := cmp.Diff(want, f.calls); diff != "" {
		t.Errorf("DCGM calls (-want +got):\n%s", diff)
	}
}

func gpuVal(id uint, field uint16, ts int64, x float64) dcgmValue {
	return dcgmValue{Entity: dcgmEntity{entityGPU, id}, Field: field, Type: dcgmTypeDouble, TS: ts, Float: x}
}

func gpuInt(id uint, field uint16, ts int64, x int64) dcgmValue {
	return dcgmValue{Entity: dcgmEntity{entityGPU, id}, Field: field, Type: dcgmTypeInt64, TS: ts, Int: x}
}

func instVal(id uint, field uint16, ts int64, x float64) dcgmValue {
	v := gpuVal(id, field, ts, x)
	v.Entity.Kind = entityInstance
	return v
}

func instInt(id uint, field uint16, ts int64, x int64) dcgmValue {
	v := gpuInt(id, field, ts, x)
	v.Entity.Kind = entityInstance
	return v
}

// TestDCGMSampleMapping: GPU 0 whole with profiling metrics, GPU 1 split
// into two MIG instances, GPU 2 without profiling (blank values), whose
// utilization falls back to DCGM_FI_DEV_GPU_UTIL.
func TestDCGMSampleMapping(t *testing.T) {
	card := func(id uint, ts, energy int64, power float64) []dcgmValue {
		return []dcgmValue{
			gpuInt(id, fieldSMClock, ts, 1980), gpuInt(id, fieldGPUTemp, ts, 40+int64(id)),
			gpuVal(id, fieldPower, ts, power), gpuVal(id, fieldPower, ts-500_000, power-100),
			gpuInt(id, fieldEnergy, ts, energy),
		}
	}
	round1 := map[string][]dcgmValue{
		"gpu0": append(card(0, 1_000_000, 5_000_000, 600),
			gpuVal(0, fieldGREngineActive, 900_000, 0.6), gpuVal(0, fieldGREngineActive, 1_000_000, 0.8),
			gpuInt(0, fieldGPUUtil, 1_000_000, 99),
			gpuInt(0, fieldFBUsed, 1_000_000, 70_000), gpuInt(0, fieldFBTotal, 1_000_000, 81_559)),
		"gpu1": append(card(1, 1_000_000, 9_000_000, 350),
			instVal(7, fieldGREngineActive, 1_000_000, 0.5), instInt(7, fieldFBUsed, 1_000_000, 30_000),
			instInt(7, fieldFBFree, 1_000_000, 10_192),
			instVal(8, fieldGREngineActive, 1_000_000, 0.25), instInt(8, fieldFBUsed, 1_000_000, 5_000),
			instInt(8, fieldFBFree, 1_000_000, 4_856)),
		"gpu2": append(card(2, 1_000_000, 1_000_000, 150),
			gpuVal(2, fieldGREngineActive, 1_000_000, dcgmFP64Blank+2), // not supported
			gpuInt(2, fieldGPUUtil, 900_000, 40), gpuInt(2, fieldGPUUtil, 1_000_000, 50),
			gpuInt(2, fieldFBUsed, 1_000_000, dcgmInt64Blank), // blank
			dcgmValue{Entity: dcgmEntity{entityGPU, 2}, Field: fieldFBFree, Status: -6, Type: dcgmTypeInt64, Int: 3}),
	}
	round2 := map[string][]dcgmValue{
		"gpu0": append(card(0, 11_000_000, 5_000_000+6_000_000, 600), gpuVal(0, fieldGREngineActive, 11_000_000, 0.9)),
		"gpu1": append(card(1, 11_000_000, 9_000_000+3_500_000, 350), instVal(7, fieldGREngineActive, 11_000_000, 0.5)),
		"gpu2": card(2, 11_000_000, 500, 150), // counter went back: driver reload
	}
	f := &fakeDCGM{
		t: t,
		devices: []dcgmDevice{
			{ID: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3"},
			{ID: 1, UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB"},
			{ID: 2, UUID: "GPU-2", Model: "Tesla T4"},
		},
		instances: []dcgmInstance{
			{Entity: 8, GPU: 1, InstanceID: 13, Slices: 1},
			{Entity: 7, GPU: 1, InstanceID: 1, Slices: 3},
		},
		profiles: map[uint]string{7: "3g.20gb", 8: "1g.5gb"},
		rounds:   []map[string][]dcgmValue{round1, round2},
	}
	src, err := newDCGMSource(DCGMConfig{}, f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	got, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []*meterv1.GpuSample{
		{GpuUuid: "GPU-0", GpuType: "H100-SXM-80GB", Utilization: 0.7, FbUsedBytes: 70_000 << 20, FbTotalBytes: 81_559 << 20,
			PowerWatts: 550, TemperatureC: 40, SmClockMhz: 1980},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "3g.20gb", MigInstanceId: 1, MigFraction: 3.0 / 7,
			Utilization: 0.5, FbUsedBytes: 30_000 << 20, FbTotalBytes: 40_192 << 20, PowerWatts: 300 * 3.0 / 7, TemperatureC: 41, SmClockMhz: 1980},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "1g.5gb", MigInstanceId: 13, MigFraction: 1.0 / 7,
			Utilization: 0.25, FbUsedBytes: 5_000 << 20, FbTotalBytes: 9_856 << 20, PowerWatts: 300.0 / 7, TemperatureC: 41, SmClockMhz: 1980},
		{GpuUuid: "GPU-2", GpuIndex: 2, GpuType: "T4-16GB", Utilization: 0.45, PowerWatts: 100, TemperatureC: 42, SmClockMhz: 1980},
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
	wantEnergy := map[string]float64{"GPU-0/0": 6000, "GPU-1/1": 3500 * 3.0 / 7, "GPU-1/13": 3500.0 / 7, "GPU-2/0": 0}
	if diff := cmp.Diff(wantEnergy, energy, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("energy of the second sample, J (-want +got):\n%s", diff)
	}
	if got[0].Utilization != 0.9 {
		t.Errorf("second sample of GPU 0: got utilization %v, want 0.9 (only values since the first)", got[0].Utilization)
	}
}

func TestDCGMProfilingUnavailableFallsBack(t *testing.T) {
	f := &fakeDCGM{
		t:         t,
		devices:   []dcgmDevice{{ID: 0, UUID: "GPU-a", Model: "Tesla M60"}},
		profWatch: errors.New("This request is serviced by a module of DCGM that is not currently loaded"),
		rounds: []map[string][]dcgmValue{{"gpu0": {
			gpuVal(0, fieldGREngineActive, 1, 0.9), // not watched: never served
			gpuInt(0, fieldGPUUtil, 1, 30),
		}}},
	}
	src, err := newDCGMSource(DCGMConfig{}, f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Utilization != 0.3 || got[0].GpuType != "M60" {
		t.Errorf("got %v, want one M60 sample at utilization 0.3", got)
	}
}

func TestStandaloneArgs(t *testing.T) {
	tests := map[string][]string{
		"localhost:5555":                 {"localhost:5555", "0"},
		"/run/nvidia/nv-hostengine.sock": {"/run/nvidia/nv-hostengine.sock", "1"},
		"tcp://10.0.0.5:5555":            {"tcp://10.0.0.5:5555"},
		"unix:///tmp/nv-hostengine":      {"unix:///tmp/nv-hostengine"},
	}
	for addr, want := range tests {
		if got := standaloneArgs(addr); !slices.Equal(got, want) {
			t.Errorf("standaloneArgs(%q) = %q, want %q", addr, got, want)
		}
		if err := checkStandaloneAddress(addr); err != nil {
			t.Errorf("checkStandaloneAddress(%q): %v", addr, err)
		}
	}
}

// TestNewDCGMSourceHere runs the real binding through its guarded path: on
// a machine without libdcgm (CI, laptops), Init fails cleanly and nothing
// else is called.
func TestNewDCGMSourceHere(t *testing.T) {
	src, err := NewDCGMSource(DCGMConfig{}, discard())
	if err == nil {
		src.Close()
		t.Skip("DCGM is available on this machine")
	}
	if !errors.Is(err, ErrDCGMUnavailable) {
		t.Errorf("got %v, want an error wrapping ErrDCGMUnavailable", err)
	}
	t.Log(err)
}
