package api

import (
	"net/http"
)

// UsageMetricsPath is where the business metrics (meterd --usage-metrics,
// package usagemetrics) are served on the HTTP listener.
const UsageMetricsPath = "/metrics/usage"

// usageMetrics guards the business metrics: they hold every tenant's usage,
// so only finance and admin keys may scrape them (Prometheus sends the key
// with its scrape config's authorization: credentials_file). A missing or
// unknown key is 401, another role 403; the answer is plain text, as a
// scraper shows it.
func usageMetrics(keys *Keys, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		p, err := keys.authenticateHeader(r.Header.Get("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tokenmeter"`)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if p.Role != RoleFinance && p.Role != RoleAdmin {
			http.Error(w, errPermissionDenied.Error()+": the usage metrics hold every tenant's usage: scrape them with a finance or admin key",
				http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
