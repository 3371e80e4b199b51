package gpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ErrNVMLUnavailable means NVML could not be started: the NVIDIA driver's
// libnvidia-ml.so.1 is not installed (or the binary was built without cgo),
// the driver is not loaded, or NVML sees no GPU. Other sources
// (dcgm-exporter, replay) do not need it.
var ErrNVMLUnavailable = errors.New("NVML not available")

// NVML outcomes the source acts on; the binding's errors match them with
// errors.Is.
var (
	// errNVMLNotSupported: the device does not support the query
	// (NVML_ERROR_NOT_SUPPORTED), e.g. utilization of a MIG device.
	errNVMLNotSupported = errors.New("not supported by the device")
	// errNVMLNotFound: nothing at that index (NVML_ERROR_NOT_FOUND), e.g.
	// an unused MIG device slot.
	errNVMLNotFound = errors.New("not found")
)

// nvmlHint says what NVML needs, after an Init failure.
const nvmlHint = "the nvml source needs a loaded NVIDIA driver and its libnvidia-ml.so.1 on the library path, " +
	"in a container through the NVIDIA container toolkit"

// nvmlDev names a device NVML can be asked about: a GPU by its NVML index,
// or a MIG device of that GPU by its MIG device index (0 to
// GetMaxMigDeviceCount-1).
type nvmlDev struct {
	GPU   int
	MIG   int
	IsMIG bool
}

func gpuDev(gpu int) nvmlDev      { return nvmlDev{GPU: gpu} }
func migDev(gpu, mig int) nvmlDev { return nvmlDev{GPU: gpu, MIG: mig, IsMIG: true} }

func (d nvmlDev) String() string {
	if d.IsMIG {
		return fmt.Sprintf("GPU %d MIG device %d", d.GPU, d.MIG)
	}
	return fmt.Sprintf("GPU %d", d.GPU)
}

// nvmlDeviceInfo identifies a GPU or MIG device.
type nvmlDeviceInfo struct {
	UUID string // GPU-... for a GPU, MIG-... for a MIG device
	// Name is the model ("NVIDIA H100 80GB HBM3"); for a MIG device, the
	// model and profile ("NVIDIA H100 80GB HBM3 MIG 1g.10gb").
	Name string
}

// nvmlMIGInfo is what places a MIG device on its card.
type nvmlMIGInfo struct {
	InstanceID uint32 // GPU instance id (nvidia-smi's GI ID, dcgm-exporter's GPU_I_ID)
	Slices     uint32 // compute slices of the GPU instance's profile
}

// nvmlAPI is every NVML call the source makes, so that a fake can stand in
// for libnvidia-ml in tests. The real one (nvml_cgo.go) is a thin adapter
// over go-nvml. NVMLSource calls nothing before a successful Init and
// nothing after Shutdown: without a live Init every NVML call fails, and
// libnvidia-ml.so.1 may not even be loaded.
type nvmlAPI interface {
	Init() error
	Shutdown() error
	DeviceCount() (int, error)
	DeviceInfo(d nvmlDev) (nvmlDeviceInfo, error)
	// MIGEnabled reports whether MIG mode is currently on (not pending).
	MIGEnabled(gpu int) (bool, error)
	// MaxMIGDevices is the number of MIG device slots of a GPU; a slot
	// without a device answers errNVMLNotFound.
	MaxMIGDevices(gpu int) (int, error)
	MIGInfo(d nvmlDev) (nvmlMIGInfo, error)
	// Utilization is nvmlDeviceGetUtilizationRates' gpu: the percentage of
	// the last sample period (1/6 s to 1 s) during which a kernel ran.
	Utilization(d nvmlDev) (percent uint32, err error)
	// Memory is the framebuffer in use and in all, in bytes.
	Memory(d nvmlDev) (used, total uint64, err error)
	Power(gpu int) (milliwatts uint32, err error)
	// Energy is the energy counter of the GPU, mJ since the driver loaded.
	Energy(gpu int) (millijoules uint64, err error)
	Temperature(gpu int) (celsius uint32, err error)
	SMClock(gpu int) (mhz uint32, err error)
	// MaxSMClock is the GPU's maximum SM clock (nvmlDeviceGetMaxClockInfo):
	// the normal clock that clock throttling is measured against.
	MaxSMClock(gpu int) (mhz uint32, err error)
}

type nvmlGPU struct {
	index     int
	uuid      string
	gpuType   string
	instances []nvmlGPUInstance // MIG devices, when MIG mode is on
}

type nvmlGPUInstance struct {
	dev      nvmlDev
	id       uint32
	profile  string
	fraction float64
}

