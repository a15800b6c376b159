package contracts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Effect says whether a tool changes the world.
type Effect string

// Effects.
const (
	// EffectRead tools only read; rules usually let them run unattended.
	EffectRead Effect = "read"
	// EffectWrite tools change the world; they run only as approval rules
	// allow.
	EffectWrite Effect = "write"
)

// Valid reports whether e is a known effect.
func (e Effect) Valid() bool { return e == EffectRead || e == EffectWrite }

// RuleDecision is what an approval rule decides for the actions it matches.
type RuleDecision string

// Rule decisions.
const (
	// RuleDecisionAutoApprove approves the action without a person.
	RuleDecisionAutoApprove RuleDecision = "auto_approve"
	// RuleDecisionRequireApproval holds the action until a person approves
	// its exact digest, or the approval expires.
	RuleDecisionRequireApproval RuleDecision = "require_approval"
	// RuleDecisionDeny refuses the action; the run stops with policy_denied.
	RuleDecisionDeny RuleDecision = "deny"
)

// Valid reports whether d is a known decision.
func (d RuleDecision) Valid() bool {
	switch d {
	case RuleDecisionAutoApprove, RuleDecisionRequireApproval, RuleDecisionDeny:
		return true
	}
	return false
}

// Wildcard in Rule.Tool or Rule.Tenant matches any tool or tenant.
const Wildcard = "*"

// RunSubmission is the body of POST /v1/runs (schema run_submission). The
// server owns everything else about a run; a body that tries to set it is
// refused.
type RunSubmission struct {
	// SchemaVersion is DefaultVersion after parsing when the body had none.
	SchemaVersion string `json:"schema_version,omitempty"`
	// Agent names an agent registered in the server, e.g. "practice-cards".
	Agent string `json:"agent"`
	// Input is the agent's input object, as submitted.
	Input json.RawMessage `json:"input"`
	// Budgets are optional limits; nil takes the server's defaults.
	Budgets *Budgets `json:"budgets,omitempty"`
}

// Budgets are a run's limits. A zero field is not set and takes the
// server's default; the schema refuses zero and negative values, so a set
// field is at least 1.
type Budgets struct {
	// MaxAttemptsPerAction counts execution attempts of one action, the
	// first included.
	MaxAttemptsPerAction int64 `json:"max_attempts_per_action,omitempty"`
	// MaxAttemptsPerRun counts execution attempts across the run.
	MaxAttemptsPerRun int64 `json:"max_attempts_per_run,omitempty"`
	// MaxExecutionMS caps the run's execution time: the sum of attempt and
	// model-step durations.
	MaxExecutionMS int64 `json:"max_execution_ms,omitempty"`
	// DeadlineMS is a wall-clock deadline counted from submission.
	DeadlineMS int64 `json:"deadline_ms,omitempty"`
	// MaxSteps caps model steps.
	MaxSteps int64 `json:"max_steps,omitempty"`
	// MaxTokens caps model tokens across the run.
	MaxTokens int64 `json:"max_tokens,omitempty"`
}

// MaxExecution returns MaxExecutionMS as a duration; 0 means not set. It is
// safe on a nil *Budgets.
func (b *Budgets) MaxExecution() time.Duration {
	if b == nil {
		return 0
	}
	return msDuration(b.MaxExecutionMS)
}

// Deadline returns DeadlineMS as a duration after submission; 0 means not
// set. It is safe on a nil *Budgets.
func (b *Budgets) Deadline() time.Duration {
	if b == nil {
		return 0
	}
	return msDuration(b.DeadlineMS)
}

// ToolDescriptor describes a tool (schema tool_descriptor): its identity,
// arguments, effect, timeout and the guarantees recovery relies on.
type ToolDescriptor struct {
	// SchemaVersion is required in a descriptor.
	SchemaVersion string `json:"schema_version"`
	// Name is dotted, e.g. "cards.write".
	Name string `json:"name"`
	// Version is part of every action digest: a new version needs new
	// approvals.
	Version string `json:"version"`
	// Effect is read or write.
	Effect Effect `json:"effect"`
	// ArgumentsSchema is a self-contained JSON Schema (draft 2020-12) for
	// the arguments object. Use ArgumentValidator to check arguments.
	ArgumentsSchema json.RawMessage `json:"arguments_schema"`
	// Guarantees are what the tool promises about repeated and interrupted
	// calls.
	Guarantees Guarantees `json:"guarantees"`
	// SecretPaths are JSON Pointers into the arguments whose values are
	// redacted in timelines and evidence.
	SecretPaths []string `json:"secret_paths,omitempty"`
	// TimeoutMS bounds one call.
	TimeoutMS int64 `json:"timeout_ms"`
	// DedupRetentionMS is how long the tool honours a dedup key; 0 means the
	// tool declares no limit.
	DedupRetentionMS int64 `json:"dedup_retention_ms,omitempty"`
	// QueryVisibilityMS is how long after a call a query may still miss it;
	// absent means 0.
	QueryVisibilityMS int64 `json:"query_visibility_ms,omitempty"`
	// Description is free text for people.
	Description string `json:"description,omitempty"`
}

