//go:build cgo

package gpu

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// dcgmBinding is the real dcgmAPI: a thin adapter over go-dcgm, which loads
// libdcgm.so.4 with dlopen in Init. It holds no logic of its own beyond type
// conversion; what is called when is DCGMSource's business.
type dcgmBinding struct {
	next    int
	watches map[int]bindingWatch
}

type bindingWatch struct {
	group  dcgm.GroupHandle
	fields dcgm.FieldHandle
}

var _ dcgmAPI = (*dcgmBinding)(nil)

func newDCGMBinding() dcgmAPI { return &dcgmBinding{watches: map[int]bindingWatch{}} }

func (b *dcgmBinding) Init(mode DCGMMode, address string) error {
	var err error
	switch mode {
	case DCGMStandalone:
		_, err = dcgm.Init(dcgm.Standalone, standaloneArgs(address)...)
	case DCGMEmbedded:
		_, err = dcgm.Init(dcgm.Embedded)
	default:
		// go-dcgm panics on an unknown mode; never hand it one.
		err = fmt.Errorf("unknown DCGM mode %q", mode)
	}
	return err
}

func (b *dcgmBinding) Shutdown() error { return dcgm.Shutdown() }

func (b *dcgmBinding) SupportedDevices() ([]uint, error) { return dcgm.GetSupportedDevices() }

func (b *dcgmBinding) DeviceInfo(gpu uint) (dcgmDevice, error) {
	d, err := dcgm.GetDeviceInfo(gpu)
	if err != nil {
		return dcgmDevice{}, err
	}
	return dcgmDevice{ID: d.GPU, UUID: d.UUID, Model: d.Identifiers.Model}, nil
}

func (b *dcgmBinding) InstanceHierarchy() ([]dcgmInstance, error) {
	h, err := dcgm.GetGPUInstanceHierarchy()
	if err != nil {
		return nil, err
	}
	var out []dcgmInstance
	for i := uint(0); i < h.Count && i < uint(len(h.EntityList)); i++ {
		e := h.EntityList[i]
		if e.Entity.EntityGroupId != dcgm.FE_GPU_I || e.Parent.EntityGroupId != dcgm.FE_GPU {
			continue // compute instances and anything else
		}
		out = append(out, dcgmInstance{
			Entity: e.Entity.EntityId, GPU: e.Parent.EntityId,
			InstanceID: e.Info.NvmlInstanceId, Slices: e.Info.NvmlProfileSlices,
		})
	}
	return out, nil
}

func (b *dcgmBinding) LatestValues(entities []dcgmEntity, fields []uint16) ([]dcgmValue, error) {
	vals, err := dcgm.EntitiesGetLatestValues(toPairs(entities), toShorts(fields), dcgm.DCGM_FV_FLAG_LIVE_DATA)
	if err != nil {
		return nil, err
	}
	return fromFieldValues(vals), nil
}

func (b *dcgmBinding) Watch(name string, entities []dcgmEntity, fields []uint16, every, keep time.Duration) (id int, err error) {
	group, err := dcgm.CreateGroup(name)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, dcgm.DestroyGroup(group))
		}
	}()
	for _, p := range toPairs(entities) {
		if err := dcgm.AddEntityToGroup(group, p.EntityGroupId, p.EntityId); err != nil {
			return 0, err
		}
	}
	fg, err := dcgm.FieldGroupCreate(name, toShorts(fields))
	if err != nil {
		return 0, err
	}
	if err := dcgm.WatchFieldsWithGroupEx(fg, group, every.Microseconds(), keep.Seconds(), 0); err != nil {
		return 0, errors.Join(err, dcgm.FieldGroupDestroy(fg))
	}
	b.next++
	b.watches[b.next] = bindingWatch{group: group, fields: fg}
	return b.next, nil
}

func (b *dcgmBinding) ValuesSince(watch int, since time.Time) ([]dcgmValue, time.Time, error) {
	w, ok := b.watches[watch]
	if !ok {
		return nil, since, fmt.Errorf("unknown DCGM watch %d", watch)
	}
	vals, next, err := dcgm.GetValuesSince(w.group, w.fields, since)
	if err != nil {
		return nil, since, err
	}
	return fromFieldValues(vals), next, nil
}

func (b *dcgmBinding) Unwatch(watch int) error {
	w, ok := b.watches[watch]
	if !ok {
		return fmt.Errorf("unknown DCGM watch %d", watch)
	}
	delete(b.watches, watch)
	return errors.Join(dcgm.UnwatchFields(w.fields, w.group), dcgm.FieldGroupDestroy(w.fields), dcgm.DestroyGroup(w.group))
}

func toPairs(entities []dcgmEntity) []dcgm.GroupEntityPair {
	out := make([]dcgm.GroupEntityPair, 0, len(entities))
	for _, e := range entities {
		g := dcgm.FE_GPU
		if e.Kind == entityInstance {
			g = dcgm.FE_GPU_I
		}
		out = append(out, dcgm.GroupEntityPair{EntityGroupId: g, EntityId: e.ID})
	}
	return out
}

func toShorts(fields []uint16) []dcgm.Short {
	out := make([]dcgm.Short, len(fields))
	for i, f := range fields {
		out[i] = dcgm.Short(f)
	}
	return out
}

func fromFieldValues(vals []dcgm.FieldValue_v2) []dcgmValue {
	out := make([]dcgmValue, 0, len(vals))
	for _, v := range vals {
		var kind entityKind
		switch v.EntityGroupId {
		case dcgm.FE_GPU:
			kind = entityGPU
		case dcgm.FE_GPU_I:
			kind = entityInstance
		}
		dv := dcgmValue{
			Entity: dcgmEntity{Kind: kind, ID: v.EntityID}, Field: uint16(v.FieldID),
			Status: v.Status, Type: byte(v.FieldType), TS: v.TS,
		}
		switch v.FieldType {
		case dcgm.DCGM_FT_INT64, dcgm.DCGM_FT_TIMESTAMP:
			dv.Int = v.Int64()
		case dcgm.DCGM_FT_DOUBLE:
			dv.Float = v.Float64()
		case dcgm.DCGM_FT_STRING:
			if v.StringValue != nil {
				dv.Str = *v.StringValue
			} else {
				dv.Str = v.String()
			}
		}
		out = append(out, dv)
	}
	return out
}
