package gpu

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// DefaultExporterURL is dcgm-exporter's metrics endpoint on the local node.
const DefaultExporterURL = "http://127.0.0.1:9400/metrics"

// ExporterConfig configures an ExporterSource.
type ExporterConfig struct {
	// URL of the Prometheus text endpoint: dcgm-exporter's /metrics, or a
	// Prometheus /federate URL selecting DCGM_FI_* series.
	URL string
	// Timeout bounds one scrape. Default 5s.
	Timeout time.Duration
	// Node, when set, is the node of every sample; otherwise the exporter's
	// Hostname (3.x) or hostname (4.x) label names it. In Kubernetes that
	// label may be the exporter pod's name rather than the node's.
	Node string
	// Client is the HTTP client; default a new one with Timeout.
	Client *http.Client
}

// ExporterSource scrapes NVIDIA dcgm-exporter and maps its DCGM_FI_* series
// to one reading per GPU, or per MIG instance (UUID, GPU_I_ID):
//
//	DCGM_FI_PROF_GR_ENGINE_ACTIVE        utilization (ratio), else
//	DCGM_FI_DEV_GPU_UTIL                 utilization / 100
//	DCGM_FI_DEV_FB_USED, _FREE, _RESERVED  fb_used_bytes, fb_total_bytes = used+free+reserved (MiB)
//	DCGM_FI_DEV_POWER_USAGE              power_watts
//	DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION energy_joules, from the delta of the mJ counter
//	DCGM_FI_DEV_GPU_TEMP                 temperature_c
//	DCGM_FI_DEV_SM_CLOCK                 sm_clock_mhz
//	DCGM_FI_DEV_MAX_SM_CLOCK             sm_clock_max_mhz (where the exporter's counters include it)
//	DCGM_FI_PROF_SM_ACTIVE               sm_active (likewise; absent otherwise)
//
// Labels: UUID, gpu (index), modelName (gpu_type), Hostname or hostname
// (node), GPU_I_PROFILE and GPU_I_ID (MIG), pod and namespace. When the
// scrape went through a Prometheus that renamed colliding labels
// (honor_labels: false), exported_pod and exported_namespace name the
// workload, and pod and namespace name the exporter itself: then only the
// exported_ forms are read. dcgm-exporter repeats card-wide series (power,
// energy, temperature, clock) on each MIG instance; power and energy are
// split by the instance's fraction of the card.
type ExporterSource struct {
	cfg    ExporterConfig
	client *http.Client
	logger *slog.Logger
	energy *energyMeter
}

var _ Source = (*ExporterSource)(nil)

// NewExporterSource checks the configuration; it does not scrape.
func NewExporterSource(cfg ExporterConfig, logger *slog.Logger) (*ExporterSource, error) {
	if cfg.URL == "" {
		cfg.URL = DefaultExporterURL
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("dcgm-exporter URL %q: want http(s)://host:port/metrics", cfg.URL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Timeout: cfg.Timeout}
	}
	return &ExporterSource{cfg: cfg, client: client, logger: logger, energy: newEnergyMeter()}, nil
}

// Name implements Source.
func (s *ExporterSource) Name() string { return SourceExporter }

// Close implements Source.
func (s *ExporterSource) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// Sample implements Source: one scrape.
func (s *ExporterSource) Sample(ctx context.Context) ([]*meterv1.GpuSample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape dcgm-exporter: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape dcgm-exporter: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return nil, fmt.Errorf("scrape dcgm-exporter %s: HTTP %d: %q", s.cfg.URL, resp.StatusCode, snippet)
	}
	readings, err := parseExporter(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("scrape dcgm-exporter %s: %w", s.cfg.URL, err)
	}
	return s.samples(readings), nil
}

