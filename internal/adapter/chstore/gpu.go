package chstore

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// gpuColumns is the explicit column list of every insert into gpu_samples,
// in the order GPUBatch appends them.
var gpuColumns = []string{
	"sample_id", "node", "gpu_uuid", "gpu_index", "gpu_type", "mig_profile",
	"mig_instance_id", "mig_fraction", "deployment", "pod", "namespace",
	"region", "pool", "sampled_at", "sampled_at_ms", "interval_s", "utilization",
	"fb_used_bytes", "fb_total_bytes", "power_watts", "energy_joules",
	"temperature_c", "sm_clock_mhz", "source", "ingested_at",
	"sm_active", "sm_clock_max_mhz",
}

// gpu_samples.sm_active holds SM activity in units of 1/smActiveScale;
// smActiveAbsent marks a sample without it (migration 0024).
const (
	smActiveScale  = 10_000
	smActiveAbsent = 65535
)

// InsertGPUSamplesSQL is the statement every GPU sample batch is sent with.
var InsertGPUSamplesSQL = "INSERT INTO gpu_samples (" + strings.Join(gpuColumns, ", ") + ")"

// GPUBatch accumulates validated GPU samples column by column for one
// columnar INSERT. Reset reuses the memory.
type GPUBatch struct {
	sampleID, node, uuid                     []string
	index                                    []uint32
	gpuType, migProfile                      []string
	migInstance                              []uint32
	migFraction                              []float64
	deployment, pod, namespace, region, pool []string
	sampledAt                                []time.Time
	sampledMs                                []int64
	interval, util                           []float64
	fbUsed, fbTotal                          []uint64
	power, energy, temp, smClock             []float64
	source                                   []string
	ingestedAt                               []time.Time
	smActive                                 []uint16
	smClockMax                               []float64
}

// Len is the number of rows in the batch.
func (b *GPUBatch) Len() int { return len(b.sampleID) }

// Reset empties the batch, keeping its memory.
func (b *GPUBatch) Reset() {
	*b = GPUBatch{
		sampleID: b.sampleID[:0], node: b.node[:0], uuid: b.uuid[:0], index: b.index[:0],
		gpuType: b.gpuType[:0], migProfile: b.migProfile[:0], migInstance: b.migInstance[:0],
		migFraction: b.migFraction[:0], deployment: b.deployment[:0], pod: b.pod[:0],
		namespace: b.namespace[:0], region: b.region[:0], pool: b.pool[:0],
		sampledAt: b.sampledAt[:0], sampledMs: b.sampledMs[:0], interval: b.interval[:0],
		util: b.util[:0], fbUsed: b.fbUsed[:0], fbTotal: b.fbTotal[:0], power: b.power[:0],
		energy: b.energy[:0], temp: b.temp[:0], smClock: b.smClock[:0], source: b.source[:0],
		ingestedAt: b.ingestedAt[:0], smActive: b.smActive[:0], smClockMax: b.smClockMax[:0],
	}
}

// Append adds one sample, which the caller has validated.
func (b *GPUBatch) Append(s *meterv1.GpuSample, ingestedAt time.Time) {
	var r sink.GPURow
	r.FromProto(s)
	b.AppendRow(&r, ingestedAt)
}

// AppendRow adds one sample row, which the caller has validated.
func (b *GPUBatch) AppendRow(r *sink.GPURow, ingestedAt time.Time) {
	b.sampleID = append(b.sampleID, r.SampleID)
	b.node = append(b.node, r.Node)
	b.uuid = append(b.uuid, r.GPUUUID)
	b.index = append(b.index, r.GPUIndex)
	b.gpuType = append(b.gpuType, r.GPUType)
	b.migProfile = append(b.migProfile, r.MIGProfile)
	b.migInstance = append(b.migInstance, r.MIGInstanceID)
	b.migFraction = append(b.migFraction, r.MIGFraction)
	b.deployment = append(b.deployment, r.Deployment)
	b.pod = append(b.pod, r.Pod)
	b.namespace = append(b.namespace, r.Namespace)
	b.region = append(b.region, r.Region)
	b.pool = append(b.pool, r.Pool)
	b.sampledAt = append(b.sampledAt, time.Unix(r.SampledAt.Seconds, 0).UTC())
	b.sampledMs = append(b.sampledMs, unixMilli(r.SampledAt))
	b.interval = append(b.interval, r.IntervalS)
	b.util = append(b.util, r.Utilization)
	b.fbUsed = append(b.fbUsed, r.FBUsedBytes)
	b.fbTotal = append(b.fbTotal, r.FBTotalBytes)
	b.power = append(b.power, r.PowerWatts)
	b.energy = append(b.energy, r.EnergyJoules)
	b.temp = append(b.temp, r.TemperatureC)
	b.smClock = append(b.smClock, r.SMClockMHz)
	b.source = append(b.source, r.Source)
	b.ingestedAt = append(b.ingestedAt, ingestedAt.Truncate(time.Second))
	smActive := uint16(smActiveAbsent)
	if r.SMActive.Set {
		smActive = uint16(math.Round(min(max(r.SMActive.V, 0), 1) * smActiveScale))
	}
	b.smActive = append(b.smActive, smActive)
	b.smClockMax = append(b.smClockMax, r.SMClockMaxMHz)
}

