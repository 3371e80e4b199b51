package gpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// ReplayConfig configures a ReplaySource.
type ReplayConfig struct {
	// Path of a JSON-lines file: one GpuSample per line in the protobuf JSON
	// mapping (protojson), e.g. {"gpuUuid":"GPU-...","sampledAt":"...",...}.
	// Blank lines are skipped.
	Path string
	// Loop starts over at the end of the file instead of returning
	// ErrExhausted. Each later pass is shifted by the span of the file
	// (last sampled_at - first sampled_at + the last interval_s), so that
	// the timeline continues, and its sample ids are cleared so that the
	// Agent derives new ones from the shifted times.
	Loop bool
}

// ReplaySource reads samples from a file, for tests and demos. The file is
// authoritative: samples keep their sampled_at, interval_s, deployment and
// the rest. Each Sample call returns one batch: consecutive lines with the
// same sampled_at, ending early where a GPU repeats.
type ReplaySource struct {
	cfg     ReplayConfig
	f       *os.File
	sc      *bufio.Scanner
	line    int
	pass    int
	inPass  int // samples read in this pass
	ahead   *meterv1.GpuSample
	first   time.Time
	last    time.Time
	lastIv  float64
	spanSet bool
	span    time.Duration
}

var _ Source = (*ReplaySource)(nil)

// NewReplaySource opens the file.
func NewReplaySource(cfg ReplayConfig) (*ReplaySource, error) {
	f, err := os.Open(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("replay file: %w", err)
	}
	s := &ReplaySource{cfg: cfg, f: f}
	s.reset()
	return s, nil
}

func (s *ReplaySource) reset() {
	s.sc = bufio.NewScanner(s.f)
	s.sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	s.line = 0
	s.inPass = 0
}

// Name implements Source.
func (s *ReplaySource) Name() string { return SourceReplay }

// Close implements Source.
func (s *ReplaySource) Close() error { return s.f.Close() }

// Sample implements Source.
func (s *ReplaySource) Sample(ctx context.Context) ([]*meterv1.GpuSample, error) {
	var batch []*meterv1.GpuSample
	seen := map[sampleKey]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		m, err := s.next()
		if errors.Is(err, io.EOF) {
			if len(batch) > 0 {
				return batch, nil
			}
			if !s.cfg.Loop {
				return nil, ErrExhausted
			}
			if err := s.rewind(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		k := keyOf(m)
		if len(batch) > 0 && (seen[k] || !sameTime(batch[0], m)) {
			s.ahead = m
			return batch, nil
		}
		seen[k] = true
		batch = append(batch, m)
	}
}

func sameTime(a, b *meterv1.GpuSample) bool {
	if a.SampledAt == nil || b.SampledAt == nil {
		return a.SampledAt == nil && b.SampledAt == nil
	}
	return a.SampledAt.AsTime().Equal(b.SampledAt.AsTime())
}

// next returns the next sample of the file, shifted for the pass, or io.EOF.
func (s *ReplaySource) next() (*meterv1.GpuSample, error) {
	if m := s.ahead; m != nil {
		s.ahead = nil
		return m, nil
	}
	for s.sc.Scan() {
		s.line++
		text := bytes.TrimSpace(s.sc.Bytes())
		if len(text) == 0 {
			continue
		}
		m := &meterv1.GpuSample{}
		if err := protojson.Unmarshal(text, m); err != nil {
			return nil, fmt.Errorf("replay %s line %d: %w", s.cfg.Path, s.line, err)
		}
		if m.SampledAt != nil {
			if err := m.SampledAt.CheckValid(); err != nil {
				return nil, fmt.Errorf("replay %s line %d: sampledAt: %w", s.cfg.Path, s.line, err)
			}
		}
		s.inPass++
		if s.pass == 0 && m.SampledAt != nil {
			at := m.SampledAt.AsTime()
			if s.first.IsZero() || at.Before(s.first) {
				s.first = at
			}
			if !at.Before(s.last) {
				s.last, s.lastIv = at, m.IntervalS
			}
		}
		if s.pass > 0 {
			if m.SampledAt != nil {
				m.SampledAt = timestamppb.New(m.SampledAt.AsTime().Add(time.Duration(s.pass) * s.span))
			}
			m.SampleId = ""
		}
		return m, nil
	}
	if err := s.sc.Err(); err != nil {
		return nil, fmt.Errorf("replay %s line %d: %w", s.cfg.Path, s.line+1, err)
	}
	return nil, io.EOF
}

// rewind starts the next pass of a looping replay.
func (s *ReplaySource) rewind() error {
	if s.inPass == 0 {
		return fmt.Errorf("replay %s: no samples to loop over", s.cfg.Path)
	}
	if !s.spanSet {
		s.span = s.last.Sub(s.first) + time.Duration(s.lastIv*float64(time.Second))
		s.spanSet = true
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("replay %s: rewind: %w", s.cfg.Path, err)
	}
	s.pass++
	s.reset()
	return nil
}
