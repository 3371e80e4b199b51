package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/ingest/sink"
	"tokenmeter/internal/adapter/chstore"
	"tokenmeter/internal/workload"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The differential tests of RowDecoder: for every input, the fast decoders
// and the library decoders (Decoder.Decode / DecodeGPUSample, i.e.
// protojson and proto.Unmarshal, then FromProto) must accept and reject
// alike, with the same values and the same error.

var rowCmp = []cmp.Option{cmpopts.EquateEmpty(), cmpopts.EquateNaNs()}

func referenceEventRow(value []byte, ct string) (sink.EventRow, error) {
	var ev meterv1.InferenceEvent
	var r sink.EventRow
	err := NewDecoder(DefaultLimits()).Decode(&ev, value, ct)
	if err == nil {
		r.FromProto(&ev)
	}
	return r, err
}

func referenceGPURow(value []byte, ct string) (sink.GPURow, error) {
	var s meterv1.GpuSample
	var r sink.GPURow
	err := DecodeGPUSample(&s, value, ct, DefaultLimits())
	if err == nil {
		r.FromProto(&s)
	}
	return r, err
}

// sameError fails unless both errors are nil or both are *ValidationError
// with the same reason and message.
func sameError(t testing.TB, what string, got, want error) {
	t.Helper()
	if (got == nil) != (want == nil) {
		t.Fatalf("%s: fast decoder error %v, library decoder error %v", what, got, want)
	}
	if got == nil {
		return
	}
	var g, w *ValidationError
	if !errors.As(got, &g) || !errors.As(want, &w) || *g != *w {
		t.Fatalf("%s: fast decoder error %#v, library decoder error %#v", what, got, want)
	}
}

// diffEvent decodes value both ways and fails on any difference. It
// returns whether the record was accepted.
func diffEvent(t testing.TB, d *RowDecoder, value []byte, ct string) bool {
	t.Helper()
	want, werr := referenceEventRow(value, ct)
	var got sink.EventRow
	gerr := d.DecodeEvent(&got, value, ct)
	what := fmt.Sprintf("event %q (content-type %q)", value, ct)
	sameError(t, what, gerr, werr)
	if gerr != nil {
		return false
	}
	if diff := cmp.Diff(want, got, rowCmp...); diff != "" {
		t.Fatalf("%s decodes differently (-library +fast):\n%s", what, diff)
	}
	now := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	sameError(t, what+" validation", DefaultLimits().ValidateRow(&got, now), DefaultLimits().ValidateRow(&want, now))
	return true
}

func diffGPU(t testing.TB, d *RowDecoder, value []byte, ct string) bool {
	t.Helper()
	want, werr := referenceGPURow(value, ct)
	var got sink.GPURow
	gerr := d.DecodeGPUSample(&got, value, ct)
	what := fmt.Sprintf("GPU sample %q (content-type %q)", value, ct)
	sameError(t, what, gerr, werr)
	if gerr != nil {
		return false
	}
	if diff := cmp.Diff(want, got, rowCmp...); diff != "" {
		t.Fatalf("%s decodes differently (-library +fast):\n%s", what, diff)
	}
	return true
}

// corpusEvents are generated events with labels, failed requests and every
// optional field sometimes missing.
func corpusEvents(t testing.TB, n int) []*meterv1.InferenceEvent {
	t.Helper()
	g, err := workload.New(workload.Config{Seed: 7, Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Duration: 24 * time.Hour, Events: n, Tenants: 50})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]*meterv1.InferenceEvent, n)
	for i := range n {
		ev := &meterv1.InferenceEvent{}
		g.Fill(ev, i)
		switch i % 7 {
		case 1:
			ev.Labels = map[string]string{"team": "search", "env": "prod", "feature": "chat " + strconv.Itoa(i%5)}
			ev.ReceivedAt = ev.CompletedAt
		case 2:
			ev.ItlMs, ev.QueueMs, ev.PrefillMs = proto.Float64(rng.Float64()*50), proto.Float64(0), proto.Float64(rng.ExpFloat64())
			ev.Streaming = true
		case 3:
			ev.CachedPromptTokens = proto.Int64(0)
			ev.Status = meterv1.Status_STATUS_RATE_LIMITED
		case 4:
			ev.PromptTokens, ev.TtftMs = nil, nil
		case 5:
			ev.ModelVersion, ev.Region, ev.SloClass, ev.TensorParallelism = "2024-08", "eu-west", "batch", 8
			ev.Labels = map[string]string{"ünïcode": "välue ✓"}
		}
		out[i] = ev
	}
	return out
}

