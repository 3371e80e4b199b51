//go:build cgo

package gpu

import (
	"testing"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// TestDCGMConstantsMatchGoDCGM checks the field ids, types and sentinels of
// dcgm.go against go-dcgm's. It only reads constants: no DCGM call.
func TestDCGMConstantsMatchGoDCGM(t *testing.T) {
	fields := []struct {
		name string
		ours uint16
		lib  dcgm.Short
	}{
		{"DCGM_FI_DEV_NAME", fieldName, dcgm.DCGM_FI_DEV_NAME},
		{"DCGM_FI_DEV_SM_CLOCK", fieldSMClock, dcgm.DCGM_FI_DEV_SM_CLOCK},
		{"DCGM_FI_DEV_GPU_TEMP", fieldGPUTemp, dcgm.DCGM_FI_DEV_GPU_TEMP},
		{"DCGM_FI_DEV_POWER_USAGE", fieldPower, dcgm.DCGM_FI_DEV_POWER_USAGE},
		{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", fieldEnergy, dcgm.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION},
		{"DCGM_FI_DEV_GPU_UTIL", fieldGPUUtil, dcgm.DCGM_FI_DEV_GPU_UTIL},
		{"DCGM_FI_DEV_FB_TOTAL", fieldFBTotal, dcgm.DCGM_FI_DEV_FB_TOTAL},
		{"DCGM_FI_DEV_FB_FREE", fieldFBFree, dcgm.DCGM_FI_DEV_FB_FREE},
		{"DCGM_FI_DEV_FB_USED", fieldFBUsed, dcgm.DCGM_FI_DEV_FB_USED},
		{"DCGM_FI_DEV_FB_RESERVED", fieldFBReserved, dcgm.DCGM_FI_DEV_FB_RESERVED},
		{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", fieldGREngineActive, dcgm.DCGM_FI_PROF_GR_ENGINE_ACTIVE},
		{"DCGM_FI_PROF_SM_ACTIVE", fieldSMActive, dcgm.DCGM_FI_PROF_SM_ACTIVE},
		{"DCGM_FI_DEV_MAX_SM_CLOCK", fieldMaxSMClock, dcgm.DCGM_FI_DEV_MAX_SM_CLOCK},
	}
	for _, f := range fields {
		if f.ours != uint16(f.lib) {
			t.Errorf("%s: got %d, go-dcgm has %d", f.name, f.ours, f.lib)
		}
	}
	if uint(dcgmTypeDouble) != dcgm.DCGM_FT_DOUBLE || uint(dcgmTypeInt64) != dcgm.DCGM_FT_INT64 ||
		uint(dcgmTypeString) != dcgm.DCGM_FT_STRING || uint(dcgmTypeTimestamp) != dcgm.DCGM_FT_TIMESTAMP {
		t.Error("DCGM field type codes differ from go-dcgm's")
	}
	if dcgmInt32Blank != dcgm.DCGM_FT_INT32_BLANK || dcgmInt64Blank != dcgm.DCGM_FT_INT64_BLANK || dcgmFP64Blank != dcgm.DCGM_FT_FP64_BLANK {
		t.Error("DCGM blank sentinels differ from go-dcgm's")
	}
	if dcgmStatusOK != dcgm.DCGM_ST_OK {
		t.Error("DCGM_ST_OK differs")
	}
}
