// Package server is the HTTP API v1 of DESIGN.md section 6 on Echo:
// routing, bearer-token authentication with roles, tenant checks on every
// object read, problem+json errors from one code→status table, and the
// Idempotency-Key semantics of submit. It is the only package that imports
// Echo; it sits on top of engine, approval, recovery and ledger.
package server
