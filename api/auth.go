package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc/metadata"

	"tokenmeter/internal/ident"
)

// Role is what an API key may do.
type Role string

// Roles. ingest keys may only publish; tenant keys read their own tenant;
// finance and admin keys read every tenant (admin may also publish).
const (
	RoleIngest  Role = "ingest"
	RoleTenant  Role = "tenant"
	RoleFinance Role = "finance"
	RoleAdmin   Role = "admin"
)

// Principal is the authenticated caller.
type Principal struct {
	Name     string
	Role     Role
	TenantID string
}

var (
	errUnauthenticated  = errors.New("unauthenticated")
	errPermissionDenied = errors.New("permission denied")
)

// KeyEntry is one entry of the keys file.
type KeyEntry struct {
	Name     string `json:"name"`
	SHA256   string `json:"sha256"`
	Role     Role   `json:"role"`
	TenantID string `json:"tenant_id,omitempty"`
}

// KeysFile is the JSON document given by --auth-keys:
// {"keys":[{"name":"...","sha256":"<hex>","role":"...","tenant_id":"..."}]}.
type KeysFile struct {
	Keys []KeyEntry `json:"keys"`
}

// Keys authenticates bearer API keys by the SHA-256 of the key; the keys
// themselves are never stored.
type Keys struct {
	byHash map[string]Principal
}

// LoadKeys reads and checks a keys file.
func LoadKeys(path string) (*Keys, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read auth keys: %w", err)
	}
	var f KeysFile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse auth keys %s: %w", path, err)
	}
	k, err := NewKeys(f)
	if err != nil {
		return nil, fmt.Errorf("auth keys %s: %w", path, err)
	}
	return k, nil
}

// NewKeys checks every entry and returns the key set, joining all problems.
func NewKeys(f KeysFile) (*Keys, error) {
	k := &Keys{byHash: map[string]Principal{}}
	var errs []error
	names := map[string]bool{}
	for i, e := range f.Keys {
		where := fmt.Sprintf("key %d (%q)", i, e.Name)
		if e.Name == "" {
			errs = append(errs, fmt.Errorf("%s: name is required", where))
		} else if names[e.Name] {
			errs = append(errs, fmt.Errorf("%s: duplicate name", where))
		}
		names[e.Name] = true
		h := strings.ToLower(e.SHA256)
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			errs = append(errs, fmt.Errorf("%s: sha256 must be 64 hex digits", where))
		} else if _, dup := k.byHash[h]; dup {
			errs = append(errs, fmt.Errorf("%s: the same key is listed twice", where))
		}
		switch e.Role {
		case RoleTenant:
			if e.TenantID == "" {
				errs = append(errs, fmt.Errorf("%s: role tenant needs tenant_id", where))
			} else if err := ident.Check("tenant_id", e.TenantID); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
			}
		case RoleIngest, RoleFinance, RoleAdmin:
		default:
			errs = append(errs, fmt.Errorf("%s: unknown role %q: want ingest, tenant, finance or admin", where, e.Role))
		}
		k.byHash[h] = Principal{Name: e.Name, Role: e.Role, TenantID: e.TenantID}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return k, nil
}

// HashKey is the lowercase hex SHA-256 of a key, as stored in the keys file.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Authenticate finds the caller from the "authorization: Bearer <key>"
// metadata of an incoming gRPC (or gateway-forwarded REST) call.
func (k *Keys) Authenticate(ctx context.Context) (Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return k.authenticateHeader("")
	}
	return k.authenticateHeader(vals[0])
}

// authenticateHeader finds the caller from the value of an Authorization
// header ("Bearer <key>"; "" when there is none).
func (k *Keys) authenticateHeader(value string) (Principal, error) {
	if value == "" {
		return Principal{}, fmt.Errorf("%w: missing authorization: send \"Authorization: Bearer <api key>\"", errUnauthenticated)
	}
	scheme, token, ok := strings.Cut(value, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		return Principal{}, fmt.Errorf("%w: authorization must be \"Bearer <api key>\"", errUnauthenticated)
	}
	p, ok := k.byHash[HashKey(strings.TrimSpace(token))]
	if !ok {
		return Principal{}, fmt.Errorf("%w: unknown API key", errUnauthenticated)
	}
	return p, nil
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// NewKey returns a fresh random API key: "tm_" and 64 hex digits (32 bytes
// from crypto/rand).
func NewKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate key: %w", err)
	}
	return "tm_" + hex.EncodeToString(b[:]), nil
}