// jsonVariants returns other JSON spellings of one event record that
// protojson reads as the same or rejects: proto field names, int64 as
// numbers, timestamps with offsets, whitespace, and broken forms.
func jsonVariants(t testing.TB, ev *meterv1.InferenceEvent, rng *rand.Rand) [][]byte {
	t.Helper()
	camel, err := protojson.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	snake, err := protojson.MarshalOptions{UseProtoNames: true, UseEnumNumbers: true}.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	out := [][]byte{camel, snake}
	// int64 as JSON numbers (protojson writes strings).
	unquoted := camel
	for _, f := range []string{"promptTokens", "cachedPromptTokens", "outputTokens"} {
		unquoted = unquoteField(unquoted, f)
	}
	out = append(out, unquoted)
	// Whitespace everywhere a token may be separated.
	spaced := strings.NewReplacer(",", " ,\n\t", ":", " : ", "{", "{ ", "}", " }\r\n").Replace(string(camel))
	out = append(out, []byte(spaced))
	if ev.CompletedAt != nil {
		at := ev.CompletedAt.AsTime()
		for _, form := range []string{"2006-01-02T15:04:05.000000000-07:00", "2006-01-02T15:04:05+05:30", "2006-01-02t15:04:05z", "2006-01-02T15:04:05.1234567891Z", "2006-01-02 15:04:05Z"} {
			zone := time.FixedZone("", 5*3600+1800)
			if strings.Contains(form, "-07:00") {
				zone = time.FixedZone("", -7*3600)
			}
			ts := at.In(zone).Format(form)
			if strings.HasSuffix(form, "Z") || strings.HasSuffix(form, "z") {
				ts = at.Format(form)
			}
			out = append(out, replaceValue(camel, "completedAt", strconv.Quote(ts)))
		}
	}
	broken := []string{
		`,"unknownField":1}`, `,"tenantId":"again"}`, `,"tenant_id":"again"}`, `,"model":null}`, `,"labels":{"a":"1","a":"2"}}`,
		`,"streaming":"true"}`, `,"status":"STATUS_NOPE"}`, `,"status":-1}`, `,"tensorParallelism":4294967296}`, `,"tensorParallelism":"7"}`,
		`,"queueMs":"NaN"}`, `,"queueMs":"1.5"}`, `,"queueMs":1e400}`, `,"queueMs":-0}`, `,"queueMs":01}`, `,"itlMs":1.}`,
		`,"engine":"v\u006cllm"}`, `,"engine":"vllm\n"}`, `} `, `}}`, `,}`, `,"slo_class":"x" , "sloClass":"y"}`,
		`,"labels":{}}`, `,"labels":{"k":1}}`, `,"labels":null}`, `,"status":2}`, `,"status":"STATUS_SERVER_ERROR"}`,
	}
	for _, b := range broken {
		out = append(out, append(bytes.Clone(camel[:len(camel)-1]), b...))
	}
	if ev.PromptTokens != nil {
		for _, v := range []string{`" 12"`, `"12 "`, `12.0`, `1e2`, `"-3"`, `-3`, `"0012"`, `9223372036854775807`, `"9223372036854775808"`, `123456789012345678901`} {
			out = append(out, replaceValue(camel, "promptTokens", v))
		}
	}
	// Random damage: truncation and a flipped byte.
	for range 4 {
		out = append(out, camel[:rng.IntN(len(camel))])
		flipped := bytes.Clone(camel)
		flipped[rng.IntN(len(flipped))] = byte(rng.IntN(256))
		out = append(out, flipped)
	}
	return out
}