func (b *GPUBatch) columns() []any {
	return []any{
		b.sampleID, b.node, b.uuid, b.index, b.gpuType, b.migProfile,
		b.migInstance, b.migFraction, b.deployment, b.pod, b.namespace,
		b.region, b.pool, b.sampledAt, b.sampledMs, b.interval, b.util,
		b.fbUsed, b.fbTotal, b.power, b.energy,
		b.temp, b.smClock, b.source, b.ingestedAt,
		b.smActive, b.smClockMax,
	}
}

// NewGPUBatch implements ingest.GPUSampleWriter: an empty *GPUBatch.
func (s *Store) NewGPUBatch() sink.GPUBatch { return new(GPUBatch) }

// InsertGPUSamples writes the batch, a *GPUBatch, in one INSERT with an
// explicit column list. An empty batch is a no-op; the batch is left as it
// is.
func (s *Store) InsertGPUSamples(ctx context.Context, batch sink.GPUBatch) error {
	b, ok := batch.(*GPUBatch)
	if !ok {
		return fmt.Errorf("insert GPU samples batch: %w", errForeignBatch(batch))
	}
	if b.Len() == 0 {
		return nil
	}
	return s.sendColumns(s.ingestContext(ctx), "insert GPU samples batch", InsertGPUSamplesSQL, gpuColumns, b.columns())
}

// sendBlocks sends one columnar INSERT in blocks: next returns the columns
// of each block in turn, then nil; an error from next abandons the INSERT.
// The driver's column buffers are reused from block to block, so a large
// INSERT needs no more memory than a block (ClickHouse squashes the blocks
// of an INSERT into parts of up to about a million rows).
func (s *Store) sendBlocks(ctx context.Context, what, insert string, names []string, next func() ([]any, error)) error {
	batch, err := s.conn.PrepareBatch(ctx, insert)
	if err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	for block := 0; ; block++ {
		cols, err := next()
		if err != nil {
			_ = batch.Abort()
			return fmt.Errorf("%s: %w", what, err)
		}
		if cols == nil {
			break
		}
		if block > 0 {
			if err := batch.Flush(); err != nil {
				_ = batch.Abort()
				return fmt.Errorf("%s: %w", what, classify(err))
			}
		}
		for i, col := range cols {
			if err := appendColumn(batch.Column(i), col); err != nil {
				_ = batch.Abort()
				return fmt.Errorf("%s: column %s: %w", what, names[i], err)
			}
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("%s: %w", what, classify(err))
	}
	return nil
}

// appendColumn appends a column's values. clickhouse-go appends a slice of
// arrays by reflection, element by element (about 10x slower than its typed
// path for one array), so arrays are appended row by row.
func appendColumn(col driver.BatchColumn, values any) error {
	switch v := values.(type) {
	case [][]int16:
		return appendRows(col, v)
	case [][]uint64:
		return appendRows(col, v)
	case [][]string:
		return appendRows(col, v)
	}
	return col.Append(values)
}

func appendRows[T any](col driver.BatchColumn, rows []T) error {
	for _, r := range rows {
		if err := col.AppendRow(r); err != nil {
			return err
		}
	}
	return nil
}

// errForeignBatch is the error of an insert given a batch that the store
// did not make.
func errForeignBatch(b any) error {
	return fmt.Errorf("a batch of type %T, not one this store made", b)
}