// NVMLSource reads GPUs through NVML (go-nvml), the library that ships with
// the NVIDIA driver: for nodes with the driver but without DCGM.
//
// Differences from DCGMSource: NVML has no DCGM_FI_PROF_GR_ENGINE_ACTIVE
// (a profiling metric only DCGM computes), so utilization is
// nvmlDeviceGetUtilizationRates' gpu / 100, DCGM_FI_DEV_GPU_UTIL's
// equivalent (the share of time a kernel ran, not how much of the GPU it
// used). Utilization and power are read once per Sample, not averaged over
// the interval (NVML itself averages power over about a second on Ampere
// and newer, utilization over its last 1/6 s to 1 s sample period); energy,
// the delta of the card's energy counter, covers the whole interval.
//
// On a MIG-enabled GPU it reports each MIG device (GPU instance) found at
// start, with its own framebuffer, its fraction of the card, and the card's
// power and energy split by that fraction, like DCGMSource; a MIG
// reconfiguration needs a restart of the agent. NVML does not report
// utilization of MIG devices (NVML_ERROR_NOT_SUPPORTED on the drivers known
// so far): it is 0 then, with a warning; use the dcgm or dcgm-exporter
// source for busy time of MIG instances.
type NVMLSource struct {
	logger *slog.Logger

	mu     sync.Mutex
	api    nvmlAPI
	live   bool // Init succeeded and Shutdown was not called
	gpus   []nvmlGPU
	energy *energyMeter
	warned map[string]bool
}

var _ Source = (*NVMLSource)(nil)

// NewNVMLSource loads libnvidia-ml.so.1, starts NVML and discovers the GPUs
// and MIG devices. When the library or the driver is missing it returns an
// error wrapping ErrNVMLUnavailable. Close stops NVML.
func NewNVMLSource(logger *slog.Logger) (*NVMLSource, error) {
	return newNVMLSource(newNVMLBinding(), logger)
}

func newNVMLSource(api nvmlAPI, logger *slog.Logger) (*NVMLSource, error) {
	if err := api.Init(); err != nil {
		return nil, fmt.Errorf("%w: %w (%s)", ErrNVMLUnavailable, err, nvmlHint)
	}
	s := &NVMLSource{logger: logger, api: api, live: true, energy: newEnergyMeter(), warned: map[string]bool{}}
	if err := s.start(); err != nil {
		if cerr := s.Close(); cerr != nil {
			logger.Warn("stop NVML after a failed start", "error", cerr)
		}
		return nil, err
	}
	return s, nil
}

