package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestDCGMSMActiveAndMaxClock: DCGM_FI_PROF_SM_ACTIVE is read beside
// GR_ENGINE_ACTIVE, averaged over the interval, per GPU and per MIG
// instance; a blank value or a GPU without it leaves sm_active absent; the
// maximum SM clock (DCGM_FI_DEV_MAX_SM_CLOCK) is the card's. Without the
// profiling module no sample carries SM activity.
func TestDCGMSMActiveAndMaxClock(t *testing.T) {
	round := map[string][]dcgmValue{
		"gpu0": {gpuInt(0, fieldSMClock, 1_000_000, 1500), gpuInt(0, fieldMaxSMClock, 1_000_000, 1980),
			gpuVal(0, fieldGREngineActive, 1_000_000, 0.9),
			gpuVal(0, fieldSMActive, 900_000, 0.5), gpuVal(0, fieldSMActive, 1_000_000, 0.7)},
		"gpu1": {gpuInt(1, fieldSMClock, 1_000_000, 1410), gpuInt(1, fieldMaxSMClock, 1_000_000, 1410),
			instVal(7, fieldGREngineActive, 1_000_000, 0.5), instVal(7, fieldSMActive, 1_000_000, 0.25),
			instVal(8, fieldGREngineActive, 1_000_000, 0.5), instVal(8, fieldSMActive, 1_000_000, dcgmFP64Blank+2)},
		"gpu2": {gpuInt(2, fieldSMClock, 1_000_000, 1590), gpuVal(2, fieldGREngineActive, 1_000_000, 0.1)},
	}
	devices := []dcgmDevice{
		{ID: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3"},
		{ID: 1, UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB"},
		{ID: 2, UUID: "GPU-2", Model: "Tesla T4"},
	}
	instances := []dcgmInstance{{Entity: 7, GPU: 1, InstanceID: 1, Slices: 3}, {Entity: 8, GPU: 1, InstanceID: 2, Slices: 3}}
	profiles := map[uint]string{7: "3g.20gb", 8: "3g.20gb"}
	opts := cmp.Options{protocmp.Transform(), cmpopts.EquateApprox(0, 1e-9)}

	f := &fakeDCGM{t: t, devices: devices, instances: instances, profiles: profiles, rounds: []map[string][]dcgmValue{round}}
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
		{GpuUuid: "GPU-0", GpuType: "H100-SXM-80GB", Utilization: 0.9, SmActive: proto.Float64(0.6), SmClockMhz: 1500, SmClockMaxMhz: 1980},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "3g.20gb", MigInstanceId: 1, MigFraction: 3.0 / 7,
			Utilization: 0.5, SmActive: proto.Float64(0.25), SmClockMhz: 1410, SmClockMaxMhz: 1410},
		{GpuUuid: "GPU-1", GpuIndex: 1, GpuType: "A100-SXM4-40GB", MigProfile: "3g.20gb", MigInstanceId: 2, MigFraction: 3.0 / 7,
			Utilization: 0.5, SmClockMhz: 1410, SmClockMaxMhz: 1410},
		{GpuUuid: "GPU-2", GpuIndex: 2, GpuType: "T4-16GB", Utilization: 0.1, SmClockMhz: 1590},
	}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}

	// Without profiling metrics: no SM activity, utilization from GPU_UTIL.
	f = &fakeDCGM{t: t, devices: devices[:1], profWatch: errors.New("profiling module not loaded"),
		rounds: []map[string][]dcgmValue{{"gpu0": append(round["gpu0"], gpuInt(0, fieldGPUUtil, 1_000_000, 80))}}}
	src2, err := newDCGMSource(DCGMConfig{}, f, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src2.Close()
	got, err = src2.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want = []*meterv1.GpuSample{{GpuUuid: "GPU-0", GpuType: "H100-SXM-80GB", Utilization: 0.8, SmClockMhz: 1500, SmClockMaxMhz: 1980}}
	if diff := cmp.Diff(want, got, opts); diff != "" {
		t.Errorf("without profiling (-want +got):\n%s", diff)
	}
}