// samples turns parsed readings into samples: the energy counter of each
// card into joules since the previous scrape, split over its MIG instances.
func (s *ExporterSource) samples(readings []exporterReading) []*meterv1.GpuSample {
	type cardEnergy struct {
		joules float64
		ok     bool
	}
	cards := map[string]cardEnergy{}
	out := make([]*meterv1.GpuSample, 0, len(readings))
	for _, r := range readings {
		m := r.sample
		if s.cfg.Node != "" {
			m.Node = s.cfg.Node
		}
		if r.hasEnergy {
			ce, seen := cards[m.GpuUuid]
			if !seen {
				ce.joules, ce.ok = s.energy.delta(m.GpuUuid, r.energyMJ)
				cards[m.GpuUuid] = ce
			}
			if ce.ok {
				m.EnergyJoules = ce.joules * share(m)
			}
		}
		out = append(out, m)
	}
	return out
}

// share is the part of card-wide power and energy that a sample carries.
func share(m *meterv1.GpuSample) float64 {
	if m.MigProfile == "" || m.MigFraction <= 0 {
		return 1
	}
	return m.MigFraction
}

// exporterReading is one GPU or MIG instance of a scrape, before the
// energy counter becomes a delta.
type exporterReading struct {
	sample    *meterv1.GpuSample
	energyMJ  float64 // cumulative DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION of the card
	hasEnergy bool
}

// The exporter metric families read; others are ignored.
const (
	famGREngineActive = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
	famGPUUtil        = "DCGM_FI_DEV_GPU_UTIL"
	famFBUsed         = "DCGM_FI_DEV_FB_USED"
	famFBFree         = "DCGM_FI_DEV_FB_FREE"
	famFBReserved     = "DCGM_FI_DEV_FB_RESERVED"
	famPower          = "DCGM_FI_DEV_POWER_USAGE"
	famEnergy         = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
	famGPUTemp        = "DCGM_FI_DEV_GPU_TEMP"
	famSMClock        = "DCGM_FI_DEV_SM_CLOCK"
	famMaxSMClock     = "DCGM_FI_DEV_MAX_SM_CLOCK"
	famSMActive       = "DCGM_FI_PROF_SM_ACTIVE"
)

type exporterKey struct{ uuid, instance string }

type exporterGroup struct {
	key            exporterKey
	index          uint32
	model, node    string
	profile        string
	pod, namespace string
	values         map[string]float64
	firstSeen      int
}

// parseExporter reads a Prometheus text exposition of dcgm-exporter series.
func parseExporter(r io.Reader) ([]exporterReading, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse Prometheus text: %w", err)
	}
	renamed := false
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "exported_pod" || lp.GetName() == "exported_namespace" {
					renamed = true
				}
			}
		}
	}
	groups := map[exporterKey]*exporterGroup{}
	for _, name := range []string{famGREngineActive, famGPUUtil, famFBUsed, famFBFree, famFBReserved, famPower, famEnergy, famGPUTemp, famSMClock,
		famMaxSMClock, famSMActive} {
		f := fams[name]
		for _, m := range f.GetMetric() {
			v, ok := metricValue(m)
			if !ok {
				continue
			}
			l := labelMap(m)
			uuid := first(l, "UUID", "uuid")
			if uuid == "" {
				continue
			}
			k := exporterKey{uuid, l["GPU_I_ID"]}
			g := groups[k]
			if g == nil {
				g = &exporterGroup{key: k, values: map[string]float64{}, firstSeen: len(groups)}
				groups[k] = g
			}
			g.fill(l, renamed)
			if _, dup := g.values[name]; !dup {
				g.values[name] = v
			}
		}
	}
	if len(groups) == 0 {
		return nil, errNoSeries
	}
	// A MIG-enabled card is its instances: a whole-GPU group of the same
	// UUID only lends them its card-wide values (families that describe the
	// whole card even when dcgm-exporter labels them with an instance).
	cardWide := []string{famPower, famEnergy, famGPUTemp, famSMClock, famMaxSMClock}
	for k, g := range groups {
		if k.instance != "" {
			continue
		}
		migrated := false
		for k2, in := range groups {
			if k2.uuid != k.uuid || k2.instance == "" {
				continue
			}
			migrated = true
			for _, f := range cardWide {
				if _, ok := in.values[f]; !ok {
					if v, ok := g.values[f]; ok {
						in.values[f] = v
					}
				}
			}
		}
		if migrated {
			delete(groups, k)
		}
	}
	list := make([]*exporterGroup, 0, len(groups))
	for _, g := range groups {
		list = append(list, g)
	}
	slices.SortFunc(list, func(a, b *exporterGroup) int {
		return cmp.Or(cmp.Compare(a.node, b.node), cmp.Compare(a.index, b.index), cmp.Compare(a.key.uuid, b.key.uuid),
			cmp.Compare(instanceOrder(a.key.instance), instanceOrder(b.key.instance)), cmp.Compare(a.key.instance, b.key.instance))
	})
	out := make([]exporterReading, 0, len(list))
	for _, g := range list {
		out = append(out, g.reading())
	}
	return out, nil
}

