package api

import (
	"encoding/json"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// countEvents counts what a JSON decoder finds in "events", whatever the
// events hold (brackets and escaped quotes in strings, nested arrays), and
// stops past max.
func TestCountEvents(t *testing.T) {
	for _, body := range []string{
		`{"events":[]}`,
		`{"events":null}`,
		`{}`,
		` { "events" : [ {} , { } ,{"a":[1,2,[3]]}] } `,
		`{"events":[{"event_id":"a,b]}[{\"x\\","labels":{"k":"v,w"}},{"model":"]"}]}`,
		`{"events":[1,"two",null,true,[3,4],{"five":5}]}`,
		"{\"events\":[\n{},\n\t{}\r\n]}",
	} {
		var env struct{ Events []json.RawMessage }
		if err := json.Unmarshal([]byte(body), &env); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if got, want := countEvents([]byte(body), 100), len(env.Events); got != want {
			t.Errorf("%s: counted %d, want %d", body, got, want)
		}
		if len(env.Events) > 1 {
			if got, want := countEvents([]byte(body), 1), 2; got != want {
				t.Errorf("%s with max 1: counted %d, want %d (stop past max)", body, got, want)
			}
		}
	}
	// Not an object, or cut short: nothing to count, and no panic; the
	// decoder refuses these.
	for _, body := range []string{`[{},{}]`, `{"events":[{},{`, `{"events":["\`, `"`, ``} {
		if got := countEvents([]byte(body), 100); got > 2 {
			t.Errorf("%q: counted %d", body, got)
		}
	}
}

func TestCountRepeated(t *testing.T) {
	var msg []byte
	for i := range 5 {
		msg = protowire.AppendTag(msg, 1, protowire.BytesType)
		msg = protowire.AppendBytes(msg, []byte{byte(i)})
		msg = protowire.AppendTag(msg, 2, protowire.VarintType) // another field: not counted
		msg = protowire.AppendVarint(msg, 7)
	}
	for _, tc := range []struct{ max, want int }{{10, 5}, {5, 5}, {4, 5}, {1, 2}} {
		if got := countRepeated(msg, 1, tc.max); got != tc.want {
			t.Errorf("max %d: counted %d, want %d", tc.max, got, tc.want)
		}
	}
	if got := countRepeated(msg[:len(msg)-4], 1, 10); got != 4 {
		t.Errorf("cut message: counted %d, want 4 (the fields before the cut one)", got)
	}
}
