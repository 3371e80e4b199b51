package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/url"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// coverage waits, after a replay, until what was accepted can be queried:
// the raw usage of the replayed span has grown by the accepted events (the
// consumer inserted them), and the rollups count as many requests as the raw
// rows (the rollup job covered those hours). The span is whole hours, as
// the rollups are.
type coverage struct {
	client     *client
	start, end time.Time
	poll       time.Duration
}

func newCoverage(c *client, first, last time.Time) *coverage {
	return &coverage{
		client: c,
		start:  first.UTC().Truncate(time.Hour),
		end:    last.UTC().Truncate(time.Hour).Add(time.Hour),
		poll:   500 * time.Millisecond,
	}
}

// requests returns the requests of the span in the raw usage and in the rollups.
func (cv *coverage) requests(ctx context.Context) (raw, rolled uint64, err error) {
	start, end := cv.start.Format(time.RFC3339), cv.end.Format(time.RFC3339)
	data, err := cv.client.do(ctx, "GET", "/v1/usage", url.Values{"start": {start}, "end": {end}, "granularity": {"total"}}, nil)
	if err != nil {
		return 0, 0, err
	}
	var usage meterv1.GetUsageResponse
	if err := protojson.Unmarshal(data, &usage); err != nil {
		return 0, 0, fmt.Errorf("usage answer: %w", err)
	}
	for _, b := range usage.Buckets {
		raw += uint64(b.Requests)
	}
	data, err = cv.client.do(ctx, "GET", "/v1/traffic", url.Values{"start": {start}, "end": {end}, "step": {"total"}}, nil)
	if err != nil {
		return 0, 0, err
	}
	var traffic meterv1.GetTrafficResponse
	if err := protojson.Unmarshal(data, &traffic); err != nil {
		return 0, 0, fmt.Errorf("traffic answer: %w", err)
	}
	for _, s := range traffic.Series {
		rolled += s.GetSummary().GetRequests()
	}
	return raw, rolled, nil
}

// wait polls until the raw usage holds at least want requests and the
// rollups as many as the raw usage, or until timeout, saying which is
// behind when it gives up.
func (cv *coverage) wait(ctx context.Context, want uint64, timeout time.Duration, progress io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var raw, rolled uint64
	var lastErr error // of the last poll; nil once one succeeded since
	polled := false
	for {
		r, ro, err := cv.requests(ctx)
		switch {
		case err == nil:
			raw, rolled, lastErr, polled = r, ro, nil, true
			if raw >= want && rolled == raw {
				fmt.Fprintf(progress, "ingested and rolled up: %d requests in %s..%s\n", raw, cv.start.Format(time.RFC3339), cv.end.Format(time.RFC3339))
				return nil
			}
		case ctx.Err() != nil:
		case !retryable(err):
			return fmt.Errorf("wait for ingest: %w", err)
		default:
			lastErr = err
		}
		select {
		case <-ctx.Done():
			switch {
			case lastErr != nil || !polled:
				return fmt.Errorf("gave up after %s: %w", timeout, cmp.Or(lastErr, ctx.Err()))
			case raw < want:
				return fmt.Errorf("gave up after %s: the usage holds %d of the %d requests expected: the consumer is behind or stopped (see meterd's log)", timeout, raw, want)
			default:
				return fmt.Errorf("gave up after %s: the rollups count %d of %d requests: the rollup job is behind or stopped (see meterd's log)", timeout, rolled, raw)
			}
		case <-time.After(cv.poll):
		}
	}
}
