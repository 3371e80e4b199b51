package otlp

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"

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
// body that does not decode or holds more than Config.MaxSpans spans; 401
// or 403; 405 for another method; 413 for a body over the limit
// (compressed or not); 415 for another content type or encoding; 503,
// which exporters retry, when the event log did not take the events or
// when the bodies in progress hold Config.MaxBufferedBytes.
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
	// The body is read first, with no slot held: a client that sends
	// slowly delays only itself. Its bytes count against MaxBufferedBytes
	// as they arrive.
	body, err := r.readBody(w, req)
	defer r.release(&body)
	if err != nil {
		r.httpError(w, req, ct, err)
		return
	}
	// A slot for the conversion only: CPU work, a few milliseconds per
	// megabyte.
	select {
	case r.slots <- struct{}{}:
	case <-req.Context().Done():
		r.httpError(w, req, ct, req.Context().Err())
		return
	}
	var b Batch
	if ct == contentTypeProtobuf {
		b, err = r.cfg.Mapping.convertWire(body.data, keyTenant, r.cfg.MaxSpans)
	} else {
		b, err = r.cfg.Mapping.convertJSON(body.data, keyTenant, r.cfg.MaxSpans)
	}
	<-r.slots
	r.buffers.put(body.data) // the batch keeps nothing of it
	body.data = nil
	if err != nil && !errors.Is(err, errTooManySpans) {
		err = fmt.Errorf("%w: body is not an OTLP ExportTraceServiceRequest (%s): %v", errBadRequest, ct, err)
	}
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

// Sizes of a body's buffer: the first, and the steps it grows by at most.
// It doubles from the first up to maxPooledBody, through buffers pooled by
// size (bodyBuffers); past that it grows by maxBodyGrowth, unpooled.
const (
	firstBodyBuffer = 16 << 10
	maxBodyGrowth   = 4 << 20
)

// maxPooledStep bounds the buffers given back to the pool while a body
// grows past them: the larger ones of a burst of large bodies are left to
// the collector, which frees them sooner than the pool would.
const maxPooledStep = 1 << 20

// bodyClasses is the number of pooled buffer sizes, firstBodyBuffer to
// maxPooledBody.
const bodyClasses = 9 // 16 KiB << 8 = 4 MiB

// bodyBuffers pools OTLP/HTTP body buffers by size: class i holds buffers
// of firstBodyBuffer << i bytes.
type bodyBuffers [bodyClasses]sync.Pool

// class is the pool of buffers of size bytes, -1 for none.
func (p *bodyBuffers) class(size int64) int {
	for i := range bodyClasses {
		if size == firstBodyBuffer<<i {
			return i
		}
	}
	return -1
}

// get returns an empty buffer of size bytes.
func (p *bodyBuffers) get(size int64) []byte {
	if i := p.class(size); i >= 0 {
		if b, ok := p[i].Get().(*[]byte); ok {
			return (*b)[:0]
		}
	}
	return make([]byte, 0, size)
}

// put gives a buffer of get back.
func (p *bodyBuffers) put(b []byte) {
	if i := p.class(int64(cap(b))); i >= 0 {
		b = b[:0]
		p[i].Put(&b)
	}
}

// requestBody is a request body read whole; held is what it reserved of
// Receiver.buffered, to give back once the export is answered.
type requestBody struct {
	data []byte
	held int64
}

// readBody reads the whole body, gunzipped when its Content-Encoding is
// gzip; the limit holds for the body as sent and as decompressed. The
// buffer grows as bytes arrive (doubling through pooled sizes up to 4 MiB,
// then by 4 MiB, never past a declared Content-Length), each growth
// reserved from r.buffered first:
// when that is spent the export is answered 503 (errBusy) rather than
// waiting, so that buffers partly filled never wait on each other.
func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request) (requestBody, error) {
	var body requestBody
	limit := int64(r.cfg.MaxRequestBytes)
	if req.ContentLength > limit {
		return body, fmt.Errorf("%w: the body is %d bytes, the limit is %d", errTooLarge, req.ContentLength, limit)
	}
	var src io.Reader = http.MaxBytesReader(w, req.Body, limit)
	// Past the limit (+1, to tell a body of exactly the limit from a
	// longer one) nothing is read.
	ceiling := limit + 1
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		if n := req.ContentLength; n >= 0 && n < limit {
			ceiling = n + 1 // +1: room to read the end of the body
		}
	case "gzip":
		zr, _ := r.gunzips.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(src)
		} else {
			err = zr.Reset(src)
		}
		if err != nil {
			return body, readError(err, "gzip body")
		}
		defer r.gunzips.Put(zr)
		src = zr
	default:
		return body, fmt.Errorf("%w: Content-Encoding %q: want gzip or none", errUnsupported, enc)
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= ceiling {
				r.buffers.put(buf)
				return body, fmt.Errorf("%w: the decompressed body exceeds %d bytes", errTooLarge, limit)
			}
			size := max(2*int64(cap(buf)), firstBodyBuffer)
			if size > maxPooledBody {
				size = min(int64(cap(buf))+maxBodyGrowth, ceiling)
			} else if size > limit+1 {
				size = limit + 1
			}
			if !r.buffered.TryAcquire(size - body.held) {
				r.buffers.put(buf)
				return body, errBusy
			}
			r.metrics.buffered.Add(float64(size - body.held))
			body.held = size
			grown := append(r.buffers.get(size), buf...)
			if cap(buf) <= maxPooledStep {
				r.buffers.put(buf)
			}
			buf = grown
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			r.buffers.put(buf)
			return body, readError(err, "body")
		}
	}
	if int64(len(buf)) > limit {
		r.buffers.put(buf)
		return body, fmt.Errorf("%w: the decompressed body exceeds %d bytes", errTooLarge, limit)
	}
	body.data = buf
	return body, nil
}

// release gives back what body reserved of r.buffered.
func (r *Receiver) release(body *requestBody) {
	r.buffered.Release(body.held)
	r.metrics.buffered.Sub(float64(body.held))
	body.held = 0
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
