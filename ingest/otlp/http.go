package otlp

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// TracesPath is OTLP/HTTP's path for traces.
const TracesPath = "/v1/traces"

// Content types of OTLP/HTTP.
const (
	contentTypeProtobuf = "application/x-protobuf"
	contentTypeJSON     = "application/json"
)

// HTTPHandler serves POST /v1/traces (OTLP/HTTP): an
// ExportTraceServiceRequest in protobuf (application/x-protobuf) or OTLP
// JSON (application/json), gzip-compressed or not, authorized by its
// "Authorization: Bearer <key>" header. It answers in the request's content
// type, per the OTLP specification: 200 with the response (its
// partial_success lists rejected spans); 400 with a google.rpc.Status for a
// body that does not decode; 401 or 403; 405 for another method; 413 for a
// body over the limit (compressed or not); 415 for another content type or
// encoding; 503, which exporters retry, when the event log did not take the
// events.
func (r *Receiver) HTTPHandler() http.Handler { return http.HandlerFunc(r.serveHTTP) }

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		r.metrics.exports.WithLabelValues("http", answerUnsupported).Inc()
		http.Error(w, "OTLP/HTTP exports are POSTed", http.StatusMethodNotAllowed)
		return
	}
	ct := mediaType(req.Header.Get("Content-Type"))
	keyTenant, err := r.auth.AuthorizePublish(req.Header.Get("Authorization"))
	if err != nil {
		r.httpError(w, req, ct, err)
		return
	}
	if ct != contentTypeProtobuf && ct != contentTypeJSON {
		r.httpError(w, req, ct, fmt.Errorf("%w: Content-Type %q: want %s or %s", errUnsupported, req.Header.Get("Content-Type"), contentTypeProtobuf, contentTypeJSON))
		return
	}
	// A slot before the body is read: exports beyond MaxInFlight wait
	// (their clients' timeouts bound the wait) rather than all holding
	// their bodies in memory at once.
	select {
	case r.slots <- struct{}{}:
	case <-req.Context().Done():
		return
	}
	buf := r.bodies.Get().(*bytes.Buffer)
	var b Batch
	err = r.readBody(w, req, buf)
	if err == nil {
		if ct == contentTypeProtobuf {
			b, err = r.cfg.Mapping.ConvertWire(buf.Bytes(), keyTenant)
		} else {
			var ereq coltracepb.ExportTraceServiceRequest
			if err = unmarshalJSON(buf.Bytes(), &ereq); err == nil {
				b = r.cfg.Mapping.Convert(&ereq, keyTenant)
			}
		}
		if err != nil {
			err = fmt.Errorf("%w: body is not an OTLP ExportTraceServiceRequest (%s): %v", errBadRequest, ct, err)
		}
	}
	// The batch keeps nothing of the body: its buffer can serve again.
	r.putBody(buf)
	<-r.slots
	if err != nil {
		r.httpError(w, req, ct, err)
		return
	}
	resp, err := r.publish(req.Context(), b)
	if err != nil {
		r.httpError(w, req, ct, err)
		return
	}
	r.metrics.exports.WithLabelValues("http", answerOK).Inc()
	writeMessage(w, ct, http.StatusOK, resp)
}

// maxPooledBody bounds the buffers kept for reuse: an unusually large
// body's buffer is left to the collector.
const maxPooledBody = 4 << 20

// readBody reads the whole body into buf, gunzipped when its
// Content-Encoding is gzip. The limit holds for the body as sent and as
// decompressed.
func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request, buf *bytes.Buffer) error {
	limit := int64(r.cfg.MaxRequestBytes)
	var src io.Reader = http.MaxBytesReader(w, req.Body, limit)
	gzipped := false
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		gzipped = true
		zr, _ := r.gunzips.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(src)
		} else {
			err = zr.Reset(src)
		}
		if err != nil {
			return readError(err, "gzip body")
		}
		defer r.gunzips.Put(zr)
		src = zr
	default:
		return fmt.Errorf("%w: Content-Encoding %q: want gzip or none", errUnsupported, enc)
	}
	if n := req.ContentLength; !gzipped && n > 0 && n <= limit {
		buf.Grow(int(n) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(io.LimitReader(src, limit+1)); err != nil {
		return readError(err, "body")
	}
	if int64(buf.Len()) > limit {
		return fmt.Errorf("%w: the decompressed body exceeds %d bytes", errTooLarge, limit)
	}
	return nil
}

func readError(err error, what string) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return fmt.Errorf("%w: the body exceeds %d bytes", errTooLarge, tooLarge.Limit)
	}
	return fmt.Errorf("%w: read %s: %v", errBadRequest, what, err)
}

// httpError answers err with its status and a google.rpc.Status in the
// request's content type (plain text when that is neither of OTLP's).
func (r *Receiver) httpError(w http.ResponseWriter, req *http.Request, ct string, err error) {
	label, code, httpStatus, msg := r.answer(req.Context(), err)
	r.metrics.exports.WithLabelValues("http", label).Inc()
	if httpStatus == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	}
	if ct != contentTypeProtobuf && ct != contentTypeJSON {
		http.Error(w, msg, httpStatus)
		return
	}
	writeMessage(w, ct, httpStatus, status.New(code, msg).Proto())
}

// retryAfterSeconds is the Retry-After of a 503.
const retryAfterSeconds = 1

func writeMessage(w http.ResponseWriter, ct string, httpStatus int, m proto.Message) {
	var data []byte
	var err error
	if ct == contentTypeJSON {
		data, err = protojson.Marshal(m)
	} else {
		data, err = proto.Marshal(m)
	}
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(httpStatus)
	w.Write(data) //nolint:errcheck // the client went away: nothing to do
}

// mediaType is the lowercase media type of a Content-Type header, without
// parameters; "" when it does not parse.
func mediaType(header string) string {
	t, _, err := mime.ParseMediaType(header)
	if err != nil {
		return ""
	}
	return t
}
