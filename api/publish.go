package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// publishHandler serves POST /v1/events in place of the generated gateway
// handler, which decodes the whole body as one message: there, one event
// with an unknown field or a wrong type failed the batch with a line:column
// message and no index. Here each event is decoded on its own; one that does
// not decode is rejected with its index and reason, like an event that fails
// validation, and the others go through the gRPC service as usual (same
// authentication, limits and error mapping).
type publishHandler struct {
	mux       *runtime.ServeMux
	client    meterv1.IngestServiceClient
	maxEvents int
}

func (h *publishHandler) serve(w http.ResponseWriter, r *http.Request, _ map[string]string) {
	_, out := runtime.MarshalerForRequest(h.mux, r)
	ctx, err := runtime.AnnotateContext(r.Context(), h.mux, r, meterv1.IngestService_PublishEvents_FullMethodName, runtime.WithHTTPPathPattern("/v1/events"))
	if err != nil {
		runtime.HTTPError(r.Context(), h.mux, out, w, r, err)
		return
	}
	data, err := bodyBytes(r.Body)
	if err != nil {
		runtime.HTTPError(ctx, h.mux, out, w, r, status.Error(codes.InvalidArgument, err.Error()))
		return
	}
	// The events are counted before any is decoded: a body of millions of
	// tiny events ({"events":[{},{},...]}) would otherwise become millions
	// of messages (gigabytes) before the length check.
	if countEvents(data, h.maxEvents) > h.maxEvents {
		runtime.HTTPError(ctx, h.mux, out, w, r, toStatus(ctx, nil, batchOverLimit(h.maxEvents)))
		return
	}
	req, index, failed, err := decodeEvents(data)
	if err != nil {
		runtime.HTTPError(ctx, h.mux, out, w, r, status.Error(codes.InvalidArgument, err.Error()))
		return
	}
	if n := len(req.Events) + len(failed); n > h.maxEvents {
		runtime.HTTPError(ctx, h.mux, out, w, r, toStatus(ctx, nil, batchTooLong(n, h.maxEvents)))
		return
	}
	var md runtime.ServerMetadata
	resp := &meterv1.PublishEventsResponse{}
	if len(req.Events) > 0 {
		resp, err = h.client.PublishEvents(ctx, req, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
		ctx = runtime.NewServerMetadataContext(ctx, md)
		if err != nil {
			runtime.HTTPError(ctx, h.mux, out, w, r, err)
			return
		}
		if index != nil {
			for _, rej := range resp.Rejected {
				rej.Index = int32(index[rej.Index])
			}
		}
	}
	resp.Rejected = append(resp.Rejected, failed...)
	sort.SliceStable(resp.Rejected, func(i, j int) bool { return resp.Rejected[i].Index < resp.Rejected[j].Index })
	runtime.ForwardResponseMessage(ctx, h.mux, out, w, r, resp, h.mux.GetForwardResponseOptions()...)
}

// bodyBytes is the whole request body.
func bodyBytes(body io.Reader) ([]byte, error) {
	if rb, ok := body.(*guardedBody); ok {
		return rb.data, nil // read whole by the guard already
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, fmt.Errorf("read request body: %w", err)
	}
	return data, nil
}

// countEvents counts the elements of the arrays directly under the top-level
// object of a {"events": [...]} body, and stops once it has counted more
// than max. It reads only the structure (brackets, commas, strings) and
// allocates nothing; whether the JSON is valid is decodeEvents' concern.
func countEvents(data []byte, max int) int {
	n, depth := 0, 0
	rootObject, inEvents, expect := false, false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case ',':
			expect = inEvents && depth == 2
			continue
		case '}', ']':
			depth--
			if depth < 2 {
				inEvents = false
			}
			continue
		}
		if inEvents && depth == 2 && expect {
			// The first byte of an element.
			if n++; n > max {
				return n
			}
			expect = false
		}
		switch c {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			if depth == 0 && c == '{' {
				rootObject = true
			}
			depth++
			if c == '[' && depth == 2 && rootObject {
				inEvents, expect = true, true
			}
		}
	}
	return n
}

// decodeEvents decodes a body into a request. A body that decodes whole is
// the common case and is decoded once; otherwise each event is decoded on
// its own: those that do not decode are returned as rejections, and index
// maps the request's events to their batch positions (nil when they are
// the same). err is a body whose envelope is not {"events": [...]}.
func decodeEvents(data []byte) (req *meterv1.PublishEventsRequest, index []int, failed []*meterv1.RejectedEvent, err error) {
	req = &meterv1.PublishEventsRequest{}
	if protojson.Unmarshal(data, req) == nil {
		return req, nil, nil, nil
	}
	raw, err := splitEvents(bytes.NewReader(data))
	if err != nil {
		return nil, nil, nil, err
	}
	req = &meterv1.PublishEventsRequest{Events: make([]*meterv1.InferenceEvent, 0, len(raw))}
	index = []int{}
	for i, b := range raw {
		ev := &meterv1.InferenceEvent{}
		if err := protojson.Unmarshal(b, ev); err != nil {
			failed = append(failed, &meterv1.RejectedEvent{
				Index: int32(i), EventId: eventIDOf(b), Reason: fmt.Sprintf("malformed JSON event: %v", err),
			})
			continue
		}
		req.Events = append(req.Events, ev)
		index = append(index, i)
	}
	return req, index, failed, nil
}

// splitEvents reads a {"events": [...]} body and returns each event's JSON
// text, undecoded. The envelope itself must be well formed: one object with
// at most one "events" key holding an array (or null), nothing else.
func splitEvents(body io.Reader) ([]json.RawMessage, error) {
	dec := json.NewDecoder(body)
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	var events []json.RawMessage
	seen := false
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("request body: %w", err)
		}
		key, _ := t.(string)
		if key != "events" {
			return nil, fmt.Errorf("request body: unknown field %q: want {\"events\": [...]}", key)
		}
		if seen {
			return nil, errors.New(`request body: duplicate field "events"`)
		}
		seen = true
		if events, err = readEventArray(dec); err != nil {
			return nil, fmt.Errorf("request body: events: %w", err)
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("request body: data after the JSON object")
	}
	return events, nil
}

// readEventArray reads an array (or null) of raw JSON values.
func readEventArray(dec *json.Decoder) ([]json.RawMessage, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if t == nil {
		return nil, nil
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("want an array, got %v", t)
	}
	var out []json.RawMessage
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("event %d: %w", len(out), err)
		}
		out = append(out, raw)
	}
	_, err = dec.Token() // ']'
	return out, err
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, got %v", want, t)
	}
	return nil
}

// eventIDOf returns the event_id (or eventId) of an event that did not
// decode, when it can be read, so that the rejection names the event.
func eventIDOf(raw json.RawMessage) string {
	var ids struct {
		Proto string `json:"event_id"`
		JSON  string `json:"eventId"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if dec.Decode(&ids) != nil {
		return ""
	}
	if ids.Proto != "" {
		return ids.Proto
	}
	return ids.JSON
}
