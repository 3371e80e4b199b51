package ingest_test

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestValidateEngineSampleEnginesAndRestarts checks the engines a sample
// may name (NIM and Dynamo among them) and that a sample counts at most
// one restart (a scrape cannot see more).
func TestValidateEngineSampleEnginesAndRestarts(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	sample := func(engine string, restarts *uint32) *meterv1.EngineSample {
		return &meterv1.EngineSample{SampleId: "s1", Deployment: "d", Engine: engine, Replica: "d-0",
			SampledAt: timestamppb.New(now.Add(-time.Minute)), IntervalS: 10, Source: "scrape", Restarts: restarts}
	}
	u32 := func(v uint32) *uint32 { return &v }
	for _, tc := range []struct {
		name string
		s    *meterv1.EngineSample
		ok   bool
	}{
		{"vllm", sample("vllm", nil), true},
		{"nim", sample("nim", u32(0)), true},
		{"dynamo restarted", sample("dynamo", u32(1)), true},
		{"unknown engine", sample("trtllm", nil), false},
		{"two restarts", sample("vllm", u32(2)), false},
	} {
		err := ingest.DefaultLimits().ValidateEngineSample(tc.s, now)
		var ve *ingest.ValidationError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case !tc.ok && !errors.As(err, &ve):
			t.Errorf("%s: %v, want a *ValidationError", tc.name, err)
		}
	}
}
