package gpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DCGMMode selects how the DCGM source reaches the DCGM host engine.
type DCGMMode string

// DCGM modes.
const (
	// DCGMEmbedded loads libdcgm and runs the host engine inside the agent.
	DCGMEmbedded DCGMMode = "embedded"
	// DCGMStandalone connects to a running nv-hostengine.
	DCGMStandalone DCGMMode = "standalone"
)

// DefaultDCGMAddress is where nv-hostengine listens by default.
const DefaultDCGMAddress = "localhost:5555"

// ErrDCGMUnavailable means DCGM could not be started: libdcgm.so.4 is not
// installed (or the binary was built without cgo), or nv-hostengine is not
// reachable in standalone mode. Other sources (dcgm-exporter, replay) do not
// need it.
var ErrDCGMUnavailable = errors.New("DCGM not available")

// DCGMConfig configures a DCGMSource.
type DCGMConfig struct {
	// Mode is embedded (default) or standalone.
	Mode DCGMMode
	// Address of nv-hostengine in standalone mode: host:port, a unix socket
	// path, or a DCGM connection string (tcp://..., unix://...). Default
	// DefaultDCGMAddress.
	Address string
	// UpdateEvery is how often DCGM records the watched fields. Utilization
	// and power of a sample are the mean of the records since the previous
	// Sample. Default 1s.
	UpdateEvery time.Duration
	// KeepAge is how long DCGM keeps records: the longest gap between two
	// Sample calls that is still averaged in full. Default 5m.
	KeepAge time.Duration
}

func (c DCGMConfig) withDefaults() DCGMConfig {
	if c.Mode == "" {
		c.Mode = DCGMEmbedded
	}
	if c.Address == "" {
		c.Address = DefaultDCGMAddress
	}
	if c.UpdateEvery <= 0 {
		c.UpdateEvery = time.Second
	}
	if c.KeepAge <= 0 {
		c.KeepAge = 5 * time.Minute
	}
	return c
}

// DCGM field ids (dcgm_fields.h; stable across DCGM versions, and checked
// against go-dcgm's constants in a cgo test). go-dcgm 4.x names some of them
// anew (DCGM_FI_DEV_GPU_UTIL_RATIO is 203, still a percentage).
const (
	fieldName           uint16 = 50   // DCGM_FI_DEV_NAME: model, or MIG profile of a GPU instance
	fieldSMClock        uint16 = 100  // DCGM_FI_DEV_SM_CLOCK, MHz
	fieldMaxSMClock     uint16 = 113  // DCGM_FI_DEV_MAX_SM_CLOCK, MHz: the "normal" clock of throttling
	fieldGPUTemp        uint16 = 150  // DCGM_FI_DEV_GPU_TEMP, C
	fieldPower          uint16 = 155  // DCGM_FI_DEV_POWER_USAGE, W
	fieldEnergy         uint16 = 156  // DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ counter
	fieldGPUUtil        uint16 = 203  // DCGM_FI_DEV_GPU_UTIL, %
	fieldFBTotal        uint16 = 250  // DCGM_FI_DEV_FB_TOTAL, MiB
	fieldFBFree         uint16 = 251  // DCGM_FI_DEV_FB_FREE, MiB
	fieldFBUsed         uint16 = 252  // DCGM_FI_DEV_FB_USED, MiB
	fieldFBReserved     uint16 = 253  // DCGM_FI_DEV_FB_RESERVED, MiB
	fieldGREngineActive uint16 = 1001 // DCGM_FI_PROF_GR_ENGINE_ACTIVE, ratio
	fieldSMActive       uint16 = 1002 // DCGM_FI_PROF_SM_ACTIVE, ratio
)

// DCGM value types and blank sentinels (dcgm_structs.h). A blank value means
// not found, not supported or not permitted.
const (
	dcgmTypeDouble    byte    = 'd'
	dcgmTypeInt64     byte    = 'i'
	dcgmTypeString    byte    = 's'
	dcgmTypeTimestamp byte    = 't'
	dcgmInt32Blank    int64   = 2147483632
	dcgmInt64Blank    int64   = 9223372036854775792
	dcgmFP64Blank     float64 = 140737488355328.0
	dcgmStatusOK              = 0
)

