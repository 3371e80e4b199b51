//go:build cgo

package gpu

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlBinding is the real nvmlAPI: a thin adapter over go-nvml, which loads
// libnvidia-ml.so.1 with dlopen in Init. Beyond type conversion it only
// caches device handles; what is called when is NVMLSource's business.
type nvmlBinding struct {
	lib     nvml.Interface
	handles map[nvmlDev]nvml.Device
}

var _ nvmlAPI = (*nvmlBinding)(nil)

func newNVMLBinding() nvmlAPI {
	return &nvmlBinding{lib: nvml.New(), handles: map[nvmlDev]nvml.Device{}}
}

// nvmlError is a failed NVML call. It matches errNVMLNotSupported and
// errNVMLNotFound for those return codes.
type nvmlError struct{ ret nvml.Return }

func (e nvmlError) Error() string { return e.ret.Error() }

func (e nvmlError) Is(target error) bool {
	switch target {
	case errNVMLNotSupported:
		return e.ret == nvml.ERROR_NOT_SUPPORTED
	case errNVMLNotFound:
		return e.ret == nvml.ERROR_NOT_FOUND
	}
	return false
}

func check(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return nvmlError{ret}
}

func (b *nvmlBinding) Init() error {
	ret := b.lib.Init()
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		// go-nvml drops dlopen's message; this is what it means.
		return errors.New("libnvidia-ml.so.1 not found")
	}
	return check(ret)
}

func (b *nvmlBinding) Shutdown() error {
	clear(b.handles)
	return check(b.lib.Shutdown())
}

func (b *nvmlBinding) DeviceCount() (int, error) {
	n, ret := b.lib.DeviceGetCount()
	return n, check(ret)
}

// handle looks a device up once: handles stay valid until Shutdown (a MIG
// device's until MIG is reconfigured).
func (b *nvmlBinding) handle(d nvmlDev) (nvml.Device, error) {
	if h, ok := b.handles[d]; ok {
		return h, nil
	}
	h, ret := b.lib.DeviceGetHandleByIndex(d.GPU)
	if ret == nvml.SUCCESS && d.IsMIG {
		h, ret = h.GetMigDeviceHandleByIndex(d.MIG)
	}
	if ret != nvml.SUCCESS {
		return nil, nvmlError{ret}
	}
	b.handles[d] = h
	return h, nil
}

func (b *nvmlBinding) DeviceInfo(d nvmlDev) (nvmlDeviceInfo, error) {
	h, err := b.handle(d)
	if err != nil {
		return nvmlDeviceInfo{}, err
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return nvmlDeviceInfo{}, fmt.Errorf("UUID: %w", nvmlError{ret})
	}
	name, ret := h.GetName()
	if ret != nvml.SUCCESS {
		return nvmlDeviceInfo{}, fmt.Errorf("name: %w", nvmlError{ret})
	}
	return nvmlDeviceInfo{UUID: uuid, Name: name}, nil
}

func (b *nvmlBinding) MIGEnabled(gpu int) (bool, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return false, err
	}
	current, _, ret := h.GetMigMode()
	return current == nvml.DEVICE_MIG_ENABLE, check(ret)
}

func (b *nvmlBinding) MaxMIGDevices(gpu int) (int, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	n, ret := h.GetMaxMigDeviceCount()
	return n, check(ret)
}

func (b *nvmlBinding) MIGInfo(d nvmlDev) (nvmlMIGInfo, error) {
	h, err := b.handle(d)
	if err != nil {
		return nvmlMIGInfo{}, err
	}
	id, ret := h.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nvmlMIGInfo{}, fmt.Errorf("GPU instance id: %w", nvmlError{ret})
	}
	attrs, ret := h.GetAttributes()
	if ret != nvml.SUCCESS {
		return nvmlMIGInfo{}, fmt.Errorf("attributes: %w", nvmlError{ret})
	}
	return nvmlMIGInfo{InstanceID: uint32(id), Slices: attrs.GpuInstanceSliceCount}, nil
}

func (b *nvmlBinding) Utilization(d nvmlDev) (uint32, error) {
	h, err := b.handle(d)
	if err != nil {
		return 0, err
	}
	u, ret := h.GetUtilizationRates()
	return u.Gpu, check(ret)
}

// Memory prefers nvmlDeviceGetMemoryInfo_v2, whose used excludes the
// driver's reserved memory (as nvidia-smi and DCGM_FI_DEV_FB_USED report
// it); drivers before R510 only have v1.
func (b *nvmlBinding) Memory(d nvmlDev) (used, total uint64, err error) {
	h, err := b.handle(d)
	if err != nil {
		return 0, 0, err
	}
	if m, ret := h.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		return m.Used, m.Total, nil
	}
	m, ret := h.GetMemoryInfo()
	return m.Used, m.Total, check(ret)
}

func (b *nvmlBinding) Power(gpu int) (uint32, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	mw, ret := h.GetPowerUsage()
	return mw, check(ret)
}

func (b *nvmlBinding) Energy(gpu int) (uint64, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	mj, ret := h.GetTotalEnergyConsumption()
	return mj, check(ret)
}

func (b *nvmlBinding) Temperature(gpu int) (uint32, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	// Deprecated in NVML 13 for nvmlDeviceGetTemperatureV, which drivers
	// before R565 lack; this one answers on every driver so far (R580 too).
	c, ret := h.GetTemperature(nvml.TEMPERATURE_GPU)
	return c, check(ret)
}

func (b *nvmlBinding) SMClock(gpu int) (uint32, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	mhz, ret := h.GetClockInfo(nvml.CLOCK_SM)
	return mhz, check(ret)
}

func (b *nvmlBinding) MaxSMClock(gpu int) (uint32, error) {
	h, err := b.handle(gpuDev(gpu))
	if err != nil {
		return 0, err
	}
	mhz, ret := h.GetMaxClockInfo(nvml.CLOCK_SM)
	return mhz, check(ret)
}
