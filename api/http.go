package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"tokenmeter/internal/timearg"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// maxJSONDepth bounds the nesting of a JSON request body. Events need four
// levels and admin documents a few more; a deeper body is refused before it
// is decoded, instead of failing deep inside protobuf's recursion limit.
const maxJSONDepth = 64

// httpRoute is what the HTTP guard knows of one gateway route.
type httpRoute struct {
	meterv1.HTTPRoute
	// params maps every accepted spelling of a query parameter to its
	// field path in proto names: proto and JSON names at each level, and
	// the aliases users type (start for selector.start on the metrics
	// routes; step and granularity for each other).
	params map[string]string
	// names are the documented field paths, sorted.
	names []string
	// times and repeated mark the field paths that are Timestamps or lists.
	times, repeated map[string]bool
}

// httpGuard runs on the REST path before the gateway reads the request
// body: it authenticates the key and checks its role, refuses unknown query
// parameters, and reads the body within its size and nesting limits. A
// request that fails any check costs no decoding.
type httpGuard struct {
	keys    *Keys
	routes  map[string]*httpRoute // "METHOD /path"
	maxBody int64
	mux     *runtime.ServeMux // for error responses; set once the mux exists
}

func newHTTPGuard(keys *Keys, maxBody int64) (*httpGuard, error) {
	routes, err := meterv1.HTTPRoutes()
	if err != nil {
		return nil, err
	}
	g := &httpGuard{keys: keys, routes: map[string]*httpRoute{}, maxBody: maxBody}
	for _, r := range routes {
		route, err := newHTTPRoute(r)
		if err != nil {
			return nil, err
		}
		g.routes[r.Method+" "+patternKey(r.Path)] = route
	}
	return g, nil
}

// pathVar matches a path variable of an api.yaml path, "{period}".
var pathVar = regexp.MustCompile(`\{([a-z_.]+)\}`)

// pathMatches tells whether path fits the api.yaml path template: equal
// segments, a variable ("{period}", "{period}:close") taking any non-empty
// segment (with the verb after it).
func pathMatches(template, path string) bool {
	ts, ps := strings.Split(template, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, t := range ts {
		if end := strings.IndexByte(t, '}'); strings.HasPrefix(t, "{") && end > 0 {
			verb := t[end+1:]
			if !strings.HasSuffix(ps[i], verb) || len(ps[i]) == len(verb) {
				return false
			}
			continue
		}
		if t != ps[i] {
			return false
		}
	}
	return true
}

// patternKey is an api.yaml path as the gateway's runtime.Pattern writes
// it: a variable "{period}" is "{period=*}".
func patternKey(path string) string { return pathVar.ReplaceAllString(path, "{$1=*}") }

// newHTTPRoute reads the query parameters of a route from its request
// message: every field path the body does not fill, as the gateway
// populates them (well-known types such as Timestamp are leaves).
func newHTTPRoute(r meterv1.HTTPRoute) (*httpRoute, error) {
	route := &httpRoute{HTTPRoute: r, params: map[string]string{}, times: map[string]bool{}, repeated: map[string]bool{}}
	if r.Body == "*" {
		return route, nil
	}
	name := strings.ReplaceAll(strings.TrimPrefix(r.FullMethod, "/"), "/", ".")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, fmt.Errorf("route %s %s: %w", r.Method, r.Path, err)
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil, fmt.Errorf("route %s %s: %s is not a method", r.Method, r.Path, name)
	}
	// prefixes holds the spellings of the parent path: the first is the
	// proto one, the others mix in JSON names.
	var walk func(prefixes []string, m protoreflect.MessageDescriptor, depth int)
	walk = func(prefixes []string, m protoreflect.MessageDescriptor, depth int) {
		fields := m.Fields()
		for i := 0; i < fields.Len(); i++ {
			f := fields.Get(i)
			if depth == 0 && string(f.Name()) == r.Body {
				continue
			}
			var paths []string
			for _, p := range prefixes {
				paths = append(paths, p+string(f.Name()), p+f.JSONName())
			}
			msg := f.Message()
			if msg == nil || f.IsList() || f.IsMap() || strings.HasPrefix(string(msg.FullName()), "google.protobuf.") || depth > 8 {
				canonical := paths[0]
				for _, n := range paths {
					route.params[n] = canonical
				}
				route.names = append(route.names, canonical)
				route.times[canonical] = msg != nil && msg.FullName() == "google.protobuf.Timestamp"
				route.repeated[canonical] = f.IsList()
				continue
			}
			for i := range paths {
				paths[i] += "."
			}
			walk(paths, msg, depth+1)
		}
	}
	walk([]string{""}, md.Input(), 0)
	slices.Sort(route.names)
	// Aliases: the plain names of a selector's fields, and step and
	// granularity for each other, where they do not clash with a field.
	alias := func(from, to string) {
		if _, taken := route.params[from]; !taken {
			if c, ok := route.params[to]; ok {
				route.params[from] = c
			}
		}
	}
	for _, spelling := range slices.Sorted(maps.Keys(route.params)) {
		if plain, ok := strings.CutPrefix(spelling, "selector."); ok {
			alias(plain, spelling)
		}
	}
	alias("step", "granularity")
	alias("granularity", "step")
	return route, nil
}