type entityKind uint8

const (
	entityGPU      entityKind = iota + 1 // DCGM_FE_GPU
	entityInstance                       // DCGM_FE_GPU_I, a MIG GPU instance
)

// dcgmEntity names one DCGM entity: a GPU by its DCGM GPU id, or a MIG GPU
// instance by its DCGM entity id (not the NVML instance id).
type dcgmEntity struct {
	Kind entityKind
	ID   uint
}

type dcgmDevice struct {
	ID    uint
	UUID  string
	Model string
}

// dcgmInstance is a MIG GPU instance of the DCGM hierarchy.
type dcgmInstance struct {
	Entity     uint // DCGM_FE_GPU_I entity id
	GPU        uint // DCGM GPU id of the parent
	InstanceID uint // NVML GPU instance id (dcgm-exporter's GPU_I_ID)
	Slices     uint // compute slices of its profile
}

type dcgmValue struct {
	Entity dcgmEntity
	Field  uint16
	Status int
	Type   byte
	TS     int64 // microseconds since the epoch
	Int    int64
	Float  float64
	Str    string
}

// number is the value of a numeric field, false when it is missing, blank
// or an error status.
func (v dcgmValue) number() (float64, bool) {
	if v.Status != dcgmStatusOK {
		return 0, false
	}
	switch v.Type {
	case dcgmTypeInt64, dcgmTypeTimestamp:
		if v.Int >= dcgmInt64Blank || (v.Int >= dcgmInt32Blank && v.Int <= dcgmInt32Blank+3) {
			return 0, false
		}
		return float64(v.Int), true
	case dcgmTypeDouble:
		if math.IsNaN(v.Float) || math.IsInf(v.Float, 0) || v.Float >= dcgmFP64Blank {
			return 0, false
		}
		return v.Float, true
	}
	return 0, false
}

// text is the value of a string field, "" when missing or blank.
func (v dcgmValue) text() string {
	if v.Status != dcgmStatusOK || v.Type != dcgmTypeString || strings.HasPrefix(v.Str, "<<<") {
		return ""
	}
	return strings.TrimSpace(v.Str)
}

// dcgmAPI is every DCGM call the source makes, so that a fake can stand in
// for libdcgm in tests. The real one (dcgm_cgo.go) is a thin adapter over
// go-dcgm. go-dcgm kills the process on any call but Init when Init did not
// succeed, so DCGMSource calls nothing before a successful Init and nothing
// after Shutdown.
type dcgmAPI interface {
	Init(mode DCGMMode, address string) error
	Shutdown() error
	SupportedDevices() ([]uint, error)
	DeviceInfo(gpu uint) (dcgmDevice, error)
	InstanceHierarchy() ([]dcgmInstance, error)
	LatestValues(entities []dcgmEntity, fields []uint16) ([]dcgmValue, error)
	// Watch asks DCGM to record fields of entities every `every`, keeping
	// them `keep`; it returns an id for ValuesSince and Unwatch.
	Watch(name string, entities []dcgmEntity, fields []uint16, every, keep time.Duration) (int, error)
	// ValuesSince returns the records of a watch newer than since (all kept
	// records for the zero time) and the cursor of the next call.
	ValuesSince(watch int, since time.Time) ([]dcgmValue, time.Time, error)
	Unwatch(watch int) error
}

// standaloneArgs are go-dcgm's Init arguments for nv-hostengine at address:
// a connection string as is, a socket path with the unix-socket flag "1",
// else host:port with "0".
func standaloneArgs(address string) []string {
	switch {
	case strings.Contains(address, "://"):
		return []string{address}
	case strings.HasPrefix(address, "/"):
		return []string{address, "1"}
	}
	return []string{address, "0"}
}

// checkStandaloneAddress reports an address standaloneArgs cannot use.
func checkStandaloneAddress(address string) error {
	if strings.Contains(address, "://") || strings.HasPrefix(address, "/") {
		return nil
	}
	if _, _, err := net.SplitHostPort(address); err != nil {
		return fmt.Errorf("DCGM address %q: want host:port, a socket path or a tcp:// or unix:// URL: %w", address, err)
	}
	return nil
}

type dcgmGPU struct {
	dcgmDevice
	gpuType   string
	instances []dcgmGPUInstance
}

