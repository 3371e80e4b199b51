package api

import (
	"io"
	"log/slog"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"tokenmeter/billing/invoicehtml"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// invoicePath is the REST route of an invoice (api.yaml).
const invoicePath = "/v1/billing/statements/{period}/invoice"

// invoiceHandler serves GET /v1/billing/statements/{period}/invoice in
// place of the generated gateway handler: the printable HTML invoice
// (billing/invoicehtml, which meterctl uses too) unless format=json, which
// answers the gateway's JSON. The invoice comes from the gRPC service
// through the in-process connection, so authentication, roles and error
// mapping are the service's, and errors keep the gateway's JSON form.
type invoiceHandler struct {
	mux    *runtime.ServeMux
	client meterv1.InvoiceServiceClient
	logger *slog.Logger
}

func (h *invoiceHandler) register(gw *runtime.ServeMux) error {
	return gw.HandlePath(http.MethodGet, invoicePath, h.invoice)
}

func (h *invoiceHandler) invoice(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
	req := &meterv1.GetInvoiceRequest{Period: pathParams["period"]}
	ctx, out, ok := gatewayRequest(h.mux, w, r, meterv1.InvoiceService_GetInvoice_FullMethodName, invoicePath, req, [][]string{{"period"}})
	if !ok {
		return
	}
	html := req.GetFormat() == "" || req.GetFormat() == "html"
	if !html && req.GetFormat() != "json" {
		runtime.HTTPError(ctx, h.mux, out, w, r, status.Errorf(codes.InvalidArgument, "format %q: want html or json", req.GetFormat()))
		return
	}
	var md runtime.ServerMetadata
	resp, err := h.client.GetInvoice(ctx, req, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
	ctx = runtime.NewServerMetadataContext(ctx, md)
	if err != nil {
		runtime.HTTPError(ctx, h.mux, out, w, r, err)
		return
	}
	if !html {
		runtime.ForwardResponseMessage(ctx, h.mux, out, w, r, resp, h.mux.GetForwardResponseOptions()...)
		return
	}
	serveRendered(ctx, h.mux, out, w, r, h.logger, renderedFile{
		contentType: "text/html; charset=utf-8",
		disposition: "inline",
		name:        invoicehtml.FileName(resp.GetInvoice()),
		policy:      invoicehtml.Policy,
		render:      func(w io.Writer) error { return invoicehtml.HTML(w, resp.GetInvoice()) },
	}, "render invoice")
}