// middleware is the gateway middleware that applies the guard.
func (g *httpGuard) middleware(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, pathParams map[string]string) {
		route, ok := g.route(r)
		if !ok {
			// Every gateway route comes from api.yaml; a miss is a bug of ours.
			g.fail(w, r, http.StatusInternalServerError, status.Error(codes.Internal, "internal error: route not in api.yaml"))
			return
		}
		p, err := g.keys.authenticateHeader(r.Header.Get("Authorization"))
		if err == nil {
			err = checkRole(p, route.FullMethod)
		}
		if err != nil {
			g.fail(w, r, 0, toStatus(r.Context(), nil, err))
			return
		}
		if err := route.normalizeQuery(r.URL); err != nil {
			g.fail(w, r, 0, err)
			return
		}
		if route.Body != "" {
			body, httpStatus, err := g.readBody(r)
			if err != nil {
				g.fail(w, r, httpStatus, err)
				return
			}
			r.Body = &guardedBody{Reader: bytes.NewReader(body), data: body}
		}
		next(w, r, pathParams)
	}
}

// guardedBody is a body the guard has read whole: handlers that want the
// bytes take data instead of copying them out again.
type guardedBody struct {
	*bytes.Reader
	data []byte
}

func (*guardedBody) Close() error { return nil }

func (g *httpGuard) route(r *http.Request) (*httpRoute, bool) {
	pat, ok := runtime.HTTPPattern(r.Context())
	if !ok {
		return nil, false
	}
	route, ok := g.routes[r.Method+" "+pat.String()]
	return route, ok
}

// readBody reads the whole body within maxBody bytes (413 beyond, declared
// or not) and checks its JSON nesting.
func (g *httpGuard) readBody(r *http.Request) ([]byte, int, error) {
	if r.ContentLength > g.maxBody {
		return nil, http.StatusRequestEntityTooLarge, tooLargeBody(r.ContentLength, g.maxBody)
	}
	body, err := readAll(io.LimitReader(r.Body, g.maxBody+1), r.ContentLength)
	if err != nil {
		return nil, http.StatusBadRequest, status.Errorf(codes.InvalidArgument, "read request body: %v", err)
	}
	if int64(len(body)) > g.maxBody {
		return nil, http.StatusRequestEntityTooLarge, tooLargeBody(-1, g.maxBody)
	}
	if d := jsonDepth(body); d > maxJSONDepth {
		return nil, 0, status.Errorf(codes.InvalidArgument, "request body nests more than %d levels deep", maxJSONDepth)
	}
	return body, 0, nil
}