type dcgmGPUInstance struct {
	dcgmInstance
	profile  string
	fraction float64
}

// DCGMSource reads GPUs through DCGM (go-dcgm). It reads MIG GPU instances
// from DCGM's entity hierarchy at start; a MIG reconfiguration needs a
// restart of the agent.
type DCGMSource struct {
	cfg    DCGMConfig
	logger *slog.Logger

	mu      sync.Mutex
	api     dcgmAPI
	live    bool // Init succeeded and Shutdown was not called
	gpus    []dcgmGPU
	watches []int
	since   map[int]time.Time
	energy  *energyMeter
	noProf  bool // the profiling watch failed: utilization from DCGM_FI_DEV_GPU_UTIL
	warned  map[string]bool
}

var _ Source = (*DCGMSource)(nil)

// NewDCGMSource starts DCGM in the configured mode, discovers the GPUs and
// MIG instances and watches the fields of a sample. When libdcgm or
// nv-hostengine is missing it returns an error wrapping ErrDCGMUnavailable.
// Close stops DCGM.
func NewDCGMSource(cfg DCGMConfig, logger *slog.Logger) (*DCGMSource, error) {
	return newDCGMSource(cfg, newDCGMBinding(), logger)
}

func newDCGMSource(cfg DCGMConfig, api dcgmAPI, logger *slog.Logger) (*DCGMSource, error) {
	cfg = cfg.withDefaults()
	switch cfg.Mode {
	case DCGMEmbedded:
	case DCGMStandalone:
		if err := checkStandaloneAddress(cfg.Address); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("DCGM mode %q: want embedded or standalone", cfg.Mode)
	}
	if err := api.Init(cfg.Mode, cfg.Address); err != nil {
		return nil, fmt.Errorf("%w: %w (%s)", ErrDCGMUnavailable, err, initHint(cfg))
	}
	s := &DCGMSource{
		cfg: cfg, logger: logger, api: api, live: true,
		since: map[int]time.Time{}, energy: newEnergyMeter(), warned: map[string]bool{},
	}
	if err := s.start(); err != nil {
		if cerr := s.Close(); cerr != nil {
			logger.Warn("stop DCGM after a failed start", "error", cerr)
		}
		return nil, err
	}
	return s, nil
}

func initHint(cfg DCGMConfig) string {
	if cfg.Mode == DCGMStandalone {
		return fmt.Sprintf("standalone DCGM needs libdcgm.so.4 from NVIDIA's datacenter-gpu-manager package and nv-hostengine listening at %s", cfg.Address)
	}
	return "embedded DCGM needs libdcgm.so.4 from NVIDIA's datacenter-gpu-manager package and an NVIDIA driver"
}

