package httptool

import "encoding/json"

// The wire contract of an http tool (docs/http-tools.md). Field names are
// snake_case; an answer with a field not listed here is not a valid answer.

// Headers the ledger sends with a call, beside Authorization and
// Content-Type.
const (
	// HeaderIdempotencyKey carries the call's dedup key, for a service that
	// deduplicates by the usual header.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderFencingToken carries the call's fencing token, when it has one
	// (greater than 0).
	HeaderFencingToken = "Ledger-Fencing-Token"
)

// CallRequest is the body POSTed to a tool's url for one call.
type CallRequest struct {
	// Tool and ToolVersion name the tool as its descriptor does, for an
	// endpoint that serves several.
	Tool        string `json:"tool"`
	ToolVersion string `json:"tool_version"`
	// Arguments are the action's canonical, approved arguments: exactly
	// what a person approved, never changed.
	Arguments json.RawMessage `json:"arguments"`
	// DedupKey is the same for every attempt of the action
	// (<run_id>/<action_id>): a tool that dedups runs the effect at most
	// once per key.
	DedupKey string `json:"dedup_key"`
	// FencingToken is the run lease's token; a tool that keeps the highest
	// it has seen for RunID refuses a write with a lower one. 0: the call
	// was made under no lease and cannot be fenced.
	FencingToken int64  `json:"fencing_token"`
	RunID        string `json:"run_id"`
	ActionID     string `json:"action_id"`
	// AttemptID and Attempt (its number, from 1) name the attempt the call
	// is made for, recorded before the call.
	AttemptID string `json:"attempt_id"`
	Attempt   int64  `json:"attempt"`
}

// Statuses of an answer.
const (
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
)

// CallAnswer is a tool's answer to a call.
type CallAnswer struct {
	// Status is succeeded or failed; required.
	Status string `json:"status"`
	// Effect is happened, not_happened or unknown. Absent: happened for a
	// write that succeeded, unknown for one that failed. A read tool's
	// calls never take effect, whatever it says.
	Effect string `json:"effect,omitempty"`
	// Output is any JSON; what the ledger keeps (redacted) and the model
	// sees.
	Output json.RawMessage `json:"output,omitempty"`
	// Error says why a call failed: only with status failed.
	Error *AnswerError `json:"error,omitempty"`
}

// AnswerError is a failed call's error.
type AnswerError struct {
	// Code is a stable, short name for the failure, such as fenced.
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// KeyRequest is the body POSTed to query_url and cancel_url.
type KeyRequest struct {
	DedupKey string `json:"dedup_key"`
}

// QueryAnswer is a tool's answer at query_url: what it knows of the
// dedup key's call.
type QueryAnswer struct {
	// Effect is happened, not_happened or unknown; required.
	Effect string `json:"effect"`
	// Output is the call's output when it happened, if the tool has it.
	Output json.RawMessage `json:"output,omitempty"`
}

// CancelAnswer is a tool's answer at cancel_url.
type CancelAnswer struct {
	// Confirmed is true only when the call will not take effect (or was
	// undone); required.
	Confirmed *bool `json:"confirmed"`
	// Detail is any JSON, kept as evidence.
	Detail json.RawMessage `json:"detail,omitempty"`
}
