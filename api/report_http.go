package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
	"tokenmeter/query/capacity/render"
)

// capacityReportPath is the REST route of the capacity report (api.yaml).
const capacityReportPath = "/v1/reports/capacity"

// reportFormats are the files GET /v1/reports/capacity answers besides
// the JSON: their Content-Type, file extension and renderer.
var reportFormats = map[string]struct {
	contentType, ext string
	render           func(io.Writer, *meterv1.CapacityReport) error
}{
	"csv":  {"text/csv; charset=utf-8", "csv", render.CSV},
	"html": {"text/html; charset=utf-8", "html", render.HTML},
}

// reportHTMLPolicy is the Content-Security-Policy of the HTML report: it
// needs nothing but its inline style (the file carries the same policy in
// a meta tag, for when it is opened from disk).
const reportHTMLPolicy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"

// reportHandler serves GET /v1/reports/capacity in place of the generated
// gateway handler: format=csv and format=html answer the report as a file
// (the format's Content-Type and a Content-Disposition file name, rendered
// by query/capacity/render, which meterctl uses too); format=json or none
// answers the gateway's JSON, as the generated handler does. The report
// comes from the gRPC service through the in-process connection, so that
// authentication, roles, validation and error mapping are the service's,
// and errors keep the gateway's JSON form and codes.
type reportHandler struct {
	mux    *runtime.ServeMux
	client meterv1.ReportServiceClient
	logger *slog.Logger
}

func (h *reportHandler) register(gw *runtime.ServeMux) error {
	return gw.HandlePath(http.MethodGet, capacityReportPath, h.capacity)
}

func (h *reportHandler) capacity(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	req := &meterv1.GetCapacityReportRequest{}
	ctx, out, ok := gatewayRequest(h.mux, w, r, meterv1.ReportService_GetCapacityReport_FullMethodName, capacityReportPath, req, nil)
	if !ok {
		return
	}
	format := req.GetFormat()
	file, isFile := reportFormats[format]
	if !isFile && format != "" && format != "json" {
		runtime.HTTPError(ctx, h.mux, out, w, r, status.Errorf(codes.InvalidArgument, "format %q: want json, csv or html", format))
		return
	}
	if isFile {
		req.Format = "" // the service answers the report; the file is rendered here
	}
	var md runtime.ServerMetadata
	resp, err := h.client.GetCapacityReport(ctx, req, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
	ctx = runtime.NewServerMetadataContext(ctx, md)
	if err != nil {
		runtime.HTTPError(ctx, h.mux, out, w, r, err)
		return
	}
	if !isFile {
		runtime.ForwardResponseMessage(ctx, h.mux, out, w, r, resp, h.mux.GetForwardResponseOptions()...)
		return
	}
	policy := ""
	if format == "html" {
		policy = reportHTMLPolicy
	}
	serveRendered(ctx, h.mux, out, w, r, h.logger, renderedFile{
		contentType: file.contentType,
		disposition: "attachment",
		name:        render.FileName(resp.GetReport(), file.ext),
		policy:      policy,
		render:      func(w io.Writer) error { return file.render(w, resp.GetReport()) },
	}, "render capacity report", "format", format)
}

// gatewayRequest begins a handler that stands in for a generated gateway
// handler: the context annotated as the gateway does for method and the
// route pattern, and req filled from the query string, leaving out the
// path parameters named in pathParams. On an error it has answered it in
// the gateway's JSON form and ok is false.
func gatewayRequest(mux *runtime.ServeMux, w http.ResponseWriter, r *http.Request, method, pattern string,
	req proto.Message, pathParams [][]string,
) (ctx context.Context, out runtime.Marshaler, ok bool) {
	_, out = runtime.MarshalerForRequest(mux, r)
	ctx, err := runtime.AnnotateContext(r.Context(), mux, r, method, runtime.WithHTTPPathPattern(pattern))
	if err != nil {
		runtime.HTTPError(r.Context(), mux, out, w, r, err)
		return nil, nil, false
	}
	if err := populate(req, r, utilities.NewDoubleArray(pathParams)); err != nil {
		runtime.HTTPError(ctx, mux, out, w, r, err)
		return nil, nil, false
	}
	return ctx, out, true
}

// renderedFile is a self-contained file answered by rendering it straight
// into the response.
type renderedFile struct {
	contentType string
	disposition string // "inline" or "attachment"
	name        string // the Content-Disposition file name
	policy      string // the Content-Security-Policy, if any
	render      func(io.Writer) error
}

// serveRendered answers f. The file is written as it is rendered (the
// renderers write one unit at a time), never held whole: no
// Content-Length. A render error before the first byte is an Internal
// error answer in the gateway's form; after it, it can no longer be an
// error answer: the connection is cut, so that the client sees a failed
// download, not a short file. A client gone away is no error of ours and
// is not logged; other render errors are logged as msg with args.
func serveRendered(ctx context.Context, mux *runtime.ServeMux, out runtime.Marshaler, w http.ResponseWriter, r *http.Request,
	logger *slog.Logger, f renderedFile, msg string, args ...any,
) {
	hdr := w.Header()
	hdr.Set("Content-Type", f.contentType)
	hdr.Set("Content-Disposition", mime.FormatMediaType(f.disposition, map[string]string{"filename": f.name}))
	hdr.Set("X-Content-Type-Options", "nosniff")
	if f.policy != "" {
		hdr.Set("Content-Security-Policy", f.policy)
	}
	sw := &startedWriter{w: w}
	if err := f.render(sw); err != nil {
		if errors.Is(err, errClientWrite) {
			return
		}
		logger.ErrorContext(ctx, msg, append(args, "error", err)...)
		if !sw.started {
			runtime.HTTPError(ctx, mux, out, w, r, status.Error(codes.Internal, "internal error"))
			return
		}
		panic(http.ErrAbortHandler)
	}
}

// errClientWrite marks a write to the client that failed.
var errClientWrite = errors.New("write to the client")

// startedWriter writes to an http.ResponseWriter, remembering whether it
// has written (and so sent the 200 and headers).
type startedWriter struct {
	w       http.ResponseWriter
	started bool
}

func (s *startedWriter) Write(p []byte) (int, error) {
	s.started = true
	n, err := s.w.Write(p)
	if err != nil {
		return n, fmt.Errorf("%w: %w", errClientWrite, err)
	}
	return n, nil
}