// start discovers the GPUs and watches their fields. Only called after a
// successful Init.
func (s *DCGMSource) start() error {
	ids, err := s.api.SupportedDevices()
	if err != nil {
		return fmt.Errorf("list DCGM GPUs: %w", err)
	}
	slices.Sort(ids)
	byID := map[uint]int{}
	for _, id := range ids {
		dev, err := s.api.DeviceInfo(id)
		if err != nil {
			return fmt.Errorf("DCGM GPU %d info: %w", id, err)
		}
		dev.ID = id
		byID[id] = len(s.gpus)
		s.gpus = append(s.gpus, dcgmGPU{dcgmDevice: dev, gpuType: GPUType(dev.Model)})
	}
	if len(s.gpus) == 0 {
		return fmt.Errorf("%w: DCGM found no supported GPU", ErrDCGMUnavailable)
	}
	insts, err := s.api.InstanceHierarchy()
	if err != nil {
		// Not fatal: GPUs without MIG still report; say that MIG is not seen.
		s.logger.Warn("read DCGM MIG hierarchy; reporting whole GPUs", "error", err)
		insts = nil
	}
	var instEntities []dcgmEntity
	for _, in := range insts {
		i, ok := byID[in.GPU]
		if !ok {
			continue
		}
		s.gpus[i].instances = append(s.gpus[i].instances, dcgmGPUInstance{dcgmInstance: in})
		instEntities = append(instEntities, dcgmEntity{entityInstance, in.Entity})
	}
	if len(instEntities) > 0 {
		names, err := s.api.LatestValues(instEntities, []uint16{fieldName})
		if err != nil {
			return fmt.Errorf("read MIG profiles: %w", err)
		}
		profiles := map[uint]string{}
		for _, v := range names {
			if v.Entity.Kind == entityInstance && v.Field == fieldName {
				profiles[v.Entity.ID] = v.text()
			}
		}
		for gi := range s.gpus {
			g := &s.gpus[gi]
			for ii := range g.instances {
				in := &g.instances[ii]
				in.profile = profiles[in.Entity]
				in.fraction = MIGFraction(g.gpuType, in.profile, int(in.Slices))
			}
			slices.SortFunc(g.instances, func(a, b dcgmGPUInstance) int { return cmp.Compare(a.InstanceID, b.InstanceID) })
		}
	}

	entities := make([]dcgmEntity, 0, len(s.gpus)+len(instEntities))
	for _, g := range s.gpus {
		entities = append(entities, dcgmEntity{entityGPU, g.ID})
	}
	entities = append(entities, instEntities...)
	name := fmt.Sprintf("tokenmeter-gpu-agent-%d", os.Getpid())
	base := []uint16{fieldSMClock, fieldMaxSMClock, fieldGPUTemp, fieldPower, fieldEnergy, fieldGPUUtil, fieldFBTotal, fieldFBFree, fieldFBUsed, fieldFBReserved}
	w, err := s.api.Watch(name, entities, base, s.cfg.UpdateEvery, s.cfg.KeepAge)
	if err != nil {
		return fmt.Errorf("watch DCGM fields: %w", err)
	}
	s.watches = append(s.watches, w)
	// Profiling (DCP) metrics need Volta or newer and DCGM's profiling
	// module; without them utilization falls back to DCGM_FI_DEV_GPU_UTIL
	// and samples carry no SM activity.
	w, err = s.api.Watch(name+"-prof", entities, []uint16{fieldGREngineActive, fieldSMActive}, s.cfg.UpdateEvery, s.cfg.KeepAge)
	if err != nil {
		s.noProf = true
		s.logger.Warn("DCGM profiling metrics unavailable; utilization from DCGM_FI_DEV_GPU_UTIL", "error", err)
	} else {
		s.watches = append(s.watches, w)
	}
	s.logger.Info("DCGM source started", "mode", s.cfg.Mode, "gpus", len(s.gpus), "mig_instances", len(instEntities))
	return nil
}

// Name implements Source.
func (s *DCGMSource) Name() string { return SourceDCGM }

// Sample implements Source.
func (s *DCGMSource) Sample(ctx context.Context) ([]*meterv1.GpuSample, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		return nil, ErrClosed
	}
	acc := fieldStats{}
	for _, w := range s.watches {
		vals, next, err := s.api.ValuesSince(w, s.since[w])
		if err != nil {
			return nil, fmt.Errorf("read DCGM values: %w", err)
		}
		s.since[w] = next
		acc.add(vals)
	}
	var out []*meterv1.GpuSample
	for _, g := range s.gpus {
		card := dcgmEntity{entityGPU, g.ID}
		base := &meterv1.GpuSample{
			GpuUuid:       g.UUID,
			GpuIndex:      uint32(g.ID),
			GpuType:       g.gpuType,
			TemperatureC:  acc.last(card, fieldGPUTemp),
			SmClockMhz:    acc.last(card, fieldSMClock),
			SmClockMaxMhz: acc.last(card, fieldMaxSMClock),
		}
		power := acc.mean(card, fieldPower)
		var joules float64
		if c, ok := acc.lastOK(card, fieldEnergy); ok {
			joules, _ = s.energy.delta(g.UUID, c)
		}
		if len(g.instances) == 0 {
			base.Utilization = s.utilization(card, acc)
			base.SmActive = smActive(card, acc)
			base.FbUsedBytes, base.FbTotalBytes = framebuffer(card, acc)
			base.PowerWatts, base.EnergyJoules = power, joules
			out = append(out, base)
			continue
		}
		for _, in := range g.instances {
			e := dcgmEntity{entityInstance, in.Entity}
			m := proto.Clone(base).(*meterv1.GpuSample)
			m.MigProfile = in.profile
			m.MigInstanceId = uint32(in.InstanceID)
			m.MigFraction = in.fraction
			m.Utilization = s.utilization(e, acc)
			m.SmActive = smActive(e, acc)
			m.FbUsedBytes, m.FbTotalBytes = framebuffer(e, acc)
			share := in.fraction
			if share == 0 {
				share = 1
			}
			m.PowerWatts, m.EnergyJoules = power*share, joules*share
			out = append(out, m)
		}
	}
	return out, nil
}

