package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// keyEntry is one entry of meterd's --auth-keys file
// ({"keys":[entry, ...]}); the server stores only the key's SHA-256.
type keyEntry struct {
	Name     string `json:"name"`
	SHA256   string `json:"sha256"`
	Role     string `json:"role"`
	TenantID string `json:"tenant_id,omitempty"`
}

// keysConfig is the configuration of "keys new".
type keysConfig struct {
	Name   string
	Role   string
	Tenant string
}

// Validate reports every problem at once.
func (c keysConfig) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("--name is required"))
	}
	switch c.Role {
	case "tenant":
		if c.Tenant == "" {
			errs = append(errs, errors.New("--role tenant needs --tenant"))
		}
	case "ingest", "finance", "admin":
		if c.Tenant != "" {
			errs = append(errs, fmt.Errorf("--tenant is only for --role tenant; a %s key is not bound to a tenant", c.Role))
		}
	case "":
		errs = append(errs, errors.New("--role is required: ingest, tenant, finance or admin"))
	default:
		errs = append(errs, fmt.Errorf("--role %q: want ingest, tenant, finance or admin", c.Role))
	}
	return errors.Join(errs...)
}

func runKeysNew(args []string, stdout, stderr io.Writer) error {
	var c keysConfig
	fs := newFlagSet("keys new", "--name NAME --role ROLE [--tenant ID]",
		"Creates a random API key. Prints the key (line 1) and the JSON entry to add to\n"+
			"the \"keys\" list of meterd's --auth-keys file (line 2); the server keeps only\n"+
			"the key's SHA-256, so store the key now.", stderr)
	fs.StringVar(&c.Name, "name", "", "name of the key, unique in the keys file (e.g. gateway-prod)")
	fs.StringVar(&c.Role, "role", "", "ingest (publish events), tenant (read one tenant), finance or admin")
	fs.StringVar(&c.Tenant, "tenant", "", "tenant ID of a tenant key")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c.Name, c.Tenant = strings.TrimSpace(c.Name), strings.TrimSpace(c.Tenant)
	if err := c.Validate(); err != nil {
		return err
	}
	key, err := newKey()
	if err != nil {
		return err
	}
	entry, err := json.Marshal(keyEntry{Name: c.Name, SHA256: hashKey(key), Role: c.Role, TenantID: c.Tenant})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "%s\n%s\n", key, entry); err != nil {
		return err
	}
	fmt.Fprintln(stderr, `meterctl: line 1 is the key (shown once); line 2 goes into the "keys" list of the --auth-keys file.`)
	return nil
}

// newKey returns "tm_" and 32 random bytes in hex, the form meterd --dev
// issues.
func newKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate key: %w", err)
	}
	return "tm_" + hex.EncodeToString(b[:]), nil
}

// hashKey is the lowercase hex SHA-256 of the key string.
func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}
