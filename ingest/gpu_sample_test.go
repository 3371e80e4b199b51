package ingest

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestDecodeGPUSample pins the checks GPU samples share with events (size,
// emptiness, content type) and the decode errors naming the record.
func TestDecodeGPUSample(t *testing.T) {
	limits := DefaultLimits()
	pb, err := proto.Marshal(&meterv1.GpuSample{SampleId: "s1", GpuUuid: "GPU-1", IntervalS: 10})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		value       []byte
		contentType string
		reason      string
		message     string // part of the error's message
	}{
		{"protobuf with header", pb, ContentTypeProtobuf, "", ""},
		{"protobuf sniffed", pb, "", "", ""},
		{"json sniffed", []byte(` {"sampleId":"s1","gpuUuid":"GPU-1","intervalS":10}`), "", "", ""},
		{"json with charset", []byte(`{"sample_id":"s1","gpu_uuid":"GPU-1","interval_s":10}`), "application/json; charset=utf-8", "", ""},
		{"malformed json", []byte(`{"sample_id":`), ContentTypeJSON, ReasonDecode, "malformed JSON GPU sample"},
		{"malformed protobuf", []byte{0x0a, 0xff, 0x01}, ContentTypeProtobuf, ReasonDecode, "malformed protobuf GPU sample"},
		{"empty", nil, "", ReasonDecode, "record is empty"},
		{"unsupported content type", pb, "text/csv", ReasonDecode, `unsupported content-type "text/csv"`},
		{"oversized", make([]byte, limits.MaxRecordBytes+1), "", ReasonOversized, "limit is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s meterv1.GpuSample
			err := DecodeGPUSample(&s, tt.value, tt.contentType, limits)
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("DecodeGPUSample() = %v, want nil", err)
				}
				if s.GetSampleId() != "s1" || s.GetGpuUuid() != "GPU-1" || s.GetIntervalS() != 10 {
					t.Errorf("got %v, want sample s1 of GPU-1 over 10 s", &s)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || verr.Reason != tt.reason {
				t.Fatalf("DecodeGPUSample() = %v, want reason %s", err, tt.reason)
			}
			if !strings.Contains(verr.Message, tt.message) {
				t.Errorf("message: got %q, want it to contain %q", verr.Message, tt.message)
			}
		})
	}
}
