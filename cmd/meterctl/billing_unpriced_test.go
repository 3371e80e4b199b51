package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"tokenmeter/api"
	"tokenmeter/internal/adapter/chstore/chstoretest"
	"tokenmeter/internal/testkit/billingtest"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

// TestBillingCloseUnpriced closes October after acme ran 10 requests of a
// model the price book does not price: the close answers 409 naming the
// model and its requests (globex, all priced, closes), and with
// --flag-unpriced acme closes too, its statement counting the 10 requests.
func TestBillingCloseUnpriced(t *testing.T) {
	store, svc := billingtest.New(t)
	var events []*meterv1.InferenceEvent
	for i := range 10 {
		events = append(events, &meterv1.InferenceEvent{EventId: fmt.Sprintf("x%d", i), TenantId: "acme", Model: "new-model", Deployment: "d",
			CompletedAt: timestamppb.New(billingtest.Hour.Add(time.Duration(i) * time.Minute)), PromptTokens: proto.Int64(100), OutputTokens: proto.Int64(10)})
	}
	chstoretest.Insert(t, store, events)
	billingtest.RollUp(t, store)
	addr := startAPI(t, &api.Services{Keys: billingKeys(t), Billing: svc})
	with := func(key string, args ...string) []string { return append(args, "--addr", addr, "--key", key) }

	var ae *apiError
	_, _, err := runArgs(t, nil, with("tm_admin", "billing", "close", "2026-10", "--tenant", "acme,globex")...)
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, `"new-model": 10 requests`) {
		t.Fatalf("close with unpriced usage: %v, want 409 naming new-model's 10 requests", err)
	}
	out, _, err := runArgs(t, nil, with("tm_admin", "billing", "periods", "--tenant", "globex")...)
	if err != nil || !strings.Contains(out, "closed") {
		t.Errorf("globex, all priced, did not close: %v\n%s", err, out)
	}
	out, _, err = runArgs(t, nil, with("tm_admin", "billing", "close", "2026-10", "--tenant", "acme", "--flag-unpriced", "-o", "json")...)
	if err != nil {
		t.Fatalf("close --flag-unpriced: %v", err)
	}
	out, _, err = runArgs(t, nil, with("tm_admin", "billing", "statement", "2026-10", "--tenant", "acme", "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Statement struct {
			Closed           bool   `json:"closed"`
			UnpricedRequests string `json:"unpriced_requests"`
		} `json:"statement"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Statement.UnpricedRequests != "10" {
		t.Errorf("acme's statement after --flag-unpriced: %v\n%s", err, out)
	}
}
