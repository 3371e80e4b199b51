package api

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	// Registers the proto codec that batchCodec wraps.
	_ "google.golang.org/grpc/encoding/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// batchOverLimit is the error of a publish request found, while it was
// read, to hold more than max events.
func batchOverLimit(max int) error {
	return fmt.Errorf("%w: batch has more than %d events, the limit is %d; split it", errTooLarge, max, max)
}

// countedPublish is what batchCodec decodes a PublishEvents message into:
// the request, or, when the message holds more than max events, nothing
// but over.
type countedPublish struct {
	req  *meterv1.PublishEventsRequest
	max  int
	over bool
}

// batchCodec is gRPC's proto codec, except for PublishEvents: gRPC decodes
// a message whole before any handler runs, and 16 MB of empty events are
// 8M messages (1.6 GB). batchCodec counts the events on the wire first,
// which allocates nothing, and decodes them only within the batch limit.
// (A codec's own error reaches the client as INTERNAL, so the count is
// handed to the handler, which answers INVALID_ARGUMENT.)
type batchCodec struct{ encoding.CodecV2 }

func newBatchCodec() batchCodec { return batchCodec{encoding.GetCodecV2(protoCodecName)} }

// protoCodecName is the name of gRPC's protobuf codec.
const protoCodecName = "proto"

func (c batchCodec) Unmarshal(data mem.BufferSlice, v any) error {
	cp, ok := v.(*countedPublish)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	if countRepeated(b, 1, cp.max) > cp.max { // PublishEventsRequest.events
		cp.over = true
		return nil
	}
	return proto.Unmarshal(b, cp.req)
}

// countRepeated counts the occurrences of length-delimited field num at the
// top level of message b, stopping once it has counted more than max. A
// message that does not parse stops the count; proto.Unmarshal reports it.
func countRepeated(b []byte, num protowire.Number, max int) int {
	n := 0
	for len(b) > 0 && n <= max {
		f, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return n
		}
		b = b[k:]
		k = protowire.ConsumeFieldValue(f, typ, b)
		if k < 0 {
			return n
		}
		b = b[k:]
		if f == num && typ == protowire.BytesType {
			n++
		}
	}
	return n
}

// registerIngest registers s as the IngestService, its PublishEvents
// decoded through batchCodec (which the server must use): the generated
// handler would decode the message whole.
func registerIngest(r grpc.ServiceRegistrar, s *ingestService) {
	desc := meterv1.IngestService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "PublishEvents" {
			desc.Methods[i].Handler = s.publishHandler
		}
	}
	r.RegisterService(&desc, s)
}

// publishHandler is the generated PublishEvents handler, except that the
// message is decoded as a countedPublish: one over the batch limit reaches
// the interceptors (authentication, error mapping) undecoded, and is
// refused there.
func (s *ingestService) publishHandler(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := &countedPublish{req: &meterv1.PublishEventsRequest{}, max: s.maxEvents}
	if err := dec(in); err != nil {
		return nil, err
	}
	handler := func(ctx context.Context, req any) (any, error) {
		if in.over {
			return nil, batchOverLimit(s.maxEvents)
		}
		return s.PublishEvents(ctx, req.(*meterv1.PublishEventsRequest))
	}
	if interceptor == nil {
		return handler(ctx, in.req)
	}
	info := &grpc.UnaryServerInfo{Server: s, FullMethod: meterv1.IngestService_PublishEvents_FullMethodName}
	return interceptor(ctx, in.req, info, handler)
}
