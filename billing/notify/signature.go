package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader carries a webhook body's signature, as Stripe's
// Stripe-Signature does: "t=<unix seconds>,v1=<hex HMAC-SHA256>", the HMAC
// keyed with the shared secret over "<t>.<body>". A receiver may list
// several v1 (while the secret rotates): one that verifies is enough.
const SignatureHeader = "Tokenmeter-Signature"

// ErrSignature marks a webhook body whose signature does not verify.
var ErrSignature = errors.New("webhook signature does not verify")

// Sign is the SignatureHeader value of body sent at t.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

// mac is HMAC-SHA256(secret, ts + "." + body).
func mac(secret []byte, ts string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(ts))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verify checks header, a SignatureHeader value, against body and secret,
// and that its timestamp is within tolerance of now (a replayed old
// request fails; tolerance 0 skips the check). Errors wrap ErrSignature.
// A receiver verifies the raw body, before parsing it.
func Verify(secret []byte, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var (
		ts   string
		sigs [][]byte
	)
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no timestamp", ErrSignature)
	}
	if len(sigs) == 0 {
		return fmt.Errorf("%w: no v1 signature", ErrSignature)
	}
	if tolerance > 0 {
		if age := now.Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
			return fmt.Errorf("%w: timestamp %d is %s from now, over the tolerance of %s", ErrSignature, sec, age.Round(time.Second), tolerance)
		}
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no v1 signature matches the body", ErrSignature)
}
