package otlp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// traceService is OTLP/gRPC's TraceService, registered by hand (see
// register) so that its request reaches ConvertWire undecoded, as on
// OTLP/HTTP: the generated service would have proto.Unmarshal decode it.
type traceService struct {
	r *Receiver
}

// rawExport is an ExportTraceServiceRequest still in its wire encoding,
// in a buffer of the receiver's pool.
type rawExport struct{ buf *bytes.Buffer }

// wireCodec is the gRPC proto codec, except that it copies an
// ExportTraceServiceRequest into a rawExport instead of decoding it.
type wireCodec struct {
	encoding.CodecV2
	r *Receiver
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	raw, ok := v.(*rawExport)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	raw.buf = c.r.bodies.Get().(*bytes.Buffer)
	raw.buf.Grow(data.Len())
	for _, b := range data {
		raw.buf.Write(b.ReadOnlyData())
	}
	return nil
}

// register adds the TraceService to s, with the service and method names
// of the generated code (so that exporters find it) and a handler that
// takes the request as a rawExport.
func (t *traceService) register(s *grpc.Server) {
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: coltracepb.TraceService_ServiceDesc.ServiceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Export",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var raw rawExport
				if err := dec(&raw); err != nil {
					return nil, err
				}
				return t.export(ctx, raw)
			},
		}},
		Metadata: coltracepb.TraceService_ServiceDesc.Metadata,
	}, t)
}

// export authorizes the call by its "authorization" metadata, converts and
// publishes the spans. The answer follows the OTLP specification: success,
// possibly partial (rejected spans with the reasons); InvalidArgument for a
// message that does not decode; Unauthenticated or PermissionDenied;
// ResourceExhausted (from gRPC) for a message over the limit; Unavailable,
// which exporters retry, when the event log did not take the events.
func (t *traceService) export(ctx context.Context, raw rawExport) (*coltracepb.ExportTraceServiceResponse, error) {
	var authz string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = v[0]
		}
	}
	keyTenant, err := t.r.auth.AuthorizePublish(authz)
	var b Batch
	if err == nil {
		b, err = t.r.cfg.Mapping.convertWire(raw.buf.Bytes(), keyTenant, t.r.cfg.MaxSpans)
		if err != nil && !errors.Is(err, errTooManySpans) {
			err = fmt.Errorf("%w: the message is not an OTLP ExportTraceServiceRequest: %v", errBadRequest, err)
		}
	}
	t.r.putBody(raw.buf)
	var resp *coltracepb.ExportTraceServiceResponse
	if err == nil {
		resp, err = t.r.publish(ctx, b)
	}
	if err != nil {
		return nil, t.r.grpcError(ctx, err)
	}
	t.r.metrics.exports.WithLabelValues("grpc", answerOK).Inc()
	return resp, nil
}

// authTap refuses an export whose key may not publish before its message
// is read, so that an unauthorized client costs no decoding.
func (r *Receiver) authTap(ctx context.Context, info *tap.Info) (context.Context, error) {
	var authz string
	if v := info.Header.Get("authorization"); len(v) > 0 {
		authz = v[0]
	}
	if _, err := r.auth.AuthorizePublish(authz); err != nil {
		return nil, r.grpcError(ctx, err)
	}
	return ctx, nil
}

// Answers: the "answer" label of meter_otlp_exports_total.
const (
	answerOK               = "ok"
	answerBadRequest       = "bad_request"
	answerUnauthenticated  = "unauthenticated"
	answerPermissionDenied = "permission_denied"
	answerTooLarge         = "too_large"
	answerUnsupported      = "unsupported"
	answerBusy             = "busy"
	answerUnavailable      = "unavailable"
	answerInternal         = "internal"
)

// Request errors of OTLP/HTTP.
var (
	errBadRequest  = errors.New("bad request")
	errTooLarge    = errors.New("request too large")
	errUnsupported = errors.New("unsupported media type")
)

// answer is the one place that maps an export's error to the OTLP answer:
// the metric label, the gRPC code, the HTTP status and the message. Errors
// of our own are written for clients; anything else is logged and answered
// with a generic message.
func (r *Receiver) answer(ctx context.Context, err error) (label string, code codes.Code, httpStatus int, msg string) {
	msg = err.Error()
	switch {
	case errors.Is(err, ErrUnauthenticated):
		return answerUnauthenticated, codes.Unauthenticated, http.StatusUnauthorized, msg
	case errors.Is(err, ErrPermissionDenied):
		return answerPermissionDenied, codes.PermissionDenied, http.StatusForbidden, msg
	case errors.Is(err, errTooManySpans):
		// Bad data to OTLP: the same request would be refused again.
		return answerTooLarge, codes.InvalidArgument, http.StatusBadRequest, msg
	case errors.Is(err, errBadRequest):
		return answerBadRequest, codes.InvalidArgument, http.StatusBadRequest, msg
	case errors.Is(err, errTooLarge):
		return answerTooLarge, codes.ResourceExhausted, http.StatusRequestEntityTooLarge, msg
	case errors.Is(err, errUnsupported):
		return answerUnsupported, codes.InvalidArgument, http.StatusUnsupportedMediaType, msg
	case errors.Is(err, errBusy):
		return answerBusy, codes.Unavailable, http.StatusServiceUnavailable, msg
	case errors.Is(err, errUnavailable):
		return answerUnavailable, codes.Unavailable, http.StatusServiceUnavailable, msg
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The exporter gave up; it retries if it still wants to.
		return answerUnavailable, codes.Unavailable, http.StatusServiceUnavailable, "request cancelled or past its deadline"
	}
	r.logger.ErrorContext(ctx, "OTLP export failed", "error", err)
	return answerInternal, codes.Internal, http.StatusInternalServerError, "internal error"
}

func (r *Receiver) grpcError(ctx context.Context, err error) error {
	label, code, _, msg := r.answer(ctx, err)
	r.metrics.exports.WithLabelValues("grpc", label).Inc()
	return status.Error(code, msg)
}
