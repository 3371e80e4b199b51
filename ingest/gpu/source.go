package gpu

import (
	"context"
	"errors"
	"math"
	"strings"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// Source reads GPU telemetry. Each Sample call returns one reading per GPU,
// or per MIG instance of a MIG-enabled GPU: instantaneous gauges
// (utilization, framebuffer, power, temperature, clock) and the energy used
// since the previous call. Identity fields (gpu_uuid, gpu_index, gpu_type,
// MIG profile, pod...) are filled; the Agent fills sampled_at, interval_s,
// sample_id, node when missing, deployment, region and pool.
//
// A replay Source may return samples that carry their own sampled_at and
// interval_s; the Agent keeps them. The Agent calls Sample from one
// goroutine at a time; sources keep state between calls (energy counters).
type Source interface {
	// Name is the value of GpuSample.source: "dcgm", "nvml", "dcgm-exporter"
	// or "replay".
	Name() string
	// Sample reads the GPUs once. It returns ErrExhausted when a finite
	// source has nothing more to give.
	Sample(ctx context.Context) ([]*meterv1.GpuSample, error)
	// Close releases the source; Sample must not be called after it.
	Close() error
}

// Source names, the values of GpuSample.source.
const (
	SourceDCGM     = "dcgm"
	SourceNVML     = "nvml"
	SourceExporter = "dcgm-exporter"
	SourceReplay   = "replay"
)

// ErrExhausted is returned by Sample when a finite source (a replay file
// without looping) has no more samples.
var ErrExhausted = errors.New("gpu source exhausted")

// ErrClosed is returned by Sample after Close.
var ErrClosed = errors.New("gpu source closed")

const bytesPerMiB = 1 << 20

// mibToBytes converts a framebuffer size in MiB, as DCGM reports it, to bytes.
func mibToBytes(mib float64) uint64 {
	if !(mib > 0) || math.IsInf(mib, 0) {
		return 0
	}
	return uint64(math.Round(mib * bytesPerMiB))
}

// ratio clamps a utilization to [0, 1]: DCGM's profiling ratios can round
// a hair above 1, and the contract is a closed interval.
func ratio(v float64) float64 {
	switch {
	case !(v > 0):
		return 0
	case v > 1:
		return 1
	}
	return v
}

// energyMeter turns the cumulative energy counter of each GPU
// (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ since the driver loaded) into the
// energy used since the previous reading of that GPU, in joules. The first
// reading of a GPU, and the first after the counter went backwards (driver
// reload), have no baseline and give ok=false; the Agent then estimates the
// energy from the power draw.
type energyMeter struct {
	last map[string]float64 // GPU UUID -> counter, mJ
}

func newEnergyMeter() *energyMeter { return &energyMeter{last: map[string]float64{}} }

// delta records the counter of one GPU and returns the joules used since its
// previous reading.
func (m *energyMeter) delta(uuid string, counterMJ float64) (joules float64, ok bool) {
	prev, seen := m.last[uuid]
	m.last[uuid] = counterMJ
	if !seen || counterMJ < prev {
		return 0, false
	}
	return (counterMJ - prev) / 1000, true
}

// GPUType maps an NVML/DCGM model name ("NVIDIA H100 80GB HBM3") to the
// gpu_type that selects a price ("H100-SXM-80GB"). Models not in the table
// keep their name without the vendor prefix, upper-cased, spaces as dashes
// ("NVIDIA B200" -> "B200"), so that a new model is still priced by a
// stable, readable key.
func GPUType(model string) string {
	m := strings.TrimSpace(model)
	switch m {
	case "NVIDIA H100 80GB HBM3":
		return "H100-SXM-80GB"
	case "NVIDIA H100 PCIe":
		return "H100-PCIE-80GB"
	case "NVIDIA H100 NVL":
		return "H100-NVL-94GB"
	case "NVIDIA H200":
		return "H200-SXM-141GB"
	case "NVIDIA H200 NVL":
		return "H200-NVL-141GB"
	case "NVIDIA A100-SXM4-80GB":
		return "A100-SXM4-80GB"
	case "NVIDIA A100-SXM4-40GB":
		return "A100-SXM4-40GB"
	case "NVIDIA A100 80GB PCIe":
		return "A100-PCIE-80GB"
	case "NVIDIA A100-PCIE-40GB":
		return "A100-PCIE-40GB"
	case "NVIDIA A30":
		return "A30-24GB"
	case "NVIDIA A10G":
		return "A10G-24GB"
	case "NVIDIA L4":
		return "L4-24GB"
	case "NVIDIA L40S":
		return "L40S-48GB"
	case "Tesla T4":
		return "T4-16GB"
	}
	for _, p := range []string{"NVIDIA ", "Tesla "} {
		m = strings.TrimPrefix(m, p)
	}
	return strings.ToUpper(strings.Join(strings.Fields(m), "-"))
}

// sampleKey identifies the GPU or MIG instance a sample is of.
type sampleKey struct {
	node, uuid, profile string
	instance            uint32
}

func keyOf(m *meterv1.GpuSample) sampleKey {
	return sampleKey{node: m.GetNode(), uuid: m.GetGpuUuid(), profile: m.GetMigProfile(), instance: m.GetMigInstanceId()}
}
