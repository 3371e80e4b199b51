// Package api serves tokenmeter over gRPC and REST (grpc-gateway, routes in
// proto/tokenmeter/v1/api.yaml): authentication by bearer API keys, role and
// tenant scoping, request limits, the mapping of domain errors to status
// codes, and the operational endpoints (/metrics, /healthz/live,
// /healthz/ready).
//
// It holds no business logic: publishing is package ingest, queries are
// internal/chstore.
package api
