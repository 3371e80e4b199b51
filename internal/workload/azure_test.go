package workload

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

func readSample(t *testing.T, cfg AzureConfig) []*meterv1.InferenceEvent {
	t.Helper()
	f, err := os.Open("testdata/azure_sample.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ReadAzureCSV(f, cfg)
	if err != nil {
		t.Fatalf("ReadAzureCSV: %v", err)
	}
	return evs
}

func TestReadAzureCSV(t *testing.T) {
	evs := readSample(t, AzureConfig{Seed: 3})
	if len(evs) != 20 {
		t.Fatalf("%d events, want 20", len(evs))
	}
	first := evs[0]
	wantArrival := time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC)
	if got := first.GetReceivedAt().AsTime(); !got.Equal(wantArrival) {
		t.Errorf("received_at %s, want the row's TIMESTAMP %s", got, wantArrival)
	}
	if first.GetPromptTokens() != 374 || first.GetOutputTokens() != 44 {
		t.Errorf("tokens %d/%d, want 374/44", first.GetPromptTokens(), first.GetOutputTokens())
	}
	ids := map[string]bool{}
	for i, ev := range evs {
		if err := checkEvent(ev); err != nil {
			t.Errorf("row %d: %v", i+2, err)
		}
		if ev.GetStatus() != meterv1.Status_STATUS_OK {
			t.Errorf("row %d: status %s, want OK (the trace holds finished requests)", i+2, ev.GetStatus())
		}
		if ids[ev.GetEventId()] {
			t.Errorf("row %d: duplicate event_id %s", i+2, ev.GetEventId())
		}
		ids[ev.GetEventId()] = true
	}
	// Row 14 generated no tokens: still a valid, successful event.
	if ev := evs[12]; ev.GetOutputTokens() != 0 || ev.GetTtftMs() != ev.GetE2EMs() {
		t.Errorf("row 14: output %d, ttft %g, e2e %g: want 0 tokens and ttft = e2e", ev.GetOutputTokens(), ev.GetTtftMs(), ev.GetE2EMs())
	}

	// Deterministic for a seed, different for another.
	if diff := cmp.Diff(evs, readSample(t, AzureConfig{Seed: 3}), protocmp.Transform()); diff != "" {
		t.Errorf("same trace and seed, different events (-first +second):\n%s", diff)
	}
	if other := readSample(t, AzureConfig{Seed: 4}); other[0].GetEventId() == evs[0].GetEventId() {
		t.Errorf("seeds 3 and 4 give the same event_id %s", evs[0].GetEventId())
	}
}

func TestReadAzureCSVTenantAndShift(t *testing.T) {
	end := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	evs := readSample(t, AzureConfig{Tenant: "acme", EndAt: end, Models: DefaultModels()[:1]})
	var last time.Time
	for i, ev := range evs {
		if ev.GetTenantId() != "acme" || ev.GetModel() != DefaultModels()[0].Name {
			t.Errorf("row %d: tenant %q model %q, want acme and %s", i+2, ev.GetTenantId(), ev.GetModel(), DefaultModels()[0].Name)
		}
		if err := checkEvent(ev); err != nil {
			t.Errorf("row %d after the shift: %v", i+2, err)
		}
		if at := ev.GetCompletedAt().AsTime(); at.After(last) {
			last = at
		}
	}
	if !last.Equal(end) {
		t.Errorf("latest completed_at %s, want EndAt %s", last, end)
	}
	unshifted := readSample(t, AzureConfig{Tenant: "acme", Models: DefaultModels()[:1]})
	if got, want := evs[0].GetEventId(), unshifted[0].GetEventId(); got != want {
		t.Errorf("shifting changed event_id %s to %s", want, got)
	}
}

