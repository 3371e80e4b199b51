package api_test

import (
	"bytes"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"tokenmeter/api"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// allocated is the memory the process allocated while f ran (every
// goroutine's: the server's and the client's).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// maxAllocPerByte bounds what a refused oversized batch may cost: a few
// copies of its body (the transport's, the guard's), not a message per
// event. Decoding a million empty events allocates 100-200 bytes per body
// byte.
const maxAllocPerByte = 16

// A publish request of a million empty events, over the batch limit, is
// refused (400, INVALID_ARGUMENT) from a count of its events on the wire,
// before any is decoded: the memory it costs is a small multiple of its
// bytes, on REST and gRPC alike.
func TestBatchLimitCheckedBeforeDecoding(t *testing.T) {
	const events = 1_000_000
	srv, pub := newBareServer(t, api.Config{MaxBatchEvents: 100, MaxRequestBytes: 16 << 20}, nil)

	t.Run("REST", func(t *testing.T) {
		body := []byte(`{"events":[` + strings.TrimSuffix(strings.Repeat("{},", events), ",") + `]}`)
		var code int
		var answer []byte
		n := allocated(func() {
			req, err := http.NewRequest(http.MethodPost, "http://"+srv.HTTPAddr()+"/v1/events", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+testKeys["ingest"])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			code = resp.StatusCode
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			answer = b.Bytes()
		})
		if code != http.StatusBadRequest || !bytes.Contains(answer, []byte("more than 100 events")) {
			t.Errorf("got %d %s, want 400 naming the limit", code, answer)
		}
		t.Logf("%d-byte body: %d bytes allocated", len(body), n)
		if limit := uint64(maxAllocPerByte * len(body)); n > limit {
			t.Errorf("a %d-byte body of %d events allocated %d bytes (%d per byte), want at most %d", len(body), events, n, n/uint64(len(body)), limit)
		}
	})

	t.Run("gRPC", func(t *testing.T) {
		// The message is written by hand (field 1, length 0, per event):
		// building a million messages here would swamp the measurement.
		msg := bytes.Repeat([]byte{0x0a, 0x00}, events)
		conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(32<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var callErr error
		n := allocated(func() {
			callErr = conn.Invoke(withKey(testKeys["ingest"]), meterv1.IngestService_PublishEvents_FullMethodName, &msg,
				&meterv1.PublishEventsResponse{}, grpc.ForceCodecV2(rawBytesCodec{}))
		})
		if status.Code(callErr) != codes.InvalidArgument || !strings.Contains(status.Convert(callErr).Message(), "more than 100 events") {
			t.Errorf("got %v, want INVALID_ARGUMENT naming the limit", callErr)
		}
		t.Logf("%d-byte message: %d bytes allocated", len(msg), n)
		if limit := uint64(maxAllocPerByte * len(msg)); n > limit {
			t.Errorf("a %d-byte message of %d events allocated %d bytes (%d per byte), want at most %d", len(msg), events, n, n/uint64(len(msg)), limit)
		}
	})

	t.Run("within the limit", func(t *testing.T) {
		evs := make([]*meterv1.InferenceEvent, 100)
		for i := range evs {
			evs[i] = ev(i, "acme")
		}
		resp, err := meterv1.NewIngestServiceClient(grpcConn(t, srv)).PublishEvents(withKey(testKeys["ingest"]), &meterv1.PublishEventsRequest{Events: evs})
		if err != nil || resp.GetAccepted() != 100 {
			t.Fatalf("100 events: got %v, %v; want 100 accepted", resp, err)
		}
		code, body := restTo(t, srv, http.MethodPost, "/v1/events", testKeys["ingest"], string(eventsJSON(t, evs...)))
		if code != http.StatusOK {
			t.Fatalf("100 events over REST: got %d %s", code, body)
		}
	})
	if got := len(pub.events); got != 200 {
		t.Errorf("published %d events, want 200 (the batches within the limit)", got)
	}
}

func grpcConn(t *testing.T, srv *api.Server) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rawBytesCodec sends a *[]byte as the message, as it is.
type rawBytesCodec struct{}

func (rawBytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawBytesCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if b, ok := v.(*[]byte); ok {
		*b = data.Materialize()
		return nil
	}
	return nil
}

func (rawBytesCodec) Name() string { return "proto" }