// unquoteField turns "field":"123" into "field":123.
func unquoteField(js []byte, field string) []byte {
	key := []byte(`"` + field + `":"`)
	i := bytes.Index(js, key)
	if i < 0 {
		return js
	}
	start := i + len(key)
	end := bytes.IndexByte(js[start:], '"')
	out := append(bytes.Clone(js[:start-1]), js[start:start+end]...)
	return append(out, js[start+end+1:]...)
}

// replaceValue replaces the value of "field" (a string or a bare token).
func replaceValue(js []byte, field, value string) []byte {
	key := []byte(`"` + field + `":`)
	i := bytes.Index(js, key)
	if i < 0 {
		return js
	}
	start := i + len(key)
	end := start
	if js[start] == '"' {
		end = start + 1 + bytes.IndexByte(js[start+1:], '"') + 1
	} else {
		for end < len(js) && js[end] != ',' && js[end] != '}' {
			end++
		}
	}
	out := append(bytes.Clone(js[:start]), value...)
	return append(out, js[end:]...)
}

// protoVariants returns wire-format variants of one event record: repeated
// fields (the last wins), a timestamp sent in two parts (they merge),
// repeated label keys, unknown fields, and damage.
func protoVariants(t testing.TB, ev *meterv1.InferenceEvent, rng *rand.Rand) [][]byte {
	t.Helper()
	pb, err := proto.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	out := [][]byte{pb}
	str := func(b []byte, num protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	out = append(out, str(bytes.Clone(pb), 3, "tenant-later"))
	// completed_at again, with nanos only: merges into the first.
	ts := protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 123456789)
	out = append(out, protowire.AppendBytes(protowire.AppendTag(bytes.Clone(pb), 13, protowire.BytesType), ts))
	entry := str(str(nil, 1, "team"), 2, "later")
	out = append(out, protowire.AppendBytes(protowire.AppendTag(bytes.Clone(pb), 25, protowire.BytesType), entry))
	out = append(out, protowire.AppendBytes(protowire.AppendTag(bytes.Clone(pb), 25, protowire.BytesType), str(nil, 2, "no key")))
	out = append(out, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 99, protowire.VarintType), 5))
	out = append(out, protowire.AppendFixed32(protowire.AppendTag(bytes.Clone(pb), 1000, protowire.Fixed32Type), 5))
	out = append(out, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 3, protowire.VarintType), 5))      // wrong wire type
	out = append(out, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 17, protowire.VarintType), 5))     // wrong wire type
	out = append(out, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 22, protowire.VarintType), 1<<40)) // status truncated to int32
	out = append(out, protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 9, protowire.VarintType), 1<<33))  // tensor_parallelism truncated
	out = append(out, str(bytes.Clone(pb), 7, "\xff\xfe"))                                                           // invalid UTF-8
	out = append(out, append(protowire.AppendTag(bytes.Clone(pb), 11, protowire.StartGroupType), protowire.AppendTag(nil, 11, protowire.EndGroupType)...))
	out = append(out, append(protowire.AppendTag(bytes.Clone(pb), 200, protowire.StartGroupType), protowire.AppendTag(nil, 200, protowire.EndGroupType)...))
	for range 4 {
		out = append(out, pb[:rng.IntN(len(pb))])
		flipped := bytes.Clone(pb)
		flipped[rng.IntN(len(flipped))] = byte(rng.IntN(256))
		out = append(out, flipped)
	}
	return out
}

