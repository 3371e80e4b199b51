package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// apiError is a non-2xx answer of the REST API. grpc-gateway writes error
// bodies as {"code":<gRPC code>,"message":"...","details":[]}.
type apiError struct {
	// Op is the request, e.g. "POST /v1/events".
	Op string
	// Status is the HTTP status code.
	Status int
	// Code is the gRPC status code from the body, 0 when there was none.
	Code int
	// Message is the server's explanation (or the start of a non-JSON body).
	Message string
	// RetryAfter is the server's Retry-After, 0 when absent.
	RetryAfter time.Duration
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%s: %d %s", e.Op, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		s += ": " + e.Message
	}
	switch e.Status {
	case http.StatusUnauthorized:
		s += " (check --key or METER_API_KEY)"
	case http.StatusForbidden:
		s += " (the key's role or tenant does not allow this)"
	case http.StatusRequestEntityTooLarge:
		s += " (lower --batch)"
	}
	return s
}

// temporary tells whether the same request may succeed later: the server or
// a proxy is unavailable, overloaded or timed out.
func (e *apiError) temporary() bool {
	switch e.Status {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return true
	}
	return false
}

// transportError is a request that got no HTTP answer (connection refused,
// reset, timed out); it is worth retrying.
type transportError struct {
	Op  string
	Err error
}

func (e *transportError) Error() string { return fmt.Sprintf("%s: %v", e.Op, e.Err) }
func (e *transportError) Unwrap() error { return e.Err }

// retryable tells whether err is worth sending the same request again.
func retryable(err error) bool {
	var ae *apiError
	var te *transportError
	return errors.As(err, &te) || (errors.As(err, &ae) && ae.temporary())
}

// client calls the tokenmeter REST API.
type client struct {
	base string // scheme://host[:port][/prefix], no trailing slash
	key  string
	http *http.Client
}

// maxResponseBytes bounds what is read of one answer.
const maxResponseBytes = 256 << 20

func newClient(c connConfig, conns int) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(conns, 2)
	return &client{
		base: c.baseURL(),
		key:  c.Key,
		http: &http.Client{Timeout: c.Timeout, Transport: tr},
	}
}

// do sends one request and returns the body of a 2xx answer, an *apiError
// for any other answer, or a *transportError when there was none.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	op := method + " " + path
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", op, context.Cause(ctx))
		}
		return nil, &transportError{Op: op, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", op, context.Cause(ctx))
		}
		return nil, &transportError{Op: op, Err: fmt.Errorf("read answer: %w", err)}
	}
	if resp.StatusCode/100 == 2 {
		return data, nil
	}
	return nil, newAPIError(op, resp, data)
}

// newAPIError is the error of a non-2xx answer whose body is data.
func newAPIError(op string, resp *http.Response, data []byte) *apiError {
	ae := &apiError{Op: op, Status: resp.StatusCode}
	var gw struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if json.Unmarshal(data, &gw) == nil && (gw.Code != nil || gw.Message != nil) {
		if gw.Code != nil {
			ae.Code = *gw.Code
		}
		if gw.Message != nil {
			ae.Message = *gw.Message
		}
	} else {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		ae.Message = msg
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		ae.RetryAfter = time.Duration(s) * time.Second
	}
	return ae
}