// start discovers the GPUs and their MIG devices. Only called after a
// successful Init.
func (s *NVMLSource) start() error {
	n, err := s.api.DeviceCount()
	if err != nil {
		return fmt.Errorf("count NVML GPUs: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("%w: NVML found no GPU", ErrNVMLUnavailable)
	}
	migs := 0
	for i := range n {
		info, err := s.api.DeviceInfo(gpuDev(i))
		if err != nil {
			return fmt.Errorf("NVML GPU %d info: %w", i, err)
		}
		g := nvmlGPU{index: i, uuid: info.UUID, gpuType: GPUType(info.Name)}
		if g.instances, err = s.migDevices(g); err != nil {
			return err
		}
		migs += len(g.instances)
		s.gpus = append(s.gpus, g)
	}
	s.logger.Info("NVML source started", "gpus", len(s.gpus), "mig_instances", migs)
	return nil
}

// migDevices lists the MIG devices of a MIG-enabled GPU, by GPU instance
// id; none when MIG is off or not supported.
func (s *NVMLSource) migDevices(g nvmlGPU) ([]nvmlGPUInstance, error) {
	on, err := s.api.MIGEnabled(g.index)
	if errors.Is(err, errNVMLNotSupported) || (err == nil && !on) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("NVML GPU %d MIG mode: %w", g.index, err)
	}
	slots, err := s.api.MaxMIGDevices(g.index)
	if err != nil {
		return nil, fmt.Errorf("NVML GPU %d MIG devices: %w", g.index, err)
	}
	var out []nvmlGPUInstance
	seen := map[uint32]bool{}
	for j := range slots {
		d := migDev(g.index, j)
		mi, err := s.api.MIGInfo(d)
		if errors.Is(err, errNVMLNotFound) {
			continue // an empty slot
		}
		if err != nil {
			return nil, fmt.Errorf("NVML %s: %w", d, err)
		}
		// A MIG device is a compute instance; a GPU instance split into
		// several is reported once, by its first (they share its memory).
		if seen[mi.InstanceID] {
			continue
		}
		seen[mi.InstanceID] = true
		info, err := s.api.DeviceInfo(d)
		if err != nil {
			return nil, fmt.Errorf("NVML %s info: %w", d, err)
		}
		profile := migProfileOf(info.Name)
		out = append(out, nvmlGPUInstance{
			dev: d, id: mi.InstanceID, profile: profile,
			fraction: MIGFraction(g.gpuType, profile, int(mi.Slices)),
		})
	}
	if len(out) == 0 {
		s.logger.Warn("MIG is enabled but the GPU has no MIG device; reporting nothing for it", "gpu_index", g.index, "gpu_uuid", g.uuid)
	}
	slices.SortFunc(out, func(a, b nvmlGPUInstance) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// migProfileOf reads the GPU instance profile from NVML's name of a MIG
// device: "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb". A compute
// instance smaller than its GPU instance is named "MIG 1c.3g.40gb"; its
// GPU instance profile is "3g.40gb". "" when the name has none.
func migProfileOf(name string) string {
	_, p, ok := strings.Cut(name, " MIG ")
	if !ok {
		return ""
	}
	p = strings.TrimSpace(p)
	if c, rest, ok := strings.Cut(p, "c."); ok && c != "" && strings.Trim(c, "0123456789") == "" {
		p = rest
	}
	return p
}

// Name implements Source.
func (s *NVMLSource) Name() string { return SourceNVML }

// Sample implements Source. A GPU whose reading fails (other than with
// "not supported") is left out of this round with a warning, so that one
// lost GPU leaves a gap rather than stopping the others; Sample fails when
// every GPU failed.
func (s *NVMLSource) Sample(ctx context.Context) ([]*meterv1.GpuSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		return nil, ErrClosed
	}
	var out []*meterv1.GpuSample
	var errs []error
	for _, g := range s.gpus {
		samples, err := s.read(g)
		if err != nil {
			s.logger.Warn("read NVML GPU; leaving it out of this sample", "gpu_index", g.index, "gpu_uuid", g.uuid, "error", err)
			errs = append(errs, err)
			continue
		}
		out = append(out, samples...)
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("read NVML GPUs: %w", errors.Join(errs...))
	}
	return out, nil
}

// read makes the samples of one GPU: itself, or its MIG devices.
func (s *NVMLSource) read(g nvmlGPU) ([]*meterv1.GpuSample, error) {
	r := &nvmlReading{s: s}
	card := gpuDev(g.index)
	base := &meterv1.GpuSample{GpuUuid: g.uuid, GpuIndex: uint32(g.index), GpuType: g.gpuType}
	if v, err := s.api.Temperature(g.index); r.ok(card, "temperature", err) {
		base.TemperatureC = float64(v)
	}
	if v, err := s.api.SMClock(g.index); r.ok(card, "SM clock", err) {
		base.SmClockMhz = float64(v)
	}
	if v, err := s.api.MaxSMClock(g.index); r.ok(card, "max SM clock", err) {
		base.SmClockMaxMhz = float64(v)
	}
	var power, joules float64
	if mw, err := s.api.Power(g.index); r.ok(card, "power", err) {
		power = float64(mw) / 1000
	}
	// No delta on the first reading or after a counter reset: 0, and the
	// Agent estimates the energy as power x interval.
	if mj, err := s.api.Energy(g.index); r.ok(card, "energy", err) {
		joules, _ = s.energy.delta(g.uuid, float64(mj))
	}
	if len(g.instances) == 0 {
		r.device(card, base)
		base.PowerWatts, base.EnergyJoules = power, joules
		if r.err != nil {
			return nil, r.err
		}
		return []*meterv1.GpuSample{base}, nil
	}
	out := make([]*meterv1.GpuSample, 0, len(g.instances))
	for _, in := range g.instances {
		m := proto.Clone(base).(*meterv1.GpuSample)
		m.MigProfile, m.MigInstanceId, m.MigFraction = in.profile, in.id, in.fraction
		r.device(in.dev, m)
		share := in.fraction
		if share == 0 {
			share = 1
		}
		m.PowerWatts, m.EnergyJoules = power*share, joules*share
		out = append(out, m)
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// nvmlReading collects the outcome of the NVML calls of one GPU's reading.
type nvmlReading struct {
	s   *NVMLSource
	err error // the first failure other than "not supported"
}

// ok reports whether a call succeeded. A quantity the device does not
// support is warned about once per device and left 0; any other failure
// fails the reading.
func (r *nvmlReading) ok(d nvmlDev, what string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, errNVMLNotSupported):
		key := d.String() + "/" + what
		if !r.s.warned[key] {
			r.s.warned[key] = true
			msg := "NVML does not report this quantity for the device; reporting 0"
			if d.IsMIG && what == "utilization" {
				msg = "NVML does not report utilization of MIG devices; reporting 0 (the dcgm and dcgm-exporter sources do)"
			}
			r.s.logger.Warn(msg, "device", d.String(), "quantity", what)
		}
	case r.err == nil:
		r.err = fmt.Errorf("%s %s: %w", d, what, err)
	}
	return false
}

// device fills utilization and framebuffer, which NVML reports per MIG
// device as well as per GPU.
func (r *nvmlReading) device(d nvmlDev, m *meterv1.GpuSample) {
	// NVML has no GR_ENGINE_ACTIVE (a DCGM profiling metric): this is
	// DCGM_FI_DEV_GPU_UTIL's equivalent, the time share a kernel ran.
	if pct, err := r.s.api.Utilization(d); r.ok(d, "utilization", err) {
		m.Utilization = ratio(float64(pct) / 100)
	}
	if used, total, err := r.s.api.Memory(d); r.ok(d, "framebuffer", err) {
		m.FbUsedBytes, m.FbTotalBytes = used, total
	}
}

// Close implements Source: it shuts NVML down. It is safe to call more than
// once.
func (s *NVMLSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		return nil
	}
	s.live = false
	if err := s.api.Shutdown(); err != nil {
		return fmt.Errorf("stop NVML: %w", err)
	}
	return nil
}
