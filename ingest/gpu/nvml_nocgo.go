//go:build !cgo

package gpu

import "errors"

// errNVMLNoCgo is why NVML cannot start in a binary built with
// CGO_ENABLED=0: go-nvml loads libnvidia-ml.so.1 through cgo.
var errNVMLNoCgo = errors.New("this binary was built without cgo (CGO_ENABLED=0) and cannot load libnvidia-ml.so.1")

// noNVML is the nvmlAPI of a binary without cgo: Init always fails, so
// NVMLSource never makes another call.
type noNVML struct{}

var _ nvmlAPI = noNVML{}

func newNVMLBinding() nvmlAPI { return noNVML{} }

func (noNVML) Init() error                                { return errNVMLNoCgo }
func (noNVML) Shutdown() error                            { return errNVMLNoCgo }
func (noNVML) DeviceCount() (int, error)                  { return 0, errNVMLNoCgo }
func (noNVML) DeviceInfo(nvmlDev) (nvmlDeviceInfo, error) { return nvmlDeviceInfo{}, errNVMLNoCgo }
func (noNVML) MIGEnabled(int) (bool, error)               { return false, errNVMLNoCgo }
func (noNVML) MaxMIGDevices(int) (int, error)             { return 0, errNVMLNoCgo }
func (noNVML) MIGInfo(nvmlDev) (nvmlMIGInfo, error)       { return nvmlMIGInfo{}, errNVMLNoCgo }
func (noNVML) Utilization(nvmlDev) (uint32, error)        { return 0, errNVMLNoCgo }
func (noNVML) Memory(nvmlDev) (uint64, uint64, error)     { return 0, 0, errNVMLNoCgo }
func (noNVML) Power(int) (uint32, error)                  { return 0, errNVMLNoCgo }
func (noNVML) Energy(int) (uint64, error)                 { return 0, errNVMLNoCgo }
func (noNVML) Temperature(int) (uint32, error)            { return 0, errNVMLNoCgo }
func (noNVML) SMClock(int) (uint32, error)                { return 0, errNVMLNoCgo }
func (noNVML) MaxSMClock(int) (uint32, error)             { return 0, errNVMLNoCgo }