// Guarantees are what a tool promises, keyed by the dedup key it receives.
// Recovery chooses continue, reconcile, stop or review from them.
type Guarantees struct {
	// Query: the tool can say whether the call with a dedup key took effect.
	Query bool `json:"query"`
	// Dedup: the tool applies a call at most once per dedup key.
	Dedup bool `json:"dedup"`
	// Cancel: the tool can cancel a call by its dedup key and confirm it.
	Cancel bool `json:"cancel"`
}

// Timeout returns TimeoutMS as a duration.
func (d *ToolDescriptor) Timeout() time.Duration { return msDuration(d.TimeoutMS) }

// DedupRetention returns DedupRetentionMS as a duration; 0 means the tool
// declares no limit.
func (d *ToolDescriptor) DedupRetention() time.Duration { return msDuration(d.DedupRetentionMS) }

// QueryVisibility returns QueryVisibilityMS as a duration.
func (d *ToolDescriptor) QueryVisibility() time.Duration { return msDuration(d.QueryVisibilityMS) }

// Rules are approval rules (schema rules). They are evaluated in order and
// the first matching rule wins; what happens when none matches is the
// evaluator's decision (package approval), not this package's.
type Rules struct {
	// SchemaVersion is required in a rules file.
	SchemaVersion string `json:"schema_version"`
	// Rules in evaluation order.
	Rules []Rule `json:"rules"`
}

// Rule matches actions by tool, tenant and effect and decides what happens
// to them. A rule matches when Tool is the action's tool or Wildcard, Tenant
// is empty, Wildcard or the run's tenant, and Effect is empty or the
// action's effect.
type Rule struct {
	// Tool is a tool name or Wildcard.
	Tool string `json:"tool"`
	// Tenant is a tenant, Wildcard, or empty for any tenant.
	Tenant string `json:"tenant,omitempty"`
	// Effect is empty for any effect.
	Effect Effect `json:"effect,omitempty"`
	// Decision is what happens to a matching action.
	Decision RuleDecision `json:"decision"`
	// ApprovalTTLMS is how long a pending approval stays open; 0 takes the
	// server's default. Only with RuleDecisionRequireApproval.
	ApprovalTTLMS int64 `json:"approval_ttl_ms,omitempty"`
	// AllowSelfApproval lets the run's submitter approve its actions. Only
	// with RuleDecisionRequireApproval.
	AllowSelfApproval bool `json:"allow_self_approval,omitempty"`
	// AllowSelfConfirmation lets an MCP client's answer to a form
	// elicitation grant the action, recorded as self_confirmation. Only
	// with RuleDecisionRequireApproval.
	AllowSelfConfirmation bool `json:"allow_self_confirmation,omitempty"`
	// ExecuteWithinMS is how long a granted approval covers a begin (its
	// execute_by is the grant's time plus this); 0 takes the server's
	// default. Only with RuleDecisionRequireApproval.
	ExecuteWithinMS int64 `json:"execute_within_ms,omitempty"`
}

// ApprovalTTL returns ApprovalTTLMS as a duration; 0 means not set.
func (r Rule) ApprovalTTL() time.Duration { return msDuration(r.ApprovalTTLMS) }

// ExecuteWithin returns ExecuteWithinMS as a duration; 0 means not set.
func (r Rule) ExecuteWithin() time.Duration { return msDuration(r.ExecuteWithinMS) }

// ParseRunSubmission validates data against SchemaRunSubmission and decodes
// it. An absent schema_version becomes DefaultVersion. Errors match
// ErrInvalid or ErrUnsupportedVersion.
func ParseRunSubmission(data []byte) (*RunSubmission, error) {
	var s RunSubmission
	if err := parse(SchemaRunSubmission, data, &s); err != nil {
		return nil, err
	}
	if s.SchemaVersion == "" {
		s.SchemaVersion = DefaultVersion
	}
	return &s, nil
}

// ParseToolDescriptor validates data against SchemaToolDescriptor, decodes
// it and compiles its arguments schema, so that a descriptor whose
// arguments can never be checked is refused when it is loaded. Errors match
// ErrInvalid or ErrUnsupportedVersion.
func ParseToolDescriptor(data []byte) (*ToolDescriptor, error) {
	var d ToolDescriptor
	if err := parse(SchemaToolDescriptor, data, &d); err != nil {
		return nil, err
	}
	if _, err := d.ArgumentValidator(); err != nil {
		return nil, err
	}
	return &d, nil
}

// ParseRules validates data against SchemaRules and decodes it. Errors
// match ErrInvalid or ErrUnsupportedVersion.
func ParseRules(data []byte) (*Rules, error) {
	var r Rules
	if err := parse(SchemaRules, data, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// parse validates data and decodes it into out, refusing unknown fields a
// second time so that a Go type drifting from its schema shows up at once:
// a decoding error after validation passed is this package's bug, and is
// not reported as ErrInvalid.
func parse(schema Schema, data []byte, out any) error {
	if err := Validate(schema, data); err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(out); err != nil {
		return fmt.Errorf("contracts: decode %s: %w", schema, err)
	}
	return nil
}

// msDuration converts milliseconds to a duration. The schemas cap durations
// at ten years, far below where time.Duration overflows.
func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
