package otlp

import (
	"context"
	"errors"
	"net/http"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// traceService is OTLP/gRPC's TraceService.
type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

// Export authorizes the call by its "authorization" metadata, converts and
// publishes the spans. The answer follows the OTLP specification: success,
// possibly partial (rejected spans with the reasons); Unauthenticated or
// PermissionDenied; Unavailable, which exporters retry, when the event log
// did not take the events. (A message that does not decode is refused by
// gRPC itself, before this method, with Internal.)
func (s *traceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	var authz string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			authz = v[0]
		}
	}
	keyTenant, err := s.r.auth.AuthorizePublish(authz)
	if err == nil {
		var resp *coltracepb.ExportTraceServiceResponse
		if resp, err = s.r.export(ctx, req, keyTenant); err == nil {
			s.r.metrics.exports.WithLabelValues("grpc", answerOK).Inc()
			return resp, nil
		}
	}
	return nil, s.r.grpcError(ctx, err)
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
	case errors.Is(err, errBadRequest):
		return answerBadRequest, codes.InvalidArgument, http.StatusBadRequest, msg
	case errors.Is(err, errTooLarge):
		return answerTooLarge, codes.ResourceExhausted, http.StatusRequestEntityTooLarge, msg
	case errors.Is(err, errUnsupported):
		return answerUnsupported, codes.InvalidArgument, http.StatusUnsupportedMediaType, msg
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