// TestRowDecoderEventsMatchLibrary runs the differential check over a
// generated corpus in both encodings, every variant of each record, and the
// committed fuzz corpora of the event decoders.
func TestRowDecoderEventsMatchLibrary(t *testing.T) {
	events := corpusEvents(t, 3000)
	d := NewRowDecoder(DefaultLimits())
	rng := rand.New(rand.NewPCG(3, 4))
	accepted, rejected := 0, 0
	// The canonical records take the fast path: no fallback at all.
	for _, ev := range events {
		pb, _ := proto.Marshal(ev)
		js, _ := protojson.Marshal(ev)
		snake, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
		for _, rec := range []struct {
			ct string
			v  []byte
		}{{ContentTypeProtobuf, pb}, {ContentTypeJSON, js}, {"", js}, {"", snake}, {"", pb}} {
			if !diffEvent(t, d, rec.v, rec.ct) {
				t.Fatalf("canonical record %q rejected", rec.v)
			}
		}
	}
	if d.Fallbacks != 0 {
		t.Fatalf("%d of %d canonical records fell back to the library decoders", d.Fallbacks, 5*len(events))
	}
	for i, ev := range events[:600] {
		for _, v := range jsonVariants(t, ev, rng) {
			if diffEvent(t, d, v, []string{ContentTypeJSON, ""}[i%2]) {
				accepted++
			} else {
				rejected++
			}
		}
		for _, v := range protoVariants(t, ev, rng) {
			if diffEvent(t, d, v, []string{ContentTypeProtobuf, ""}[i%2]) {
				accepted++
			} else {
				rejected++
			}
		}
	}
	corpus := 0
	for _, dir := range []string{"FuzzDecodeEvent", "FuzzRowDecodeEvent"} {
		for _, in := range fuzzCorpus(t, dir) {
			diffEvent(t, d, in.value, fuzzContentTypes[int(in.ct)%len(fuzzContentTypes)])
			corpus++
		}
	}
	t.Logf("%d canonical records, %d variants accepted and %d rejected alike, %d fuzz corpus entries, %d fallbacks",
		5*len(events), accepted, rejected, corpus, d.Fallbacks)
	if accepted == 0 || rejected == 0 || corpus == 0 {
		t.Fatalf("corpus too narrow: %d accepted, %d rejected, %d fuzz entries", accepted, rejected, corpus)
	}
}

func corpusSamples(n int) []*meterv1.GpuSample {
	out := make([]*meterv1.GpuSample, n)
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		s := testSample(i)
		s.SampleId = fmt.Sprintf("node-%d/gpu-%d/%d", i%7, i%8, i)
		s.SampledAt = timestamppb.New(base.Add(time.Duration(i)*time.Second + time.Duration(i%3)*time.Millisecond))
		s.Utilization = float64(i%101) / 100
		s.PowerWatts, s.EnergyJoules, s.TemperatureC, s.SmClockMhz = 350.5, float64(i)*3500, 61, 1980
		s.FbUsedBytes, s.FbTotalBytes = uint64(i)*1<<20, 80<<30
		if i%3 == 0 {
			s.MigProfile, s.MigInstanceId, s.MigFraction = "3g.40gb", uint32(i%4), 3.0/7
		}
		out[i] = s
	}
	return out
}