// utilization is DCGM_FI_PROF_GR_ENGINE_ACTIVE, else DCGM_FI_DEV_GPU_UTIL/100.
func (s *DCGMSource) utilization(e dcgmEntity, acc fieldStats) float64 {
	if v, ok := acc.meanOK(e, fieldGREngineActive); ok {
		return ratio(v)
	}
	if v, ok := acc.meanOK(e, fieldGPUUtil); ok {
		return ratio(v / 100)
	}
	key := fmt.Sprint(e)
	if !s.warned[key] {
		s.warned[key] = true
		s.logger.Warn("no utilization from DCGM for this entity; reporting 0", "entity_kind", e.Kind, "entity_id", e.ID)
	}
	return 0
}

// smActive is the mean DCGM_FI_PROF_SM_ACTIVE of the interval, or nil
// where DCGM offers none (no profiling module, a blank value).
func smActive(e dcgmEntity, acc fieldStats) *float64 {
	if v, ok := acc.meanOK(e, fieldSMActive); ok {
		return proto.Float64(ratio(v))
	}
	return nil
}

func framebuffer(e dcgmEntity, acc fieldStats) (used, total uint64) {
	u, _ := acc.lastOK(e, fieldFBUsed)
	if t, ok := acc.lastOK(e, fieldFBTotal); ok {
		return mibToBytes(u), mibToBytes(t)
	}
	f, okFree := acc.lastOK(e, fieldFBFree)
	r, _ := acc.lastOK(e, fieldFBReserved)
	if !okFree {
		return mibToBytes(u), 0
	}
	return mibToBytes(u), mibToBytes(u + f + r)
}

// Close implements Source: it stops the watches and DCGM. It is safe to
// call more than once.
func (s *DCGMSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		return nil
	}
	var errs []error
	for i := len(s.watches) - 1; i >= 0; i-- {
		if err := s.api.Unwatch(s.watches[i]); err != nil {
			errs = append(errs, fmt.Errorf("unwatch DCGM fields: %w", err))
		}
	}
	s.watches = nil
	if err := s.api.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("stop DCGM: %w", err))
	}
	s.live = false
	return errors.Join(errs...)
}

// fieldStats aggregates DCGM records per entity and field: the mean for
// rates (utilization, power) and the newest for gauges and counters.
type fieldStats map[fieldKey]*fieldStat

type fieldKey struct {
	e     dcgmEntity
	field uint16
}

type fieldStat struct {
	sum    float64
	n      int
	last   float64
	lastTS int64
}

func (a fieldStats) add(vals []dcgmValue) {
	for _, v := range vals {
		x, ok := v.number()
		if !ok {
			continue
		}
		k := fieldKey{v.Entity, v.Field}
		st := a[k]
		if st == nil {
			st = &fieldStat{lastTS: math.MinInt64}
			a[k] = st
		}
		st.sum += x
		st.n++
		if v.TS >= st.lastTS {
			st.last, st.lastTS = x, v.TS
		}
	}
}

func (a fieldStats) meanOK(e dcgmEntity, f uint16) (float64, bool) {
	st := a[fieldKey{e, f}]
	if st == nil || st.n == 0 {
		return 0, false
	}
	return st.sum / float64(st.n), true
}

func (a fieldStats) mean(e dcgmEntity, f uint16) float64 {
	v, _ := a.meanOK(e, f)
	return v
}

func (a fieldStats) lastOK(e dcgmEntity, f uint16) (float64, bool) {
	st := a[fieldKey{e, f}]
	if st == nil || st.n == 0 {
		return 0, false
	}
	return st.last, true
}

func (a fieldStats) last(e dcgmEntity, f uint16) float64 {
	v, _ := a.lastOK(e, f)
	return v
}