func TestAzureSpanAndStreaming(t *testing.T) {
	f, err := os.Open("testdata/azure_sample.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	span, err := AzureSpan(f, AzureConfig{Seed: 9})
	if err != nil {
		t.Fatalf("AzureSpan: %v", err)
	}
	all := readSample(t, AzureConfig{Seed: 9})
	if span.Events != len(all) {
		t.Errorf("span has %d events, want %d", span.Events, len(all))
	}
	end := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	a, err := NewAzureReader(f, AzureConfig{Seed: 9, Shift: end.Sub(span.Last)})
	if err != nil {
		t.Fatalf("NewAzureReader: %v", err)
	}
	var latest time.Time
	var ev meterv1.InferenceEvent
	for n := 0; ; n++ {
		err := a.Read(&ev)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		if got, want := ev.GetEventId(), all[n].GetEventId(); got != want {
			t.Errorf("event %d: id %s, want %s as from ReadAzureCSV", n, got, want)
		}
		if at := ev.GetCompletedAt().AsTime(); at.After(latest) {
			latest = at
		}
	}
	if !latest.Equal(end) {
		t.Errorf("latest completed_at %s after Shift, want %s", latest, end)
	}
	if _, err := NewAzureReader(strings.NewReader("TIMESTAMP,ContextTokens,GeneratedTokens\n"), AzureConfig{EndAt: end}); err == nil {
		t.Error("NewAzureReader accepted EndAt, which only ReadAzureCSV can honour")
	}
}

func TestReadAzureCSVFormats(t *testing.T) {
	in := "\ufefftimestamp, ContextTokens ,GeneratedTokens\r\n" +
		"2023-11-16 18:15:46.6805900,374,44\r\n" +
		"\r\n" +
		"2024-05-10 00:00:00.009930+00:00,10,2\r\n" +
		"2024-05-10T00:00:01.5Z,11,3\r\n" +
		"2024-05-10 02:00:01+02:00, 12 , 4\r\n" +
		"2024-05-10 00:00:02,13,5\r\n"
	evs, err := ReadAzureCSV(strings.NewReader(in), AzureConfig{})
	if err != nil {
		t.Fatalf("ReadAzureCSV: %v", err)
	}
	want := []time.Time{
		time.Date(2023, 11, 16, 18, 15, 46, 680590000, time.UTC),
		time.Date(2024, 5, 10, 0, 0, 0, 9930000, time.UTC),
		time.Date(2024, 5, 10, 0, 0, 1, 500000000, time.UTC),
		time.Date(2024, 5, 10, 0, 0, 1, 0, time.UTC),
		time.Date(2024, 5, 10, 0, 0, 2, 0, time.UTC),
	}
	if len(evs) != len(want) {
		t.Fatalf("%d events, want %d", len(evs), len(want))
	}
	for i, ev := range evs {
		if got := ev.GetReceivedAt().AsTime(); !got.Equal(want[i]) {
			t.Errorf("event %d: received_at %s, want %s", i, got, want[i])
		}
	}
}

func TestReadAzureCSVMalformed(t *testing.T) {
	const header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	const good = "2023-11-16 18:15:46.6805900,374,44\n"
	tests := []struct {
		name     string
		in       string
		wantLine int
		wantErr  error // also wrapped, besides ErrMalformedRow; nil: not checked
	}{
		{"empty input", "", 1, nil},
		{"wrong header", "time,prompt,output\n" + good, 1, nil},
		{"missing column", header + good + "2023-11-16 18:15:47.0000000,374\n", 3, nil},
		{"extra column", header + good + good + "2023-11-16 18:15:47.0000000,1,2,3\n", 4, nil},
		{"bad timestamp", header + "16/11/2023 18:15:46,374,44\n", 2, nil},
		{"non-numeric tokens", header + good + good + good + "2023-11-16 18:15:47.0000000,abc,44\n", 5, strconv.ErrSyntax},
		{"negative tokens", header + good + "2023-11-16 18:15:47.0000000,374,-1\n", 3, nil},
		{"token overflow", header + "2023-11-16 18:15:47.0000000,99999999999999999999,1\n", 2, strconv.ErrRange},
		{"bare quote", header + good + "2023-11-16 18:15:47\"0,1,2\n", 3, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadAzureCSV(strings.NewReader(tt.in), AzureConfig{})
			if !errors.Is(err, ErrMalformedRow) {
				t.Fatalf("error %v, want ErrMalformedRow", err)
			}
			var re *RowError
			if !errors.As(err, &re) || re.Line != tt.wantLine {
				t.Errorf("error %v, want a *RowError on line %d", err, tt.wantLine)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want it to wrap %v", err, tt.wantErr)
			}
		})
	}
}

func TestAzureReaderGoesOnAfterBadRow(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:47.0000000,x,44\n" +
		"2023-11-16 18:15:48.0000000,375,45\n"
	a, err := NewAzureReader(strings.NewReader(in), AzureConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var got []error
	var prompts []int64
	for {
		ev, err := a.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		got = append(got, err)
		if err == nil {
			prompts = append(prompts, ev.GetPromptTokens())
		}
	}
	if len(got) != 3 || got[0] != nil || !errors.Is(got[1], ErrMalformedRow) || got[2] != nil {
		t.Errorf("results %v, want ok, a malformed row, ok", got)
	}
	if diff := cmp.Diff([]int64{374, 375}, prompts); diff != "" {
		t.Errorf("prompt tokens (-want +got):\n%s", diff)
	}
}

func BenchmarkAzureRead(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	start := time.Date(2023, 11, 16, 18, 0, 0, 0, time.UTC)
	for i := range 10_000 {
		sb.WriteString(start.Add(time.Duration(i) * 37 * time.Millisecond).Format("2006-01-02 15:04:05.0000000"))
		sb.WriteString(",")
		sb.WriteString(strconv.Itoa(100 + i%4000))
		sb.WriteString(",")
		sb.WriteString(strconv.Itoa(10 + i%300))
		sb.WriteString("\n")
	}
	in := sb.String()
	b.ReportAllocs()
	for b.Loop() {
		a, err := NewAzureReader(strings.NewReader(in), AzureConfig{})
		if err != nil {
			b.Fatal(err)
		}
		var ev meterv1.InferenceEvent
		for a.Read(&ev) == nil {
		}
	}
}
