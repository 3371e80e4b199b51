package ingest

import (
	"google.golang.org/protobuf/reflect/protoreflect"

	"tokenmeter/ingest/sink"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// RowDecoder decodes event and GPU sample records straight into rows
// (sink.EventRow, sink.GPURow), without a message per record.
//
// Why by hand: protojson and proto.Unmarshal build a message per record
// through reflection, with a pointer per optional field, a map for the
// labels and a submessage per timestamp; on the consumer's path that was
// most of meterd's CPU. The fast paths below read the common shape of a
// record directly. They are a strict subset of the library decoders: any
// input they are not sure of (an escape in a JSON string, null, a number
// in an unusual form, an unknown or repeated field, a wire type that does
// not match, invalid UTF-8, a syntax error) is handed to protojson or
// proto.Unmarshal, whose result (value or error, with its message) is what
// the record decodes to. So every record decodes exactly as before, and
// every rejection reads as before; the differential tests and the fuzz
// targets check that the two agree on every input.
//
// A RowDecoder is not safe for concurrent use.
type RowDecoder struct {
	limits Limits
	strs   interner
	// eventKeys and gpuKeys find the fields of JSON records by name.
	eventKeys, gpuKeys keyOrder
	ev                 meterv1.InferenceEvent
	gs                 meterv1.GpuSample
	// Fallbacks counts records the fast paths handed to the library
	// decoders (for tests and benchmarks).
	Fallbacks int
}

// NewRowDecoder returns a RowDecoder enforcing limits.MaxRecordBytes.
func NewRowDecoder(limits Limits) *RowDecoder {
	return &RowDecoder{
		limits:    limits,
		strs:      interner{maxLen: limits.MaxStringLen},
		eventKeys: newKeyOrder(eventFieldNumbers),
		gpuKeys:   newKeyOrder(gpuFieldNumbers),
	}
}

// DecodeEvent fills r from value, as Decoder.Decode then
// sink.EventRow.FromProto would. Errors are *ValidationError with
// reason decode or oversized.
func (d *RowDecoder) DecodeEvent(r *sink.EventRow, value []byte, contentType string) error {
	isJSON, err := d.precheck(value, contentType)
	if err != nil {
		return err
	}
	r.Reset()
	var ok bool
	if isJSON {
		ok = d.jsonEvent(r, value)
	} else {
		ok = d.protoEvent(r, value)
	}
	if ok {
		r.SortLabels()
		return nil
	}
	d.Fallbacks++
	if err := decodeRecord(&d.ev, "event", value, contentType, d.limits); err != nil {
		return err
	}
	r.FromProto(&d.ev)
	return nil
}

// DecodeGPUSample fills r from value, as DecodeGPUSample then
// sink.GPURow.FromProto would.
func (d *RowDecoder) DecodeGPUSample(r *sink.GPURow, value []byte, contentType string) error {
	isJSON, err := d.precheck(value, contentType)
	if err != nil {
		return err
	}
	*r = sink.GPURow{}
	var ok bool
	if isJSON {
		ok = d.jsonGPU(r, value)
	} else {
		ok = d.protoGPU(r, value)
	}
	if ok {
		return nil
	}
	d.Fallbacks++
	if err := decodeRecord(&d.gs, "GPU sample", value, contentType, d.limits); err != nil {
		return err
	}
	r.FromProto(&d.gs)
	return nil
}

// precheck applies decodeRecord's checks that come before decoding.
func (d *RowDecoder) precheck(value []byte, contentType string) (isJSON bool, err error) {
	if len(value) > d.limits.MaxRecordBytes {
		return false, invalid(ReasonOversized, "record is %d bytes, limit is %d", len(value), d.limits.MaxRecordBytes)
	}
	if len(value) == 0 {
		return false, invalid(ReasonDecode, "record is empty")
	}
	return recordIsJSON(value, contentType)
}

// interner returns one string per distinct byte sequence, so that the
// low-cardinality fields (tenant, model, deployment, …) of a batch share
// their strings instead of allocating one per record. It forgets everything
// when it holds maxInterned strings, and keeps none longer than maxLen
// (validation refuses those anyway), so it holds at most
// maxInterned × maxLen bytes (4 MiB with the default limits) whatever the
// records.
type interner struct {
	m      map[string]string
	maxLen int
}

const maxInterned = 1 << 14

func (in *interner) get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > in.maxLen {
		return string(b)
	}
	if s, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if in.m == nil || len(in.m) >= maxInterned {
		in.m = make(map[string]string, 256)
	}
	s := string(b)
	in.m[s] = s
	return s
}

// fieldNumbers maps both JSON names of each field of md (lowerCamelCase
// and the proto name), as protojson accepts them, to the field number.
func fieldNumbers(md protoreflect.MessageDescriptor) map[string]protowireNumber {
	out := map[string]protowireNumber{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		out[fd.JSONName()] = protowireNumber(fd.Number())
		out[string(fd.Name())] = protowireNumber(fd.Number())
	}
	return out
}

type protowireNumber = int32

var (
	eventFieldNumbers = fieldNumbers((&meterv1.InferenceEvent{}).ProtoReflect().Descriptor())
	gpuFieldNumbers   = fieldNumbers((&meterv1.GpuSample{}).ProtoReflect().Descriptor())
)