func TestRowDecoderGPUSamplesMatchLibrary(t *testing.T) {
	d := NewRowDecoder(DefaultLimits())
	rng := rand.New(rand.NewPCG(5, 6))
	n := 0
	for _, s := range corpusSamples(2000) {
		pb, _ := proto.Marshal(s)
		js, _ := protojson.Marshal(s)
		snake, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(s)
		for _, rec := range []struct {
			ct string
			v  []byte
		}{{ContentTypeProtobuf, pb}, {ContentTypeJSON, js}, {"", snake}} {
			if !diffGPU(t, d, rec.v, rec.ct) {
				t.Fatalf("canonical sample %q rejected", rec.v)
			}
		}
	}
	if d.Fallbacks != 0 {
		t.Fatalf("%d canonical samples fell back", d.Fallbacks)
	}
	for _, s := range corpusSamples(300) {
		js, _ := protojson.Marshal(s)
		pb, _ := proto.Marshal(s)
		variants := [][]byte{
			unquoteField(js, "fbUsedBytes"), replaceValue(js, "gpuIndex", `"3"`), replaceValue(js, "utilization", `"NaN"`),
			replaceValue(js, "fbTotalBytes", `18446744073709551615`), replaceValue(js, "fbTotalBytes", `"18446744073709551616"`),
			append(bytes.Clone(js[:len(js)-1]), `,"gpu_uuid":"x"}`...), append(bytes.Clone(js[:len(js)-1]), `,"extra":"x"}`...),
			js[:rng.IntN(len(js))], pb[:rng.IntN(len(pb))],
			protowire.AppendVarint(protowire.AppendTag(bytes.Clone(pb), 8, protowire.VarintType), 1),
		}
		for _, v := range variants {
			diffGPU(t, d, v, "")
			n++
		}
	}
	for _, dir := range []string{"FuzzDecodeGPUSample", "FuzzRowDecodeGPUSample"} {
		for _, in := range fuzzCorpus(t, dir) {
			diffGPU(t, d, in.value, fuzzContentTypes[int(in.ct)%len(fuzzContentTypes)])
			n++
		}
	}
	t.Logf("%d variants and corpus entries decoded alike, %d fallbacks", n, d.Fallbacks)
}

type fuzzInput struct {
	value []byte
	ct    uint8
}

// fuzzCorpus reads the committed corpus of a fuzz target taking
// (value []byte, ct uint8).
func fuzzCorpus(t testing.TB, target string) []fuzzInput {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", target, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []fuzzInput
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		in, err := parseFuzzFile(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, in)
	}
	return out
}

// parseFuzzFile reads the "go test fuzz v1" format of a two-argument
// ([]byte, uint8) target.
func parseFuzzFile(data []byte) (fuzzInput, error) {
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 3 || lines[0] != "go test fuzz v1" {
		return fuzzInput{}, fmt.Errorf("not a two-value fuzz corpus file")
	}
	v, ok := strings.CutPrefix(lines[1], "[]byte(")
	if !ok || !strings.HasSuffix(v, ")") {
		return fuzzInput{}, fmt.Errorf("first value %q is not []byte", lines[1])
	}
	value, err := strconv.Unquote(strings.TrimSuffix(v, ")"))
	if err != nil {
		return fuzzInput{}, fmt.Errorf("first value: %w", err)
	}
	c, ok := strings.CutPrefix(lines[2], "byte(")
	if !ok {
		c, ok = strings.CutPrefix(lines[2], "uint8(")
	}
	if !ok {
		return fuzzInput{}, fmt.Errorf("second value %q is not a uint8", lines[2])
	}
	c = strings.TrimSuffix(c, ")")
	var ct uint64
	if inner, ok := strings.CutPrefix(c, "'"); ok {
		// A byte literal such as '\x80': its value, not its UTF-8 form.
		r, _, tail, err := strconv.UnquoteChar(strings.TrimSuffix(inner, "'"), '\'')
		if err != nil || tail != "" || r > 0xff {
			return fuzzInput{}, fmt.Errorf("second value %q is not a byte", c)
		}
		ct = uint64(r)
	} else if ct, err = strconv.ParseUint(c, 0, 8); err != nil {
		return fuzzInput{}, fmt.Errorf("second value: %w", err)
	}
	return fuzzInput{value: []byte(value), ct: uint8(ct)}, nil
}

// FuzzRowDecodeEvent is the differential check on fuzzed records: the fast
// event decoder and the library decoders agree on every input.
func FuzzRowDecodeEvent(f *testing.F) {
	ev := validEvent()
	pb, _ := proto.Marshal(ev)
	js, _ := protojson.Marshal(ev)
	f.Add(pb, uint8(2))
	f.Add(js, uint8(1))
	d := NewRowDecoder(DefaultLimits())
	f.Fuzz(func(t *testing.T, value []byte, ct uint8) {
		diffEvent(t, d, value, fuzzContentTypes[int(ct)%len(fuzzContentTypes)])
	})
}

