//go:build !cgo

package gpu

import (
	"errors"
	"time"
)

// errNoCgo is why DCGM cannot start in a binary built with CGO_ENABLED=0:
// go-dcgm loads libdcgm.so.4 through cgo.
var errNoCgo = errors.New("this binary was built without cgo (CGO_ENABLED=0) and cannot load libdcgm.so.4")

// noDCGM is the dcgmAPI of a binary without cgo: Init always fails, so
// DCGMSource never makes another call.
type noDCGM struct{}

var _ dcgmAPI = noDCGM{}

func newDCGMBinding() dcgmAPI { return noDCGM{} }

func (noDCGM) Init(DCGMMode, string) error                { return errNoCgo }
func (noDCGM) Shutdown() error                            { return errNoCgo }
func (noDCGM) SupportedDevices() ([]uint, error)          { return nil, errNoCgo }
func (noDCGM) DeviceInfo(uint) (dcgmDevice, error)        { return dcgmDevice{}, errNoCgo }
func (noDCGM) InstanceHierarchy() ([]dcgmInstance, error) { return nil, errNoCgo }
func (noDCGM) Unwatch(int) error                          { return errNoCgo }
func (noDCGM) LatestValues([]dcgmEntity, []uint16) ([]dcgmValue, error) {
	return nil, errNoCgo
}
func (noDCGM) Watch(string, []dcgmEntity, []uint16, time.Duration, time.Duration) (int, error) {
	return 0, errNoCgo
}
func (noDCGM) ValuesSince(int, time.Time) ([]dcgmValue, time.Time, error) {
	return nil, time.Time{}, errNoCgo
}
