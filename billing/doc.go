// Package billing owns the arithmetic of what GPU time costs and who pays for
// it (ARCHITECTURE "GPU time and cost", "Money and prices"):
//
//   - Money: exact integer nano-units (1e-9) of one currency, written as
//     decimal strings, never float64.
//   - The price book: effective-dated GPU prices per hour (by GPU type, pool
//     and region, most specific entry wins) and token list prices per model,
//     its JSON file format (meterd --prices), validation, a canonical encoding
//     and a content hash (Version) that every cost row records.
//   - The GPU cost of one deployment-hour from its GPU samples: GPU-, busy-
//     and idle GPU-seconds, cost split into busy and idle cost, MIG slices at
//     their fraction of the card, price changes inside the hour, and unpriced
//     GPU-seconds reported apart rather than priced at zero.
//   - The allocation of a deployment-hour's cost to tenants by a busy policy
//     (tokens, weighted_tokens, request_time) and an idle policy (separate,
//     shared_weighted, shared_even), rounded by largest remainder so that the
//     lines add up to the GPU cost exactly. BusyPolicies and IdlePolicies
//     are the single list of policies, and IdleTenant the one name of the
//     idle line: the rollup job, the API, internal/adapter/chstore's cost_hour
//     columns (held equal by a test) and meterctl follow them.
//   - Billing periods (period.go): calendar months of a tenant's time zone
//     (UTC, a fixed offset such as +05:30, or an IANA zone), exact to the
//     instant, and the rule for closing one (ended, a grace delay passed,
//     ingest caught up past its end).
//   - Derived figures: cost per 1k tokens, tokens per GPU-hour, list-price
//     charges from token prices.
//
// Everything here is pure and deterministic: the same input gives the same
// output whatever the order of samples and tenants, and no function reads a
// clock, a file or a database.
//
// It does not read samples or usage from ClickHouse, write cost rows, or store
// price books (internal/adapter/chstore and the rollup job do), and it does not serve
// anything (package api does).
//
// # Price book file
//
// A price book is a JSON object; money and weights are JSON strings holding a
// decimal with at most 9 decimals (JSON numbers are rejected, so no client
// can round-trip a price through a float); times are RFC 3339.
//
//	{
//	  "currency": "USD",
//	  "gpu_prices": [
//	    {"gpu_type": "H100-SXM-80GB", "pool": "on-demand", "region": "us-east-1",
//	     "effective_from": "2026-01-01T00:00:00Z", "per_hour": "4.10"},
//	    {"gpu_type": "H100-SXM-80GB", "effective_from": "2026-01-01T00:00:00Z", "per_hour": "3.50"}
//	  ],
//	  "token_prices": [
//	    {"model": "llama-3.1-70b", "effective_from": "2026-01-01T00:00:00Z",
//	     "input_per_1m": "0.60", "cached_input_per_1m": "0.30", "output_per_1m": "1.80"}
//	  ],
//	  "allocation": {
//	    "busy_policy": "tokens", "idle_policy": "separate",
//	    "weighted_tokens": {"input_weight": "1", "cached_input_weight": "1", "output_weight": "3"}
//	  }
//	}
//
// Fields:
//
//   - currency: ISO 4217 code, three upper-case letters; default "USD". All
//     money of the book is in it.
//   - gpu_prices[]: gpu_type (required, matched exactly, e.g. the DCGM model
//     name), pool and region (optional; empty or absent = any),
//     effective_from (required), per_hour (required, ≥ 0: the price of one
//     whole GPU for one hour; a MIG slice pays its fraction).
//   - token_prices[]: model (required), effective_from (required),
//     input_per_1m and output_per_1m (required, ≥ 0), cached_input_per_1m
//     (optional, ≥ 0; default input_per_1m).
//   - allocation (optional): busy_policy (tokens | weighted_tokens |
//     request_time; default tokens), idle_policy (separate | shared_weighted |
//     shared_even; default separate), weighted_tokens weights (≥ 0;
//     input_weight default 1, output_weight default 1, cached_input_weight
//     default input_weight; input and output weights may not both be 0).
//
// Unknown fields are errors (a misspelt field must not be ignored silently).
// Two entries with the same key and the same effective_from are an error. A
// price has no end: it is in force until an entry of the same key with a
// later effective_from, or a more specific matching entry, takes over.
//
// # Lookup
//
// A GPU price entry matches (gpu_type, pool, region) when its gpu_type is
// equal and its pool and region are empty or equal. Among the matching entries
// in force (effective_from ≤ the time), the most specific wins — pool and
// region both set, then pool only, then region only, then neither — and among
// those the latest effective_from. A token price is the model's entry with the
// latest effective_from ≤ the time.
//
// Every entry has a stable id that names its key and start, e.g.
// "gpu:H100-SXM-80GB|on-demand|us-east-1@2026-01-01T00:00:00Z" (a wildcard
// shows as "*") or "token:llama-3.1-70b@2026-01-01T00:00:00Z"; together with
// the book's Version it says exactly which number produced a cost.
package billing
