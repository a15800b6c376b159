package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
)

// FaultKind names a simulated failure.
type FaultKind string

// Fault kinds.
const (
	// FaultError refuses the call with a *engine.ToolError (code
	// simulated_error, effect not_happened); nothing is written.
	FaultError FaultKind = "error"
	// FaultErrorUnknown fails the call like a 5xx would: a *engine.ToolError
	// (code simulated_error) whose effect the tool cannot vouch for
	// (unknown); nothing is written, so a query finds nothing.
	FaultErrorUnknown FaultKind = "error_unknown"
	// FaultTimeout holds the call until its context ends and returns the
	// context's error; nothing is written. The engine sets the deadline: a
	// context that never ends holds the call forever.
	FaultTimeout FaultKind = "timeout"
	// FaultSlow waits Delay, then proceeds normally; if the context ends
	// first it returns the context's error and writes nothing.
	FaultSlow FaultKind = "slow"
	// FaultEffectThenCrash writes (and commits) the effect, then crashes.
	FaultEffectThenCrash FaultKind = "effect_then_crash"
	// FaultCrashBeforeEffect crashes before writing anything.
	FaultCrashBeforeEffect FaultKind = "crash_before_effect"
	// FaultQueryError makes Query fail; its Calls count queries, not
	// executions.
	FaultQueryError FaultKind = "query_error"
)

// Valid reports whether k is a known fault kind.
func (k FaultKind) Valid() bool {
	switch k {
	case FaultError, FaultErrorUnknown, FaultTimeout, FaultSlow, FaultEffectThenCrash, FaultCrashBeforeEffect, FaultQueryError:
		return true
	}
	return false
}

// Fault is one entry of a fault plan. Its JSON form is
// {"kind": "slow", "calls": [1, 2], "delay_ms": 200}.
type Fault struct {
	Kind FaultKind
	// Calls are the 1-based numbers of the calls the fault applies to,
	// counted per tool and dedup key in the effect store (Execute calls, or
	// Query calls for FaultQueryError), so the count survives restarts.
	// Empty means every call.
	Calls []int
	// Delay is how long FaultSlow waits; it must be positive for slow and is
	// ignored by the other kinds.
	Delay time.Duration
}

// faultJSON is Fault's wire form.
type faultJSON struct {
	Kind    FaultKind `json:"kind"`
	Calls   []int     `json:"calls,omitempty"`
	DelayMS int64     `json:"delay_ms,omitempty"`
}

// MarshalJSON implements json.Marshaler.
func (f Fault) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultJSON{Kind: f.Kind, Calls: f.Calls, DelayMS: f.Delay.Milliseconds()})
}

// maxDelayMS is the longest delay_ms a time.Duration can hold (292 years).
const maxDelayMS = math.MaxInt64 / int64(time.Millisecond)

// UnmarshalJSON implements json.Unmarshaler. Unknown fields are refused;
// the kind is checked by Validate.
func (f *Fault) UnmarshalJSON(data []byte) error {
	var w faultJSON
	if err := decodeStrict(data, &w); err != nil {
		return fmt.Errorf("fault: %w", err)
	}
	// A delay past what a time.Duration holds would wrap around to some
	// other delay, possibly a short positive one, and run another plan.
	if w.DelayMS > maxDelayMS {
		return fmt.Errorf("fault %s: delay_ms %d is more than %d", w.Kind, w.DelayMS, maxDelayMS)
	}
	*f = Fault{Kind: w.Kind, Calls: w.Calls, Delay: time.Duration(w.DelayMS) * time.Millisecond}
	return nil
}

// Validate checks one fault.
func (f Fault) Validate() error {
	if !f.Kind.Valid() {
		return fmt.Errorf("fault: unknown kind %q", f.Kind)
	}
	for _, n := range f.Calls {
		if n < 1 {
			return fmt.Errorf("fault %s: call numbers start at 1, not %d", f.Kind, n)
		}
	}
	if f.Delay < 0 {
		return fmt.Errorf("fault %s: negative delay", f.Kind)
	}
	if f.Kind == FaultSlow && f.Delay == 0 {
		return errors.New("fault slow: delay_ms is required")
	}
	return nil
}

