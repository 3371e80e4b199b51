package rollup

import (
	"context"
	"time"
)

// ProgressStore is what Costed reads; *chstore.Store implements it.
type ProgressStore interface {
	ServerNow(ctx context.Context) (time.Time, error)
	Watermark(ctx context.Context, job string) (time.Time, bool, error)
	DirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
	GPUDirtyHours(ctx context.Context, since, until time.Time) ([]time.Time, error)
}

// Costed returns the server time up to which every insert of events and GPU
// samples is rolled up and costed; ok is false before the job's first run.
//
// That is the job's watermark, or later when nothing was inserted since it:
// a run that finds nothing to do writes the watermark only once a minute
// (idleWatermarkEvery), so on a quiet system the watermark alone lags the
// clock by up to a minute and more. With no event or GPU sample stamped
// from the watermark to the server's clock less settle, a run now would
// find nothing to do and could move the watermark there: Costed answers
// that instant, under the same assumption the job makes (an insert is
// visible settle after it is stamped; settle is the job's Config.Settle,
// DefaultSettle). A price book put since the last run is not Costed's to
// see: its caller compares the cost rows' price versions.
func Costed(ctx context.Context, store ProgressStore, settle time.Duration) (t time.Time, ok bool, err error) {
	wm, ok, err := store.Watermark(ctx, JobName)
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	now, err := store.ServerNow(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	until := now.Add(-settle)
	if !until.After(wm) {
		return wm, true, nil
	}
	for _, dirty := range []func(context.Context, time.Time, time.Time) ([]time.Time, error){store.DirtyHours, store.GPUDirtyHours} {
		hours, err := dirty(ctx, wm, until)
		if err != nil {
			return time.Time{}, false, err
		}
		if len(hours) > 0 {
			return wm, true, nil
		}
	}
	// The dirty tables are read by whole seconds: until's own second is
	// not covered.
	return until.Truncate(time.Second), true, nil
}
