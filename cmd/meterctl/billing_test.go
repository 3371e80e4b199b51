package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tokenmeter/api"
	"tokenmeter/billing/closing"
	"tokenmeter/billing/export"
	"tokenmeter/internal/testkit/billingtest"
	"tokenmeter/internal/testkit/chtest"
)

func TestMain(m *testing.M) { chtest.Main(m) }

// billingKeys are an admin, a finance and acme's tenant key.
func billingKeys(t *testing.T) *api.Keys {
	t.Helper()
	keys, err := api.NewKeys(api.KeysFile{Keys: []api.KeyEntry{
		{Name: "admin", SHA256: hashKey("tm_admin"), Role: api.RoleAdmin},
		{Name: "finance", SHA256: hashKey("tm_finance"), Role: api.RoleFinance},
		{Name: "acme", SHA256: hashKey("tm_acme"), Role: api.RoleTenant, TenantID: "acme"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// restGet is a plain GET of the API, for comparing with what meterctl wrote.
func restGet(t *testing.T, url, key string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

// TestBillingCommands runs every billing command against the real API
// server over a real ClickHouse: periods, close (admin only), statement as
// a table and as JSON, and both exports to a file, which holds what the
// API serves; an export that fails leaves no file.
func TestBillingCommands(t *testing.T) {
	_, svc := billingtest.New(t)
	addr := startAPI(t, &api.Services{Keys: billingKeys(t), Billing: svc})
	with := func(key string, args ...string) []string { return append(args, "--addr", addr, "--key", key) }

	out, _, err := runArgs(t, nil, with("tm_finance", "billing", "periods", "--tenant", "acme")...)
	if err != nil {
		t.Fatalf("periods: %v", err)
	}
	if !strings.Contains(out, "acme    2026-10  UTC   open") {
		t.Errorf("periods before the close:\n%s", out)
	}

	// Only admin closes; flags may follow the period.
	var ae *apiError
	if _, _, err := runArgs(t, nil, with("tm_finance", "billing", "close", "2026-10", "--tenant", "acme")...); !errors.As(err, &ae) || ae.Status != http.StatusForbidden {
		t.Errorf("close with a finance key: %v, want 403", err)
	}
	if _, _, err := runArgs(t, nil, with("tm_admin", "billing", "close", "2026-10", "--reprice", "2026-11")...); !errors.As(err, &ae) ||
		ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, "2026-11") {
		t.Errorf("close repricing a later period: %v, want 400", err)
	}
	out, _, err = runArgs(t, nil, with("tm_admin", "billing", "close", "--tenant", "acme,globex", "2026-10", "--grace", "24h", "-o", "json")...)
	if err != nil {
		t.Fatalf("close: %v", err)
	}
	var closed struct {
		Periods []struct {
			TenantID string `json:"tenant_id"`
			Hash     string `json:"hash"`
			Closed   bool   `json:"closed"`
		} `json:"periods"`
	}
	if err := json.Unmarshal([]byte(out), &closed); err != nil || len(closed.Periods) != 2 || !closed.Periods[0].Closed || closed.Periods[0].Hash == "" {
		t.Fatalf("close answered %v:\n%s", err, out)
	}
	acmeHash := closed.Periods[0].Hash

	out, _, err = runArgs(t, nil, with("tm_acme", "billing", "periods")...)
	if err != nil || !strings.Contains(out, "2026-10  UTC   closed") || !strings.Contains(out, acmeHash) {
		t.Errorf("tenant's periods after the close (%v):\n%s", err, out)
	}

	// The statement: a table with its hash and lines; finance's has cost.
	out, _, err = runArgs(t, nil, with("tm_acme", "billing", "statement", "2026-10")...)
	if err != nil {
		t.Fatalf("statement: %v", err)
	}
	for _, want := range []string{"Statement of acme for 2026-10", "closed 2026-", "Hash " + acmeHash, "usage  m ", "usage  m2", "total USD "} {
		if !strings.Contains(out, want) {
			t.Errorf("statement table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Finance") || strings.Contains(out, "MARGIN") {
		t.Errorf("tenant's statement shows finance figures:\n%s", out)
	}
	out, _, err = runArgs(t, nil, with("tm_finance", "billing", "statement", "2026-10", "--tenant", "acme")...)
	if err != nil || !strings.Contains(out, "Finance: allocated GPU cost USD ") || !strings.Contains(out, "MARGIN") {
		t.Errorf("finance's statement (%v):\n%s", err, out)
	}
	out, _, err = runArgs(t, nil, with("tm_finance", "billing", "statement", "2026-10", "--tenant", "acme", "-o", "json")...)
	var st struct {
		Statement struct {
			Hash string `json:"hash"`
		} `json:"statement"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Statement.Hash != acmeHash {
		t.Errorf("statement JSON (%v): hash %q, want %q", err, st.Statement.Hash, acmeHash)
	}

	// Exports: the file is what the API serves, the summary goes to stderr.
	dir := t.TempDir()
	file := filepath.Join(dir, "acme.csv")
	_, errOut, err := runArgs(t, nil, with("tm_acme", "billing", "export", "statements", "2026-10", "--format", "csv", "-o", file)...)
	if err != nil {
		t.Fatalf("export statements: %v", err)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := restGet(t, addr+"/v1/billing/statements/2026-10/export?format=csv", "tm_acme"); !bytes.Equal(got, want) {
		t.Errorf("exported file differs from the API's answer:\n%s\nwant\n%s", got, want)
	}
	if head, _, _ := strings.Cut(string(got), "\n"); head != strings.Join(export.StatementColumns(false), ",") {
		t.Errorf("tenant's export header %q", head)
	}
	if lines := strings.Split(strings.TrimSpace(errOut), "\n"); len(lines) != 1 ||
		!strings.HasPrefix(lines[0], "meterctl: wrote "+file+": ") || !strings.Contains(lines[0], " rows") || !strings.Contains(lines[0], "statements-2026-10-acme.csv") {
		t.Errorf("stderr %q: want one summary line with bytes, rows and the server's file name", errOut)
	}
	if n := summaryBytes(t, errOut); n != len(got) {
		t.Errorf("summary says %d bytes, the file has %d", n, len(got))
	}

	pq := filepath.Join(dir, "usage.parquet")
	start, end := billingtest.Hour.Format(time.RFC3339), billingtest.Hour.Add(2*time.Hour).Format(time.RFC3339)
	_, errOut, err = runArgs(t, nil, with("tm_finance", "billing", "export", "usage-cost", "--start", start, "--end", end, "--format", "parquet", "-o", pq)...)
	if err != nil {
		t.Fatalf("export usage-cost: %v", err)
	}
	got, _ = os.ReadFile(pq)
	if !bytes.HasPrefix(got, []byte("PAR1")) || !bytes.HasSuffix(got, []byte("PAR1")) || !strings.Contains(errOut, "application/vnd.apache.parquet") {
		t.Errorf("usage-cost Parquet export: %d bytes, stderr %q", len(got), errOut)
	}

	// A refused export (the period is open) leaves no file and no temporary.
	open := filepath.Join(dir, "open.csv")
	_, _, err = runArgs(t, nil, with("tm_finance", "billing", "export", "statements", "2026-11", "-o", open)...)
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || !strings.Contains(ae.Message, "not closed") {
		t.Errorf("export of an open period: %v, want 409 saying it is not closed", err)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"acme.csv", "usage.parquet"}) {
		t.Errorf("directory holds %v after a refused export", names)
	}
	// Bad flags are refused before any request.
	if _, _, err := runArgs(t, nil, with("tm_finance", "billing", "export", "statements", "2026-10", "--format", "xml", "-o", open)...); err == nil || !strings.Contains(err.Error(), "--format") {
		t.Errorf("--format xml: %v", err)
	}
}

// cutOffBilling fails usage-and-cost exports after streaming rows enough
// for a few chunks.
type cutOffBilling struct{ api.Billing }

func (c cutOffBilling) EachUsageCost(ctx context.Context, q closing.UsageCostQuery, fn func(*export.UsageCostRow) error) error {
	for range 60 { // more than the server's first 64 KiB chunk
		if err := c.Billing.EachUsageCost(ctx, q, fn); err != nil {
			return err
		}
	}
	return errors.New("clickhouse: connection reset by peer")
}

// TestBillingExportCutOff checks that an export the server cuts off midway
// fails, leaves no file and keeps an older file of the same name as it was.
func TestBillingExportCutOff(t *testing.T) {
	_, svc := billingtest.New(t)
	addr := startAPI(t, &api.Services{Keys: billingKeys(t), Billing: cutOffBilling{svc}})
	dir := t.TempDir()
	file := filepath.Join(dir, "usage.csv")
	if err := os.WriteFile(file, []byte("older export\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start, end := billingtest.Hour.Format(time.RFC3339), billingtest.Hour.Add(2*time.Hour).Format(time.RFC3339)
	_, _, err := runArgs(t, nil, "billing", "export", "usage-cost", "--start", start, "--end", end, "-o", file, "--addr", addr, "--key", "tm_finance")
	if err == nil || !strings.Contains(err.Error(), "broke off") {
		t.Fatalf("cut-off export: %v, want an error saying it broke off", err)
	}
	if got, _ := os.ReadFile(file); string(got) != "older export\n" {
		t.Errorf("the older file now holds %q", got)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"usage.csv"}) {
		t.Errorf("directory holds %v, want only the older file", names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// summaryBytes is the byte count of an export's summary line.
func summaryBytes(t *testing.T, line string) int {
	t.Helper()
	_, rest, _ := strings.Cut(line, ": ")
	_, rest, _ = strings.Cut(rest, ": ")
	var n int
	if _, err := fmt.Sscanf(rest, "%d bytes", &n); err != nil {
		t.Fatalf("summary %q: %v", line, err)
	}
	return n
}
