package query

import (
	"context"
	"time"
)

// Watermark returns how far the rollup job named job (rollup.JobName,
// rollup.EngineJobName) has rolled up: every insert stamped before it is
// in the rollups. ok is false before the job's first run.
func (s *Service) Watermark(ctx context.Context, job string) (t time.Time, ok bool, err error) {
	return s.src.Watermark(ctx, job)
}
