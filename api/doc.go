// Package api serves tokenmeter over gRPC and REST (grpc-gateway, routes in
// proto/tokenmeter/v1/api.yaml): authentication by bearer API keys, role and
// tenant scoping, request limits, the mapping of domain errors to status
// codes, the operational endpoints (/metrics, /healthz/live,
// /healthz/ready), the OpenAPI document of the REST routes (/openapi.json)
// and the web dashboard (/ui/).
//
// It holds no business logic: publishing is package ingest, the read side
// (planning, merging, percentiles, rates, cost figures) is package query;
// api maps requests and answers between the protocol and query, and errors
// to status codes.
package api
