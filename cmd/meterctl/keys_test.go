package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"tokenmeter/api"
)

func TestKeysNew(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want keyEntry // without SHA256
	}{
		{"ingest", []string{"--name", "gateway", "--role", "ingest"}, keyEntry{Name: "gateway", Role: "ingest"}},
		{"tenant", []string{"--name", "acme-portal", "--role", "tenant", "--tenant", "acme"}, keyEntry{Name: "acme-portal", Role: "tenant", TenantID: "acme"}},
		{"finance", []string{"--name", "books", "--role", "finance"}, keyEntry{Name: "books", Role: "finance"}},
		{"admin", []string{"--name", "ops", "--role", "admin"}, keyEntry{Name: "ops", Role: "admin"}},
	}
	var file api.KeysFile
	keys := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runArgs(t, nil, append([]string{"keys", "new"}, tt.args...)...)
			if err != nil {
				t.Fatalf("keys new: %v", err)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("output has %d lines, want the key and the entry:\n%s", len(lines), out)
			}
			key := lines[0]
			if !strings.HasPrefix(key, "tm_") || len(key) != 3+64 {
				t.Errorf("key %q, want tm_ and 64 hex digits", key)
			}
			if keys[key] {
				t.Errorf("key %q issued twice", key)
			}
			keys[key] = true
			var got keyEntry
			dec := json.NewDecoder(strings.NewReader(lines[1]))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("entry %q: %v", lines[1], err)
			}
			sum := sha256.Sum256([]byte(key))
			if want := hex.EncodeToString(sum[:]); got.SHA256 != want {
				t.Errorf("sha256 %s, want %s (the key's)", got.SHA256, want)
			}
			tt.want.SHA256 = got.SHA256
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("entry (-want +got):\n%s", diff)
			}
			var e api.KeyEntry
			if err := json.Unmarshal([]byte(lines[1]), &e); err != nil {
				t.Fatal(err)
			}
			file.Keys = append(file.Keys, e)
		})
	}
	// The entries together make a keys file that meterd accepts.
	if _, err := api.NewKeys(file); err != nil {
		t.Errorf("meterd refuses the entries: %v", err)
	}
}

func TestKeysNewErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no name":             {"--role", "ingest"},
		"no role":             {"--name", "x"},
		"unknown role":        {"--name", "x", "--role", "root"},
		"tenant without ID":   {"--name", "x", "--role", "tenant"},
		"tenant on ingest":    {"--name", "x", "--role", "ingest", "--tenant", "acme"},
		"missing subcommand":  nil,
		"positional argument": {"--name", "x", "--role", "admin", "extra"},
	} {
		t.Run(name, func(t *testing.T) {
			full := []string{"keys", "new"}
			if args == nil {
				full = []string{"keys"}
			}
			out, _, err := runArgs(t, nil, append(full, args...)...)
			if err == nil {
				t.Errorf("no error; printed %q", out)
			}
			if out != "" {
				t.Errorf("printed %q on error, want nothing", out)
			}
		})
	}
}
