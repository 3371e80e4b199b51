package api

import "net/http"

// HTTPHandler is the HTTP server's handler, for tests that call it without a network.
func (s *Server) HTTPHandler() http.Handler { return s.http.Handler }