func instanceOrder(id string) int {
	n, err := strconv.Atoi(id)
	if err != nil {
		return math.MaxInt
	}
	return n
}

// fill takes the identity labels of one series; the first non-empty value
// of each wins, so that a GPU shared by several pods is still one reading.
func (g *exporterGroup) fill(l map[string]string, renamed bool) {
	if g.model == "" {
		g.model = l["modelName"]
	}
	if g.node == "" {
		g.node = first(l, "Hostname", "hostname")
	}
	if g.profile == "" {
		g.profile = l["GPU_I_PROFILE"]
	}
	if g.index == 0 {
		if n, err := strconv.ParseUint(l["gpu"], 10, 32); err == nil {
			g.index = uint32(n)
		}
	}
	pod, ns := first(l, "exported_pod"), first(l, "exported_namespace")
	if !renamed {
		pod, ns = first(l, "pod"), first(l, "namespace")
	}
	if g.pod == "" && pod != "" {
		g.pod, g.namespace = pod, ns
	}
}

func (g *exporterGroup) reading() exporterReading {
	m := &meterv1.GpuSample{
		Node:          g.node,
		GpuUuid:       g.key.uuid,
		GpuIndex:      g.index,
		GpuType:       GPUType(g.model),
		MigProfile:    g.profile,
		Pod:           g.pod,
		Namespace:     g.namespace,
		TemperatureC:  g.values[famGPUTemp],
		SmClockMhz:    g.values[famSMClock],
		SmClockMaxMhz: g.values[famMaxSMClock],
	}
	if v, ok := g.values[famSMActive]; ok {
		m.SmActive = proto.Float64(ratio(v))
	}
	if g.key.instance != "" {
		if n, err := strconv.ParseUint(g.key.instance, 10, 32); err == nil {
			m.MigInstanceId = uint32(n)
		}
		m.MigFraction = MIGFraction(m.GpuType, m.MigProfile, 0)
	}
	if v, ok := g.values[famGREngineActive]; ok {
		m.Utilization = ratio(v)
	} else if v, ok := g.values[famGPUUtil]; ok {
		m.Utilization = ratio(v / 100)
	}
	used := g.values[famFBUsed]
	m.FbUsedBytes = mibToBytes(used)
	if free, ok := g.values[famFBFree]; ok {
		m.FbTotalBytes = mibToBytes(used + free + g.values[famFBReserved])
	}
	m.PowerWatts = g.values[famPower] * share(m)
	e, hasEnergy := g.values[famEnergy]
	return exporterReading{sample: m, energyMJ: e, hasEnergy: hasEnergy}
}

func metricValue(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.GetGauge().GetValue()
	case m.Counter != nil:
		v = m.GetCounter().GetValue()
	case m.Untyped != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

func first(l map[string]string, names ...string) string {
	for _, n := range names {
		if v := l[n]; v != "" {
			return v
		}
	}
	return ""
}

// errNoSeries means a scrape held no GPU: most likely the URL is not
// dcgm-exporter's.
var errNoSeries = errors.New("no DCGM_FI_* series with a UUID label")
