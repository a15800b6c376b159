// Package server is the HTTP API v1 of docs/api.md on Echo:
// routing, bearer-token authentication with roles, tenant checks on every
// object read, problem+json errors from one code→status table, and the
// Idempotency-Key semantics of submit. It is the only package that imports
// Echo; it sits on top of engine, approval, recovery and ledger, and holds
// no goroutines of its own.
//
// Build a Server with New and serve Handler. The wire types (api.go,
// catalog.go) are the contract with clients and the source of
// openapi.json's component schemas (`go generate ./server`,
// internal/openapigen); the document's paths are written by hand, and a
// test holds them and the router equal. A run's budget goes out in
// milliseconds, as submissions give it (Budget).
//
// # Authentication and roles
//
// Tokens come from a tokens file holding only SHA-256 hashes (LoadTokens);
// a request's bearer token is hashed and looked up, and never logged.
// Missing, malformed and unknown tokens are 401 with WWW-Authenticate.
// With no tokens (Config.Tokens nil) the server is in dev mode: every
// request is principal dev in tenant default with every role. The caller
// (ledger serve) must bind to loopback and log loudly that it does so; the
// server also refuses clients whose address is not loopback (403), in case
// it did not. Relaxing separation of duties in dev mode is the caller's
// choice, made when it builds the approval service.
//
// Roles, in detail:
//   - submitter: POST /v1/runs; reads its own runs, their actions and
//     timelines; cancels its own runs. It sees nothing else: another
//     principal's run is 404 to it, as an unknown one is.
//   - approver: reads the tenant's runs, actions and approvals; approves,
//     denies and resolves. Timelines and evidence are for auditors.
//   - auditor: reads everything of the tenant, timelines and evidence
//     included; writes nothing.
//   - admin: all of the above, and cancels any run of the tenant.
//
// A role check runs before any object is loaded, so a 403 says nothing
// about ids; an object of another tenant is 404, never 403.
//
// # Requests
//
// Bodies must be application/json (a UTF-8 charset parameter is allowed;
// 415), at most Config.MaxBodyBytes (413), well-formed JSON without
// duplicate keys or nesting deeper than 32 (400 invalid_json), and match
// their schema (400 schema_violation, with the failing locations): the
// contracts run_submission schema for submit, strict decoding (unknown
// fields refused) for the others. Cancel's body is optional.
//
// Submit answers 201 with facts fixed at acceptance only, so a replay of
// the same (tenant, key, body) gets the same bytes with
// Idempotent-Replayed: true. deadline_ms enters the request as a relative
// duration (ledger.BudgetLimits.DeadlineAfter); the store fixes the
// absolute deadline at creation, so replays keep their digest. While a
// (tenant, key) is being processed by this server, the same key is 409
// request_in_progress with Retry-After: 1; across processes the store alone
// guarantees one run per key.
//
// # Request ids, HEAD and rate limits
//
// Every answer carries X-Request-ID: the client's, when it sent one sane
// value (1 to 128 letters, digits and - . _ ~ : @ + = /), else req_ and a
// ULID. Every log line of the request names it (request_id), and a problem
// shows it as its instance, urn:request:<id>. The request log line gives
// the duration as duration_ms.
//
// Every GET route answers HEAD with the status and headers GET would give
// (Content-Length included) and no body; the served document has a HEAD
// operation for each GET.
//
// With Config.RateLimit, each identity has a token bucket on the
// authenticated routes, and each client address one for its answers of
// 401 (IPv6 by /64; the connection's address, never a forwarded header).
// Over either, the answer is 429 rate_limited with Retry-After in seconds;
// an address over its 401s is refused before its token is looked at, even
// a good one, so that guessing gains nothing from speed.
//
// # Redaction
//
// Every argument and event datum the API shows passes through a Redactor.
// The default, SecretPathRedactor, replaces the values at a tool's
// secret_paths with "[redacted]" and hides the arguments of tools it does
// not know as a whole; the evidence work plugs a keyed-HMAC redactor in
// through Config.Redactor.
//
// # Metrics
//
// /metrics serves Config.Registry without authentication (see Metrics):
// request counts and durations by route template (never raw paths);
// store gauges counted at scrape time by state (ledger_runs,
// ledger_actions, ledger_approvals, ledger_approvals_waiting,
// ledger_attempts); group-commit duration and batch size and tool-call
// duration by tool and outcome, fed by the ledger's and the engine's hooks
// (Metrics.ObserveCommit, ObserveToolCall); approval decision latency
// (requested_at to decided_at, by decision); submit replays and key
// conflicts; 429s by scope; ledger_build_info{version, goversion}; and
// ledger_recovery_decisions_total, every decision shown from 0. The gauges
// count tenants together; keep /metrics on an operator's network.
package server