// FuzzRowDecodeGPUSample is FuzzRowDecodeEvent for GPU samples.
func FuzzRowDecodeGPUSample(f *testing.F) {
	s := testSample(1)
	pb, _ := proto.Marshal(s)
	js, _ := protojson.Marshal(s)
	f.Add(pb, uint8(2))
	f.Add(js, uint8(1))
	d := NewRowDecoder(DefaultLimits())
	f.Fuzz(func(t *testing.T, value []byte, ct uint8) {
		diffGPU(t, d, value, fuzzContentTypes[int(ct)%len(fuzzContentTypes)])
	})
}

// benchRecord is the decode benchmarks' corpus in one encoding.
type benchRecord struct {
	name, ct string
	values   [][]byte
}

// benchRecords returns the valid events of a 10,000-event corpus encoded
// as JSON and as protobuf records.
func benchRecords(b *testing.B, limits Limits, now time.Time) []benchRecord {
	var events []*meterv1.InferenceEvent
	for _, ev := range corpusEvents(b, 10_000) {
		if limits.Validate(ev, now) == nil {
			events = append(events, ev)
		}
	}
	var out []benchRecord
	for _, enc := range []struct {
		name, ct string
		marshal  func(proto.Message) ([]byte, error)
	}{{"json", ContentTypeJSON, protojson.Marshal}, {"protobuf", ContentTypeProtobuf, proto.Marshal}} {
		values := make([][]byte, len(events))
		for i, ev := range events {
			values[i], _ = enc.marshal(ev)
		}
		out = append(out, benchRecord{enc.name, enc.ct, values})
	}
	return out
}

// BenchmarkDecodePath measures what the consumer does per record before
// the insert: decode, validate and append to the batch, with the library
// decoders and messages (as before) and with RowDecoder and rows.
func BenchmarkDecodePath(b *testing.B) {
	now := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	limits := DefaultLimits()
	for _, enc := range benchRecords(b, limits, now) {
		values := enc.values
		b.Run(enc.name+"/library", func(b *testing.B) {
			dec := NewDecoder(limits)
			var batch chstore.EventBatch
			var ev meterv1.InferenceEvent
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%len(values) == 0 {
					batch.Reset()
				}
				if err := dec.Decode(&ev, values[i%len(values)], enc.ct); err != nil {
					b.Fatal(err)
				}
				if err := limits.Validate(&ev, now); err != nil {
					b.Fatal(err)
				}
				batch.Append(&ev, ITL(&ev), now, sink.Source{})
			}
		})
		b.Run(enc.name+"/rows", func(b *testing.B) {
			dec := NewRowDecoder(limits)
			var batch chstore.EventBatch
			var row sink.EventRow
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%len(values) == 0 {
					batch.Reset()
				}
				if err := dec.DecodeEvent(&row, values[i%len(values)], enc.ct); err != nil {
					b.Fatal(err)
				}
				if err := limits.ValidateRow(&row, now); err != nil {
					b.Fatal(err)
				}
				batch.AppendRow(&row, RowITL(&row), now, sink.Source{})
			}
		})
	}
}

// BenchmarkRowDecode measures RowDecoder alone (no validation, no batch):
// the consumer's decode of one record straight from the fetched bytes.
func BenchmarkRowDecode(b *testing.B) {
	now := time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)
	limits := DefaultLimits()
	for _, enc := range benchRecords(b, limits, now) {
		values := enc.values
		b.Run(enc.name, func(b *testing.B) {
			dec := NewRowDecoder(limits)
			var row sink.EventRow
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if err := dec.DecodeEvent(&row, values[i%len(values)], enc.ct); err != nil {
					b.Fatal(err)
				}
			}
			if dec.Fallbacks != 0 {
				b.Fatalf("%d records fell back to the library decoder", dec.Fallbacks)
			}
		})
	}
}