// readAll is io.ReadAll with a buffer that doubles as bytes arrive (from
// 64 KiB, never past a declared length), where io.ReadAll grows by a
// quarter: a 16 MB body was some twenty copies and 80 MB of garbage. The
// buffer is not sized from the declared length up front, so that a client
// that declares 16 MB and sends nothing holds little.
func readAll(r io.Reader, declared int64) ([]byte, error) {
	ceiling := int64(-1)
	if declared >= 0 {
		ceiling = declared + 1 // +1: room to read the end of the body
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			size := max(2*int64(cap(buf)), 64<<10)
			if ceiling > int64(cap(buf)) {
				size = min(size, ceiling)
			}
			buf = append(make([]byte, 0, size), buf...)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func tooLargeBody(size, max int64) error {
	if size < 0 {
		return status.Errorf(codes.InvalidArgument, "request body is over the limit of %d bytes; split the batch", max)
	}
	return status.Errorf(codes.InvalidArgument, "request body is %d bytes, the limit is %d; split the batch", size, max)
}

// fail writes err in the gateway's error format, with httpStatus instead of
// the status code's own when it is not 0.
func (g *httpGuard) fail(w http.ResponseWriter, r *http.Request, httpStatus int, err error) {
	if httpStatus != 0 {
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err}
	}
	_, out := runtime.MarshalerForRequest(g.mux, r)
	runtime.HTTPError(r.Context(), g.mux, out, w, r, err)
}

// normalizeQuery rewrites the query of u with the proto spelling of every
// parameter and every time in RFC 3339, for the gateway to populate the
// request from. Unknown parameters (all of them named), a parameter given
// in two spellings, and times that do not parse are InvalidArgument errors.
func (r *httpRoute) normalizeQuery(u *url.URL) error {
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "malformed query string: %v", err)
	}
	if len(query) == 0 {
		return nil
	}
	var unknown []string
	out := url.Values{}
	given := map[string]string{} // canonical -> the spelling used
	for _, k := range slices.Sorted(maps.Keys(query)) {
		name, mapKey := k, ""
		if i := strings.IndexByte(k, '['); i > 0 && strings.HasSuffix(k, "]") {
			name, mapKey = k[:i], k[i:] // a map entry, key[mapkey]
		}
		canonical, ok := r.params[name]
		if !ok {
			unknown = append(unknown, fmt.Sprintf("%q", k))
			continue
		}
		if prev, dup := given[canonical+mapKey]; dup && !r.repeated[canonical] {
			return status.Errorf(codes.InvalidArgument, "query parameter %s is given twice, as %q and %q", canonical, prev, k)
		}
		given[canonical+mapKey] = k
		for _, v := range query[k] {
			// The gateway copies values into string fields, which gRPC
			// refuses to marshal unless they are UTF-8 (a 500 otherwise).
			if !utf8.ValidString(v) {
				return status.Errorf(codes.InvalidArgument, "query parameter %s: the value %q is not valid UTF-8", k, v)
			}
			if r.times[canonical] {
				t, err := timearg.Parse(k, v)
				if err != nil {
					return status.Error(codes.InvalidArgument, err.Error())
				}
				v = t.Format(time.RFC3339Nano)
			}
			out.Add(canonical+mapKey, v)
		}
	}
	if len(unknown) > 0 {
		accepts := "no query parameters"
		if len(r.names) > 0 {
			accepts = strings.Join(r.names, ", ")
		}
		return status.Errorf(codes.InvalidArgument, "unknown query parameter %s: %s %s accepts %s", strings.Join(unknown, ", "), r.Method, r.Path, accepts)
	}
	u.RawQuery = out.Encode()
	return nil
}

// jsonDepth returns the deepest nesting of objects and arrays in a JSON
// text, counting brackets outside strings. It does not validate: the
// decoder does that afterwards, this only bounds its recursion.
func jsonDepth(b []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
	}
	return deepest
}

// routingError answers a path the gateway does not serve with 404, and a
// known path with the wrong method with 405 and an Allow header (the
// gateway's default says 501).
func (g *httpGuard) routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	var err error
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		var allow []string
		for _, route := range g.routes {
			if pathMatches(route.Path, r.URL.Path) {
				allow = append(allow, route.Method)
			}
		}
		slices.Sort(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		err = status.Errorf(codes.Unimplemented, "method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allow, ", "))
	case http.StatusNotFound:
		err = status.Errorf(codes.NotFound, "no route %s", r.URL.Path)
	default:
		err = status.Error(codes.InvalidArgument, http.StatusText(httpStatus))
	}
	runtime.HTTPError(ctx, mux, m, w, r, &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err})
}

// errorHandler is the gateway's error handler: as the default, but an
// internal error never shows its text (the gateway's own hop to the gRPC
// server can fail with messages about our internals).
func errorHandler(logger *slog.Logger) runtime.ErrorHandlerFunc {
	return func(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
		var hs *runtime.HTTPStatusError
		inner := err
		if errors.As(err, &hs) {
			inner = hs.Err
		}
		s, ok := status.FromError(inner)
		if ok && s.Code() == codes.FailedPrecondition && hs == nil {
			// The gateway's default is 400; a well-formed request that the
			// state of a billing period refuses (not closed, not over, ingest
			// or rollups behind) is 409 Conflict, so that clients can tell it
			// from a malformed one and retry later.
			err = &runtime.HTTPStatusError{HTTPStatus: http.StatusConflict, Err: inner}
		}
		if !ok || s.Code() == codes.Internal || s.Code() == codes.Unknown || s.Code() == codes.DataLoss {
			logger.ErrorContext(ctx, "REST request failed", "method", r.Method, "path", r.URL.Path, "error", err)
			inner = status.Error(codes.Internal, "internal error")
			if hs != nil {
				err = &runtime.HTTPStatusError{HTTPStatus: hs.HTTPStatus, Err: inner}
			} else {
				err = inner
			}
		}
		runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
	}
}
