package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ready\n") })
	mux.HandleFunc("/down", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	closed := httptest.NewServer(mux)
	closed.Close()

	tests := []struct {
		name    string
		args    []string
		wantErr bool
	}{
		{"2xx", []string{srv.URL + "/ok"}, false},
		{"503", []string{srv.URL + "/down"}, true},
		{"404", []string{srv.URL + "/nothing"}, true},
		{"nobody listens", []string{closed.URL + "/ok"}, true},
		{"timeout", []string{"--timeout", "100ms", srv.URL + "/slow"}, true},
		{"TLS, unknown CA", []string{tlsSrv.URL + "/ok"}, true},
		{"TLS, --insecure", []string{"--insecure", tlsSrv.URL + "/ok"}, false},
		{"no URL", nil, true},
		{"two URLs", []string{srv.URL + "/ok", srv.URL + "/ok"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, io.Discard)
			if (err != nil) != tt.wantErr {
				t.Errorf("run(%q): got error %v, want error %v", tt.args, err, tt.wantErr)
			}
		})
	}
}