// TestRowDecoderInternsOnlyValidLengths: strings longer than MaxStringLen
// (refused by validation) are not kept by the intern table, so a stream of
// bad records cannot pin memory.
func TestRowDecoderInternsOnlyValidLengths(t *testing.T) {
	limits := DefaultLimits()
	d := NewRowDecoder(limits)
	var r sink.EventRow
	for i := range 100 {
		js := fmt.Sprintf(`{"eventId":"e%d","tenantId":"%s-%d","model":"m"}`, i, strings.Repeat("t", 10_000), i)
		if err := d.DecodeEvent(&r, []byte(js), ContentTypeJSON); err != nil {
			t.Fatal(err)
		}
		if err := limits.ValidateRow(&r, time.Now()); err == nil {
			t.Fatal("a 10 kB tenant_id was accepted")
		}
	}
	for s := range d.strs.m {
		if len(s) > limits.MaxStringLen {
			t.Fatalf("the intern table keeps a string of %d bytes", len(s))
		}
	}
	if len(d.strs.m) != 1 { // "m"
		t.Fatalf("the intern table holds %d strings, want only the model", len(d.strs.m))
	}
}

// TestUTCTimestampMatchesTimeParse: the timestamp fast path accepts the
// form producers write (and reads it to the instant time.Parse reads), and
// hands every other text, valid or not, to time.Parse.
func TestUTCTimestampMatchesTimeParse(t *testing.T) {
	fast := []string{
		"2026-11-27T16:05:15Z", "2026-11-27T16:05:15.5Z", "2026-11-27T16:05:15.123456789Z",
		"2026-11-27T16:05:15.123Z", "2026-11-27T16:05:15.123456Z", "2024-02-29T00:00:00Z",
		"2000-02-29T23:59:59Z", "2026-12-31T23:59:59.999999999Z", "0001-01-01T00:00:00Z",
		"9999-12-31T23:59:59.999999999Z",
	}
	library := []string{
		"2026-11-27T16:05:15.1234567891Z", "2026-11-27T16:05:15.Z", "2026-11-27T16:05:15,5Z",
		"2023-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z",
		"2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T23:60:00Z",
		"2026-01-01T23:59:60Z", "0000-01-01T00:00:00Z", "2026-01-01t00:00:00Z", "2026-01-01T00:00:00z",
		"2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00-07:00", "2026-1-01T00:00:00Z", "2026-01-01T00:00:0aZ",
		"+026-01-01T00:00:00Z", "2026-01-01T00:00:00.-1Z", "2026-01-01T00:00:00.1a2Z", "2026-01-01 00:00:00Z",
		"2026-01-01T00:00:00", "",
	}
	check := func(in string) {
		t.Helper()
		got, ok := utcTimestamp([]byte(in))
		want, err := time.Parse(time.RFC3339Nano, in)
		if !ok || err != nil || got.Seconds != want.Unix() || int(got.Nanos) != want.Nanosecond() {
			t.Errorf("utcTimestamp(%q) = %d.%09d, %v; time.Parse reads %d.%09d, %v", in, got.Seconds, got.Nanos, ok, want.Unix(), want.Nanosecond(), err)
		}
	}
	for _, in := range fast {
		check(in)
	}
	for _, in := range library {
		if got, ok := utcTimestamp([]byte(in)); ok {
			t.Errorf("utcTimestamp(%q) = %v, want it handed to time.Parse", in, got)
		}
	}
	// Every second of a leap year's days and hours, at a few fractions.
	for day := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC); day.Year() == 2024; day = day.Add(7*time.Hour + 13*time.Minute + 17*time.Second) {
		for _, frac := range []string{"", ".1", ".000000001", ".987654321", ".5000"} {
			check(day.Format("2006-01-02T15:04:05") + frac + "Z")
		}
	}
}

