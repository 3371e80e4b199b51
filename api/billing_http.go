package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// The REST routes of the billing exports (api.yaml).
const (
	statementsExportPath = "/v1/billing/statements/{period}/export"
	usageCostExportPath  = "/v1/billing/usage-cost/export"
)

// exportRowsTrailer is the trailer of a complete export response: the
// number of rows of the file (statement lines, or usage-and-cost rows).
const exportRowsTrailer = "X-Export-Rows"

// exportHandler serves the billing exports over REST in place of the
// generated gateway handlers, which write each message of a stream as a
// JSON object (or, for google.api.HttpBody, the data followed by a newline)
// and put an error met midway into the body as one more object: a file cut
// short would look whole. Here the response is the file itself: the
// format's Content-Type, a Content-Disposition file name, the statement's
// hash in X-Statement-Hash when one tenant's statement is exported, the
// chunks written as they come from the gRPC stream, and the number of rows
// in the trailer X-Export-Rows once the file is complete (through the in-process
// connection, so authentication, roles and error mapping are the gRPC
// service's).
//
// An error before the first chunk is an ordinary error response (400, 404,
// 409). An error after it aborts the response (http.ErrAbortHandler): the
// connection is closed without the final empty chunk (HTTP/1.1) or the
// stream is reset (HTTP/2), so every client sees a broken transfer (curl
// exits 18, Go's client reads io.ErrUnexpectedEOF), never a short file that
// ends cleanly.
type exportHandler struct {
	mux          *runtime.ServeMux
	client       meterv1.BillingServiceClient
	writeTimeout time.Duration
	logger       *slog.Logger
}

func (h *exportHandler) register(gw *runtime.ServeMux) error {
	if err := gw.HandlePath(http.MethodGet, statementsExportPath, h.statements); err != nil {
		return fmt.Errorf("register statements export: %w", err)
	}
	if err := gw.HandlePath(http.MethodGet, usageCostExportPath, h.usageCost); err != nil {
		return fmt.Errorf("register usage-and-cost export: %w", err)
	}
	return nil
}

func (h *exportHandler) statements(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	serveExport(h, w, r, meterv1.BillingService_ExportStatements_FullMethodName, statementsExportPath,
		func(ctx context.Context) (exportStream, error) {
			req := &meterv1.ExportStatementsRequest{Period: pathParams["period"]}
			if err := populate(req, r, utilities.NewDoubleArray([][]string{{"period"}})); err != nil {
				return exportStream{}, err
			}
			stream, err := h.client.ExportStatements(ctx, req)
			return recvOf(stream), err
		})
}

func (h *exportHandler) usageCost(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	serveExport(h, w, r, meterv1.BillingService_ExportUsageCost_FullMethodName, usageCostExportPath,
		func(ctx context.Context) (exportStream, error) {
			req := &meterv1.ExportUsageCostRequest{}
			if err := populate(req, r, utilities.NewDoubleArray(nil)); err != nil {
				return exportStream{}, err
			}
			stream, err := h.client.ExportUsageCost(ctx, req)
			return recvOf(stream), err
		})
}

// populate fills req from the query string (the guard has checked it and
// written every parameter in its proto spelling), leaving out the fields of
// filter (the path's).
func populate(req proto.Message, r *http.Request, filter *utilities.DoubleArray) error {
	if err := runtime.PopulateQueryParameters(req, r.URL.Query(), filter); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// exportStream is what serveExport reads of an export stream: its chunks
// and its header metadata.
type exportStream struct {
	recv   func() (exportChunk, error)
	header func() (metadata.MD, error)
}

// exportChunk is what both export streams send.
type exportChunk interface {
	GetData() []byte
	GetContentType() string
	GetFileName() string
	GetRows() int64
}

// recvOf is the reading side of an export stream; a nil stream (an error
// opening it) reads nothing.
func recvOf[M any, P interface {
	*M
	exportChunk
}](stream grpc.ServerStreamingClient[M]) exportStream {
	if stream == nil {
		return exportStream{}
	}
	return exportStream{
		recv: func() (exportChunk, error) {
			m, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			return P(m), nil
		},
		header: stream.Header,
	}
}

// focusHeaders are the FOCUS metadata headers an export stream may send,
// and their HTTP names.
var focusHeaders = [][2]string{
	{"x-focus-version", "X-Focus-Version"},
	{"x-focus-schema-id", "X-Focus-Schema-Id"},
	{"x-focus-data-generator", "X-Focus-Data-Generator"},
}

// serveExport answers one export request from the gRPC stream open opens.
func serveExport(h *exportHandler, w http.ResponseWriter, r *http.Request, method, pattern string,
	open func(ctx context.Context) (exportStream, error)) {
	_, out := runtime.MarshalerForRequest(h.mux, r)
	ctx, err := runtime.AnnotateContext(r.Context(), h.mux, r, method, runtime.WithHTTPPathPattern(pattern))
	if err != nil {
		runtime.HTTPError(r.Context(), h.mux, out, w, r, err)
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream when the client goes away
	stream, err := open(ctx)
	recv := stream.recv
	var first exportChunk
	if err == nil {
		first, err = recv()
		if errors.Is(err, io.EOF) {
			err = errors.New("export stream ended before its first chunk")
		}
	}
	if err != nil {
		runtime.HTTPError(ctx, h.mux, out, w, r, err)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", first.GetContentType())
	hdr.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": first.GetFileName()}))
	hdr.Set("X-Content-Type-Options", "nosniff")
	if md, err := stream.header(); err == nil {
		for _, h := range focusHeaders {
			if v := md.Get(h[0]); len(v) == 1 {
				hdr.Set(h[1], v[0])
			}
		}
	}
	if hs, ok := first.(interface{ GetStatementHash() string }); ok && hs.GetStatementHash() != "" {
		hdr.Set("X-Statement-Hash", hs.GetStatementHash())
	}
	hdr.Set("Trailer", exportRowsTrailer)
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	for msg := first; ; {
		// The server's write timeout bounds a whole response; an export
		// may take longer, so it bounds each chunk instead (a client that
		// stops reading is still cut off).
		_ = rc.SetWriteDeadline(time.Now().Add(h.writeTimeout))
		if _, err := w.Write(msg.GetData()); err != nil {
			return // the client is gone; cancel ends the stream
		}
		if err := rc.Flush(); err != nil {
			return
		}
		rows := msg.GetRows()
		msg, err = recv()
		if errors.Is(err, io.EOF) {
			hdr.Set(exportRowsTrailer, strconv.FormatInt(rows, 10))
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				h.logger.WarnContext(ctx, "export failed midway; response aborted", "method", method, "path", r.URL.Path,
					"code", status.Code(err).String(), "error", err)
			}
			panic(http.ErrAbortHandler)
		}
	}
}