// applies reports whether the fault applies to call number n.
func (f Fault) applies(n int) bool { return len(f.Calls) == 0 || slices.Contains(f.Calls, n) }

// ToolConfig configures one simulated tool: overrides of its descriptor and
// its fault plan. A nil override keeps the descriptor's value.
type ToolConfig struct {
	// Guarantees replaces the descriptor's guarantees as a whole (in JSON
	// all three of query, dedup and cancel are required), so the same tool
	// can run under every combination.
	Guarantees *contracts.Guarantees `json:"guarantees,omitempty"`
	// DedupRetentionMS replaces the descriptor's; 0 means no limit.
	DedupRetentionMS *int64 `json:"dedup_retention_ms,omitempty"`
	// QueryVisibilityMS replaces the descriptor's.
	QueryVisibilityMS *int64 `json:"query_visibility_ms,omitempty"`
	// TimeoutMS replaces the descriptor's call timeout, so a timeout fault
	// need not wait the real tool's seconds.
	TimeoutMS *int64 `json:"timeout_ms,omitempty"`
	// IgnoreDeadline makes the tool act as a remote service does once a
	// request has left its caller: the caller's context ending (its
	// deadline passing, a cancel) no longer stops a call once made, which
	// is recorded and applied all the same; only the call's fencing token
	// can refuse it then. A timeout fault still ends when the context does.
	IgnoreDeadline bool `json:"ignore_deadline,omitempty"`
	// Faults is the fault plan. For an Execute call the first fault (in
	// order, query_error aside) that applies to the call's number fires; for
	// a Query the first applicable query_error does.
	Faults []Fault `json:"faults,omitempty"`
	// CrashFunc is what the crash faults call. Nil means Config.CrashFunc,
	// and failing that, killing this process with SIGKILL. Tests inject a
	// function that panics with a sentinel or records the crash and
	// returns; Execute then returns ErrSimulatedCrash.
	CrashFunc func() `json:"-"`
}

// Validate checks the overrides and the fault plan.
func (c ToolConfig) Validate() error {
	if c.DedupRetentionMS != nil && *c.DedupRetentionMS < 0 {
		return errors.New("dedup_retention_ms: negative")
	}
	if c.QueryVisibilityMS != nil && *c.QueryVisibilityMS < 0 {
		return errors.New("query_visibility_ms: negative")
	}
	if c.TimeoutMS != nil && *c.TimeoutMS < 1 {
		return errors.New("timeout_ms: must be at least 1")
	}
	for i, f := range c.Faults {
		if err := f.Validate(); err != nil {
			return fmt.Errorf("faults[%d]: %w", i, err)
		}
	}
	return nil
}

// apply returns the descriptor with the config's overrides.
func (c ToolConfig) apply(d contracts.ToolDescriptor) contracts.ToolDescriptor {
	d.ArgumentsSchema = append(json.RawMessage(nil), d.ArgumentsSchema...)
	d.SecretPaths = append([]string(nil), d.SecretPaths...)
	if c.Guarantees != nil {
		d.Guarantees = *c.Guarantees
	}
	if c.DedupRetentionMS != nil {
		d.DedupRetentionMS = *c.DedupRetentionMS
	}
	if c.QueryVisibilityMS != nil {
		d.QueryVisibilityMS = *c.QueryVisibilityMS
	}
	if c.TimeoutMS != nil {
		d.TimeoutMS = *c.TimeoutMS
	}
	return d
}

// AgentConfig configures the practice-cards agent itself:
//
//	{"continue_on_tool_error": true,
//	 "policy": {"repeat_limit": 5, "consecutive_errors": 2}}
//
// The zero AgentConfig is the agent as it ships: a failed write ends the
// run (tool_error), under the engine's loop policies.
type AgentConfig struct {
	// ContinueOnToolError sets engine.Agent.ContinueOnToolError: a failed
	// cards.write goes back to the model, which proposes the same write
	// again (PracticeCardsModel) instead of ending the run. With a tool that
	// keeps failing, a loop policy ends the run: the retry is the same call,
	// so with the default repeat_limit of 2 the third proposal stops with
	// repeated_action; a larger repeat_limit leaves it to
	// consecutive_errors, or to no_progress when its window is the smaller.
	ContinueOnToolError bool `json:"continue_on_tool_error,omitempty"`
	// Policy is the agent's loop-policy thresholds (engine.Agent.Policy);
	// an absent or zero field takes the engine's. Negative ones are
	// refused.
	Policy budget.Policy `json:"policy,omitzero"`
}