// TestExactDecimalMatchesParseFloat: the float fast path accepts every
// plain decimal of at most 15 digits, reads it to ParseFloat's value bit
// for bit, and hands every other form to ParseFloat.
func TestExactDecimalMatchesParseFloat(t *testing.T) {
	fast := []string{"0", "-0", "0.0", "-0.0", "1", "12.5", "0.1", "0.3", "123456789012345",
		"0.00000000000001", "99999999.9999999", "-17.25", "3.14159265358979", "2596.397", "0.068"}
	library := []string{"1234567890123456", "0.000000000000001", "1e5", "1.5E-3", ".5", "5.", "-", "", "1.2.3",
		",5", "1,5", "+1", "0x10", "Infinity", "NaN"}
	check := func(in string) {
		t.Helper()
		got, ok := exactDecimal([]byte(in))
		want, err := strconv.ParseFloat(in, 64)
		if !ok || err != nil || math.Float64bits(got) != math.Float64bits(want) {
			t.Errorf("exactDecimal(%q) = %v (%#x), %v; ParseFloat %v (%#x), %v", in, got, math.Float64bits(got), ok, want, math.Float64bits(want), err)
		}
	}
	for _, in := range fast {
		check(in)
	}
	for _, in := range library {
		if got, ok := exactDecimal([]byte(in)); ok {
			t.Errorf("exactDecimal(%q) = %v, want it handed to ParseFloat", in, got)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	fastN, libraryN := 0, 0
	for range 100_000 {
		intDigits, fracDigits := rng.IntN(10), rng.IntN(10)
		in := strconv.FormatUint(rng.Uint64N(uint64(math.Pow10(intDigits))+1), 10)
		if fracDigits > 0 {
			f := strconv.FormatUint(rng.Uint64N(uint64(math.Pow10(fracDigits))), 10)
			in += "." + strings.Repeat("0", fracDigits-len(f)) + f
		}
		if rng.IntN(2) == 0 {
			in = "-" + in
		}
		if len(in)-strings.Count(in, "-")-strings.Count(in, ".") <= 15 {
			check(in)
			fastN++
			continue
		}
		if got, ok := exactDecimal([]byte(in)); ok {
			t.Errorf("exactDecimal(%q) = %v: %d digits, want it handed to ParseFloat", in, got, len(in))
		}
		libraryN++
	}
	if fastN == 0 || libraryN == 0 {
		t.Fatalf("random inputs too narrow: %d fast, %d library", fastN, libraryN)
	}
}

// TestTypicalRecordsTakeFastPaths: the timestamps and milliseconds of the
// records the workload generator writes (as protojson writes them) take the
// fast paths, not time.Parse and ParseFloat, and the records decode without
// a fallback.
func TestTypicalRecordsTakeFastPaths(t *testing.T) {
	g, err := workload.New(workload.Config{Seed: 7, Start: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), Duration: 24 * time.Hour, Events: 2000, Tenants: 50})
	if err != nil {
		t.Fatal(err)
	}
	d := NewRowDecoder(DefaultLimits())
	var r sink.EventRow
	stamps, numbers := 0, 0
	for i := range 2000 {
		ev := &meterv1.InferenceEvent{}
		g.Fill(ev, i)
		js, err := protojson.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.DecodeEvent(&r, js, ContentTypeJSON); err != nil {
			t.Fatalf("record %s: %v", js, err)
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		var fields map[string]any
		if err := dec.Decode(&fields); err != nil {
			t.Fatal(err)
		}
		for name, v := range fields {
			switch {
			case name == "receivedAt" || name == "completedAt":
				if _, ok := utcTimestamp([]byte(v.(string))); !ok {
					t.Fatalf("%s %q of a typical record went to time.Parse", name, v)
				}
				stamps++
			case strings.HasSuffix(name, "Ms"):
				if _, ok := exactDecimal([]byte(v.(json.Number))); !ok {
					t.Fatalf("%s %s of a typical record went to ParseFloat", name, v)
				}
				numbers++
			}
		}
	}
	if d.Fallbacks != 0 {
		t.Fatalf("%d of 2000 typical records fell back to protojson", d.Fallbacks)
	}
	if stamps < 2000 || numbers < 2000 {
		t.Fatalf("too few fields checked: %d timestamps, %d milliseconds", stamps, numbers)
	}
}
