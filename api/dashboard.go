package api

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"strings"
)

// dashboardFiles are the dashboard's static files: hand-written HTML, CSS
// and JavaScript (ES modules) that draw SVG charts from the REST API, with
// no build step; the one piece of third-party code is the API reference
// page's renderer, vendored from npm (ui/vendor/swagger-ui).
//
//go:embed ui
var dashboardFiles embed.FS

// dashboardCSP keeps the dashboard to its own files and its own origin's
// API: no inline script, no other site.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"connect-src 'self'; font-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// dashboard serves the web dashboard under /ui/: its static files without a
// key (they hold no data; the data calls to /v1/ need the key), and
// GET /ui/session, which tells the page the name, role and tenant of the key
// in its Authorization header, so that it shows only what the key may read.
func dashboard(keys *Keys) http.Handler {
	static, err := fs.Sub(dashboardFiles, "ui")
	if err != nil {
		panic(err) // the embedded directory exists: go:embed checked it
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(static))
	etags, err := fileETags(static)
	if err != nil {
		panic(err) // reading the embedded files cannot fail
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", dashboardCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if r.URL.Path == "/ui/session" {
			session(keys, w, r)
			return
		}
		// The files change with the binary: revalidate, never guess. The
		// ETag lets a revalidation answer 304 (embedded files have no
		// modification time to compare).
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(r.URL.Path, "/ui/")
		if name == "" || strings.HasSuffix(name, "/") {
			name += "index.html"
		}
		if etag, ok := etags[name]; ok {
			h.Set("ETag", etag)
		}
		files.ServeHTTP(w, r)
	})
}

// fileETags returns a strong ETag (SHA-256, shortened) per file of fsys,
// by path.
func fileETags(fsys fs.FS) (map[string]string, error) {
	etags := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		etags[path] = `"` + hex.EncodeToString(sum[:16]) + `"`
		return nil
	})
	return etags, err
}

// sessionInfo is the answer of GET /ui/session.
type sessionInfo struct {
	Name     string `json:"name"`
	Role     Role   `json:"role"`
	TenantID string `json:"tenant_id,omitempty"`
}

// session answers who the key of the request is, or 401 in the gateway's
// error format ({"code":16,"message":...}) for a missing or unknown key.
func session(keys *Keys, w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	p, err := keys.authenticateHeader(r.Header.Get("Authorization"))
	if err != nil {
		msg := "unauthenticated"
		if errors.Is(err, errUnauthenticated) {
			msg = err.Error()
		}
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]any{"code": 16, "message": msg, "details": []any{}})
		return
	}
	_ = json.NewEncoder(w).Encode(sessionInfo{Name: p.Name, Role: p.Role, TenantID: p.TenantID})
}
