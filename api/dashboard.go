package api

import (
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
)

// dashboardFiles are the dashboard's static files: hand-written HTML, CSS
// and JavaScript (ES modules) that draw SVG charts from the REST API. No
// build step, no third-party code.
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", dashboardCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if r.URL.Path == "/ui/session" {
			session(keys, w, r)
			return
		}
		// The files change with the binary: revalidate, never guess.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
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
