package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
)

// validQuery answers 400 for a query string whose names or values are not
// valid UTF-8 once unescaped. The gateway would copy them into string fields
// of the request message, which gRPC then refuses to marshal: a 500 that
// leaks "grpc: error while marshaling". A query that does not parse at all
// is left to the gateway, which answers 400 itself.
func validQuery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := queryUTF8(r.URL.RawQuery); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			msg, _ := json.Marshal(err.Error())
			fmt.Fprintf(w, `{"code":%d,"message":%s,"details":[]}`+"\n", codes.InvalidArgument, msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// queryUTF8 reports the first query parameter of raw whose name or value is
// not valid UTF-8.
func queryUTF8(raw string) error {
	if utf8.ValidString(raw) && !strings.Contains(raw, "%") {
		return nil // the common case: nothing to unescape
	}
	values, err := url.ParseQuery(raw)
	if err != nil {
		return nil
	}
	for name, vs := range values {
		if !utf8.ValidString(name) {
			return fmt.Errorf("query parameter %q: the name is not valid UTF-8", name)
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return fmt.Errorf("query parameter %s: the value %q is not valid UTF-8", name, v)
			}
		}
	}
	return nil
}
