package notify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// Webhook request headers besides SignatureHeader.
const (
	WebhookEventHeader          = "Tokenmeter-Event"
	WebhookIdempotencyKeyHeader = "Idempotency-Key"
)

// WebhookConfig configures a WebhookSink.
type WebhookConfig struct {
	// URL receives a POST per event (http or https).
	URL string
	// Secret keys the signature (SignatureHeader); required.
	Secret []byte
	// Timeout bounds one POST, from connecting to reading the status
	// (default 10s).
	Timeout time.Duration
	// Client sends the requests (default: a client of its own that
	// follows no redirect).
	Client *http.Client
	// Now stamps signatures (time.Now when nil).
	Now func() time.Time
}

// WebhookSink POSTs each event, signed, to a URL. A 2xx answer delivers
// it; any other answer, a redirect included, or no answer within the
// timeout is a failure, retried by the Notifier: a 4xx other than 408 and
// 429 for good (a PermanentError), no answer, a redirect, 429, 502, 503
// and 504 as the endpoint's (an UnavailableError: the events after it are
// not tried in that Send), any other as the event's.
type WebhookSink struct {
	cfg  WebhookConfig
	name string
}

// NewWebhookSink checks cfg and returns the sink.
func NewWebhookSink(cfg WebhookConfig) (*WebhookSink, error) {
	if err := CheckWebhookURL(cfg.URL); err != nil {
		return nil, err
	}
	if len(cfg.Secret) == 0 {
		return nil, errors.New("billing webhook: a signing secret is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// The delivery state names the endpoint by a hash: a URL may hold a
	// token, which is no business of the database.
	sum := sha256.Sum256([]byte(cfg.URL))
	return &WebhookSink{cfg: cfg, name: "webhook:" + hex.EncodeToString(sum[:8])}, nil
}

// CheckWebhookURL refuses a URL that is not absolute http or https.
func CheckWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("billing webhook URL %q: want an absolute http or https URL", raw)
	}
	return nil
}

// Name is "webhook:" and a hash of the URL: the sink's delivery state
// (another URL starts afresh).
func (w *WebhookSink) Name() string { return w.name }

// Send POSTs the events one after the other, each whatever the answers
// to the others, but none after the endpoint failed (UnavailableError).
func (w *WebhookSink) Send(ctx context.Context, out []Outgoing) []error {
	errs := make([]error, len(out))
	for i, o := range out {
		err := w.post(ctx, o)
		if err == nil {
			continue
		}
		errs[i] = fmt.Errorf("billing webhook, %s of %s for %s (%s): %w", o.Event.Type, o.Event.Tenant, o.Event.Period, o.Event.ID, err)
		var unavail *UnavailableError
		if errors.As(err, &unavail) {
			for j := i + 1; j < len(out); j++ {
				errs[j] = ErrNotTried
			}
			break
		}
	}
	return errs
}

// post sends one event.
func (w *WebhookSink) post(ctx context.Context, o Outgoing) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(o.Body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tokenmeter-billing-events/1")
	req.Header.Set(SignatureHeader, Sign(w.cfg.Secret, w.cfg.Now(), o.Body))
	req.Header.Set(WebhookEventHeader, o.Event.Type)
	req.Header.Set(WebhookIdempotencyKeyHeader, o.Event.ID)
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL may hold a token: not in logs
		}
		return &UnavailableError{err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	return answerError(resp.StatusCode, resp.Status)
}

// answerError is the failure a webhook's answer of code means: nil for a
// 2xx.
func answerError(code int, status string) error {
	err := fmt.Errorf("answered %s", status)
	switch {
	case code >= 200 && code <= 299:
		return nil
	case code == http.StatusRequestTimeout:
		return err // the event's, again later
	case code == http.StatusTooManyRequests, code == http.StatusBadGateway, code == http.StatusServiceUnavailable,
		code == http.StatusGatewayTimeout, code >= 300 && code <= 399:
		return &UnavailableError{err}
	case code >= 400 && code <= 499:
		return &PermanentError{err}
	default:
		return err
	}
}