// Validate refuses negative thresholds: budget would read them as its
// defaults, so a plan that meant something else would silently run another.
func (c AgentConfig) Validate() error {
	for _, f := range []struct {
		name string
		n    int
	}{{"repeat_limit", c.Policy.RepeatLimit}, {"consecutive_errors", c.Policy.ConsecutiveErrors},
		{"no_progress_window", c.Policy.NoProgressWindow}} {
		if f.n < 0 {
			return fmt.Errorf("agent: policy.%s: negative", f.name)
		}
	}
	return nil
}

// Config configures the practice-cards agent and its simulated tools, keyed
// by tool name:
//
//	{"agent": {"continue_on_tool_error": true, "policy": {"repeat_limit": 5}},
//	 "tools": {"cards.write": {
//	    "guarantees": {"query": true, "dedup": true, "cancel": false},
//	    "dedup_retention_ms": 60000, "query_visibility_ms": 500,
//	    "faults": [{"kind": "error", "calls": [1]}]}}}
//
// It is how the fault matrix hands a fault plan to a process it starts. The
// zero Config runs the agent as it ships and every tool as its descriptor
// says, without faults.
type Config struct {
	// Agent configures the agent: whether its model sees failed writes,
	// and its loop-policy thresholds.
	Agent AgentConfig           `json:"agent,omitzero"`
	Tools map[string]ToolConfig `json:"tools,omitempty"`
	// CrashFunc is the crash function of every tool whose ToolConfig sets
	// none.
	CrashFunc func() `json:"-"`
}

// knownTools returns the tools this package ships, the only names a Config
// may configure: a misspelt name would otherwise run a scenario without its
// faults and pass for the wrong reason.
func knownTools() []string { return []string{CardsWriteTool, CardsCountTool} }

// Validate checks the agent's config and every tool's, and refuses names of
// tools this package does not ship.
func (c Config) Validate() error {
	if err := c.Agent.Validate(); err != nil {
		return fmt.Errorf("simulator config: %w", err)
	}
	names := make([]string, 0, len(c.Tools))
	for name := range c.Tools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !slices.Contains(knownTools(), name) {
			return fmt.Errorf("simulator config: unknown tool %q (known: %v)", name, knownTools())
		}
		if err := c.Tools[name].Validate(); err != nil {
			return fmt.Errorf("simulator config: tool %s: %w", name, err)
		}
	}
	return nil
}

// toolConfig returns the config of one tool with the crash function
// resolved.
func (c Config) toolConfig(name string) ToolConfig {
	tc := c.Tools[name]
	if tc.CrashFunc == nil {
		tc.CrashFunc = c.CrashFunc
	}
	return tc
}

// ParseConfig decodes and validates a Config. Unknown fields, unknown fault
// kinds, unknown tool names, guarantees that do not name all of query,
// dedup and cancel, and trailing data are errors.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := decodeStrict(data, &c); err != nil {
		return Config{}, fmt.Errorf("simulator config: %w", err)
	}
	// contracts.Guarantees reads an absent field as false; a fault plan that
	// forgot one would silently run a weaker tool, so all three must be named.
	var shape struct {
		Tools map[string]struct {
			Guarantees map[string]json.RawMessage `json:"guarantees"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(data, &shape); err != nil {
		return Config{}, fmt.Errorf("simulator config: %w", err)
	}
	for name, tc := range shape.Tools {
		if tc.Guarantees == nil {
			continue
		}
		for _, k := range []string{"query", "dedup", "cancel"} {
			if _, ok := tc.Guarantees[k]; !ok {
				return Config{}, fmt.Errorf("simulator config: tool %s: guarantees.%s is required", name, k)
			}
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// decodeStrict decodes one JSON value into out, refusing unknown fields and
// trailing data.
func decodeStrict(data []byte, out any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the top-level value")
	}
	return nil
}
