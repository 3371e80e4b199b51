package sink

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestFingerprintSeesEveryField changes each field of an event row in turn
// (walking EventRow by reflection, so a new field is covered): every
// change gives another fingerprint, and an equal row the same one.
func TestFingerprintSeesEveryField(t *testing.T) {
	base := func() EventRow {
		var r EventRow
		r.FromProto(&meterv1.InferenceEvent{EventId: "e", TenantId: "t", Model: "m", CompletedAt: timestamppb.New(time.Unix(1e9, 5)),
			PromptTokens: proto.Int64(3), OutputTokens: proto.Int64(4), TtftMs: proto.Float64(1.5), Labels: map[string]string{"k": "v"}})
		return r
	}
	var buf []byte
	r0 := base()
	want := r0.Fingerprint(&buf)
	if r1 := base(); r1.Fingerprint(&buf) != want {
		t.Fatal("equal rows have different fingerprints")
	}
	var change func(v reflect.Value, path string)
	change = func(v reflect.Value, path string) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				change(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
			return
		case reflect.Slice: // Labels
			for i := range v.Len() {
				change(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			}
			return
		}
		old := reflect.ValueOf(v.Interface())
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Int32, reflect.Int64:
			v.SetInt(v.Int() + 1)
		case reflect.Uint32:
			v.SetUint(v.Uint() + 1)
		case reflect.Float64:
			v.SetFloat(v.Float() + 0.25)
		default:
			t.Fatalf("%s: kind %s not handled", path, v.Kind())
		}
		if got := r0.Fingerprint(&buf); got == want {
			t.Errorf("changing %s left the fingerprint as it was", path)
		}
		v.Set(old)
	}
	change(reflect.ValueOf(&r0).Elem(), "EventRow")
	if got := r0.Fingerprint(&buf); got != want {
		t.Fatal("the row did not come back to its fingerprint")
	}
}
