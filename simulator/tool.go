package simulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// Tool error codes the simulator returns in *engine.ToolError.
const (
	// CodeSimulatedError: an error fault refused the call (effect
	// not_happened).
	CodeSimulatedError = "simulated_error"
	// CodeSimulatedQueryError: a query_error fault failed a Query (effect
	// unknown).
	CodeSimulatedQueryError = "simulated_query_error"
	// CodeCancelled: the dedup key was cancelled before the call could take
	// effect (effect not_happened).
	CodeCancelled = "cancelled"
	// CodeInvalidArguments: the arguments are not a JSON object the
	// simulator can digest (effect not_happened).
	CodeInvalidArguments = "invalid_arguments"
	// CodeFenced: a write carried a fencing token older than one the
	// effect store had already seen for its run: it comes from a process
	// that lost the run to another, and nothing was done (effect
	// not_happened).
	CodeFenced = "fenced"
)

// ErrSimulatedCrash is returned by Execute when a crash fault fired and the
// crash function returned instead of ending the process (tests inject such
// functions). The effect is as the fault says: written for
// effect_then_crash, not for crash_before_effect.
var ErrSimulatedCrash = errors.New("simulator: simulated crash")

// Tool simulates a tool described by a descriptor, keeping its effects in an
// EffectStore and misbehaving as its fault plan says.
//
// Tool implements engine.Tool, engine.Querier and engine.Canceller whatever
// its guarantees, so one type serves every combination; what the engine may
// use is decided by the descriptor's guarantees, never by interface
// presence. To keep an engine honest, Query fails with
// errors.ErrUnsupported when the descriptor declares no query guarantee, and
// Cancel when it declares no cancel guarantee; without dedup, Execute writes
// a new effect on every call.
//
// Arguments are not checked against the descriptor's schema: that is the
// engine's job before an action is recorded. Execute only needs a JSON
// object (it digests it, counts a "cards" array and keeps a "title").
type Tool struct {
	desc   contracts.ToolDescriptor
	store  *EffectStore
	faults []Fault
	crash  func()
	// ignoreDeadline is ToolConfig.IgnoreDeadline.
	ignoreDeadline bool
}

var (
	_ engine.Tool      = (*Tool)(nil)
	_ engine.Querier   = (*Tool)(nil)
	_ engine.Canceller = (*Tool)(nil)
)

// NewTool returns a tool for desc whose effects go to store. cfg's
// overrides replace the descriptor's guarantees, dedup retention and query
// visibility. A cfg that fails Validate is a programming error and panics:
// configs from files come through ParseConfig, which validates them.
//
// Crash faults end the process (SIGKILL) unless cfg.CrashFunc says
// otherwise; they exist only where whoever starts the process configured a
// fault plan.
func NewTool(desc contracts.ToolDescriptor, store *EffectStore, cfg ToolConfig) *Tool {
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("simulator: tool %s: %v", desc.Name, err))
	}
	crash := cfg.CrashFunc
	if crash == nil {
		crash = killProcess
	}
	return &Tool{
		desc:   cfg.apply(desc),
		store:  store,
		faults: append([]Fault(nil), cfg.Faults...),
		crash:  crash,

		ignoreDeadline: cfg.IgnoreDeadline,
	}
}

// killProcess ends this process with SIGKILL (on Unix; os.Process.Kill
// elsewhere), the way the fault matrix's crashes are meant to happen: no
// deferred function, no flush, no last write. Once the signal is sent it
// never returns, so no code of the caller runs in the meantime; only if the
// signal cannot be sent does it return, and Execute reports
// ErrSimulatedCrash.
func killProcess() {
	p, err := os.FindProcess(os.Getpid())
	if err != nil {
		return
	}
	if err := p.Kill(); err != nil {
		return
	}
	select {}
}

// Descriptor implements engine.Tool: the descriptor with the config's
// overrides applied.
func (t *Tool) Descriptor() contracts.ToolDescriptor {
	d := t.desc
	d.ArgumentsSchema = append(json.RawMessage(nil), d.ArgumentsSchema...)
	d.SecretPaths = append([]string(nil), d.SecretPaths...)
	return d
}

// Execute implements engine.Tool. Every call is recorded in the effect
// store before anything else, with its fencing token, and numbered per
// dedup key for the fault plan; recording it raises its run's fence to its
// token (engine.Call.FencingToken) if that is higher. Then:
//
//   - a read tool answers {"count": N, "title": …}, the number of effects
//     whose output carries the arguments' title (all effects without one),
//     with effect not_happened, and records no effect;
//   - a write tool, in one IMMEDIATE transaction, refuses a call whose
//     token is lower than its run's fence, a later holder's
//     (*engine.ToolError fenced, not_happened: the store's fences table
//     keeps the fence, so it holds across restarts); refuses a cancelled dedup
//     key (*engine.ToolError cancelled, not_happened); with dedup, returns
//     the output of the dedup key's latest effect if it is within the dedup
//     retention (no limit when unset), writing nothing; otherwise writes an
//     effect and answers {"effect_seq": S, "title": …, "written": N}, N
//     being the number of cards (1 without a cards array), effect happened.
//
// A write tool makes no effect once its caller's deadline has passed (or
// its context ended): checked when the effect's transaction holds the
// write lock, so a caller that gave up, or a process resumed after a pause
// past its deadline, never acts after the engine stopped waiting for it;
// the call is recorded aborted and the context's error returned. Unless
// the config says IgnoreDeadline: then only the fence refuses a late call.
//
// Faults may intervene as their kinds say. Errors are a *engine.ToolError
// with the effect the simulator knows of, the context's error (timeout and
// slow faults, or a context ending mid-write), ErrSimulatedCrash, or a
// store error (effect unknown).
func (t *Tool) Execute(ctx context.Context, c engine.Call) (engine.Result, error) {
	name := t.desc.Name
	caller := ctx
	if t.ignoreDeadline {
		ctx = context.WithoutCancel(ctx)
	}
	f := fence{Run: string(c.RunID), Token: c.FencingToken}
	seq, n, err := t.store.recordCall(ctx, name, c.DedupKey, c.Attempt, f)
	if err != nil {
		return engine.Result{}, fmt.Errorf("%s: %w", name, err)
	}
	args, err := parseArguments(c.Arguments)
	if err != nil {
		if err := t.store.setCallOutcome(ctx, seq, CallInvalidArguments); err != nil {
			return engine.Result{}, fmt.Errorf("%s: %w", name, err)
		}
		return engine.Result{}, &engine.ToolError{Code: CodeInvalidArguments, Message: err.Error(), Effect: ledger.EffectNotHappened}
	}

	fault := t.executeFault(n)
	switch fault.Kind {
	case FaultError, FaultErrorUnknown:
		if err := t.store.setCallOutcome(ctx, seq, CallSimulatedError); err != nil {
			return engine.Result{}, fmt.Errorf("%s: %w", name, err)
		}
		effect := ledger.EffectNotHappened
		if fault.Kind == FaultErrorUnknown {
			effect = ledger.EffectUnknown
		}
		return engine.Result{}, &engine.ToolError{
			Code:    CodeSimulatedError,
			Message: fmt.Sprintf("simulated error on call %d of %s", n, c.DedupKey),
			Effect:  effect,
		}
	case FaultTimeout:
		<-caller.Done()
		return engine.Result{}, t.abort(caller, seq, CallTimedOut)
	case FaultSlow:
		timer := time.NewTimer(fault.Delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return engine.Result{}, t.abort(ctx, seq, CallAborted)
		}
	case FaultCrashBeforeEffect:
		if err := t.store.setCallOutcome(ctx, seq, CallCrashedBeforeEffect); err != nil {
			return engine.Result{}, fmt.Errorf("%s: %w", name, err)
		}
		t.crash()
		return engine.Result{}, fmt.Errorf("%s: before the effect: %w", name, ErrSimulatedCrash)
	}
	crashAfter := fault.Kind == FaultEffectThenCrash

	if t.desc.Effect == contracts.EffectRead {
		return t.read(ctx, seq, args, crashAfter)
	}
	newOutcome, dedupOutcome := CallEffect, CallDeduplicated
	if crashAfter {
		newOutcome, dedupOutcome = CallCrashedAfterEffect, CallCrashedAfterEffect
	}
	res, err := t.store.write(ctx, writeParams{
		CallSeq:         seq,
		Tool:            name,
		DedupKey:        c.DedupKey,
		Fence:           f,
		ArgumentsDigest: args.digest,
		Dedup:           t.desc.Guarantees.Dedup,
		Retention:       t.desc.DedupRetention(),
		Output: func(effectSeq int64) (json.RawMessage, error) {
			return json.Marshal(writeOutput{EffectSeq: effectSeq, Title: args.title, Written: args.written})
		},
		NewOutcome:   newOutcome,
		DedupOutcome: dedupOutcome,
	})
	if err != nil {
		if expired(ctx) {
			return engine.Result{}, errors.Join(t.abort(ctx, seq, CallAborted), fmt.Errorf("%s: %w", name, err))
		}
		return engine.Result{}, fmt.Errorf("%s: %w", name, err)
	}
	if res.Fenced {
		return engine.Result{}, &engine.ToolError{
			Code: CodeFenced,
			Message: fmt.Sprintf("fenced: stale fencing token %d for run %s, which a later holder's token %d has superseded; nothing was done",
				c.FencingToken, c.RunID, res.SeenToken),
			Effect: ledger.EffectNotHappened,
		}
	}
	if res.Expired {
		return engine.Result{}, t.abort(ctx, seq, CallAborted)
	}
	if res.Cancelled {
		return engine.Result{}, &engine.ToolError{
			Code:    CodeCancelled,
			Message: "dedup key " + c.DedupKey + " was cancelled before the call took effect",
			Effect:  ledger.EffectNotHappened,
		}
	}
	if crashAfter {
		t.crash()
		return engine.Result{}, fmt.Errorf("%s: after the effect: %w", name, ErrSimulatedCrash)
	}
	return engine.Result{Output: res.Output, Effect: ledger.EffectHappened}, nil
}

// read answers a read tool's call.
func (t *Tool) read(ctx context.Context, seq int64, args arguments, crashAfter bool) (engine.Result, error) {
	name := t.desc.Name
	count, err := t.store.countByTitle(ctx, args.title)
	if err != nil {
		return engine.Result{}, fmt.Errorf("%s: %w", name, err)
	}
	out, err := json.Marshal(readOutput{Count: count, Title: args.title})
	if err != nil {
		return engine.Result{}, fmt.Errorf("%s: %w", name, err)
	}
	outcome := CallRead
	if crashAfter {
		outcome = CallCrashedAfterEffect
	}
	if err := t.store.setCallOutcome(ctx, seq, outcome); err != nil {
		return engine.Result{}, fmt.Errorf("%s: %w", name, err)
	}
	if crashAfter {
		t.crash()
		return engine.Result{}, fmt.Errorf("%s: after answering: %w", name, ErrSimulatedCrash)
	}
	return engine.Result{Output: out, Effect: ledger.EffectNotHappened}, nil
}

// abort records a call the context ended before it acted and returns the
// context's error (DeadlineExceeded for a context past its deadline whose
// timer has not fired yet). The record is written without the ended
// context.
func (t *Tool) abort(ctx context.Context, seq int64, outcome CallOutcome) error {
	cause := ctx.Err()
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	if err := t.store.setCallOutcome(context.WithoutCancel(ctx), seq, outcome); err != nil {
		return errors.Join(cause, fmt.Errorf("%s: %w", t.desc.Name, err))
	}
	return cause
}

// executeFault returns the fault for Execute call number n; the zero Fault
// when none applies.
func (t *Tool) executeFault(n int) Fault {
	for _, f := range t.faults {
		if f.Kind != FaultQueryError && f.applies(n) {
			return f
		}
	}
	return Fault{}
}

// queryFails reports whether a query_error fault applies to query number n.
func (t *Tool) queryFails(n int) bool {
	for _, f := range t.faults {
		if f.Kind == FaultQueryError && f.applies(n) {
			return true
		}
	}
	return false
}

// Query implements engine.Querier. It answers happened, with the effect's
// output, when an effect of the dedup key exists that is at least the
// descriptor's query visibility old by the store's clock; a younger effect
// is not yet visible and the answer is not_happened, as an eventually
// consistent tool would give. Every query is recorded and numbered per
// dedup key for query_error faults, which fail it with a *engine.ToolError
// (code simulated_query_error, effect unknown). A tool without the query
// guarantee fails with errors.ErrUnsupported.
func (t *Tool) Query(ctx context.Context, dedupKey string) (engine.QueryResult, error) {
	name := t.desc.Name
	if !t.desc.Guarantees.Query {
		return engine.QueryResult{Effect: ledger.EffectUnknown},
			fmt.Errorf("%s declares no query guarantee: %w", name, errors.ErrUnsupported)
	}
	res, err := t.store.query(ctx, queryParams{
		Tool:       name,
		DedupKey:   dedupKey,
		Visibility: t.desc.QueryVisibility(),
		Fail:       t.queryFails,
	})
	if err != nil {
		return engine.QueryResult{Effect: ledger.EffectUnknown}, fmt.Errorf("%s: %w", name, err)
	}
	switch res.Outcome {
	case QueryError:
		return engine.QueryResult{Effect: ledger.EffectUnknown}, &engine.ToolError{
			Code:    CodeSimulatedQueryError,
			Message: "simulated query error for " + dedupKey,
			Effect:  ledger.EffectUnknown,
		}
	case QueryHappened:
		return engine.QueryResult{Effect: ledger.EffectHappened, Output: res.Output}, nil
	default:
		return engine.QueryResult{Effect: ledger.EffectNotHappened}, nil
	}
}

// Cancel implements engine.Canceller. In one transaction: if an effect of
// the dedup key exists the cancel is not confirmed (the simulator undoes
// nothing); otherwise a tombstone is written that refuses every call of the
// key in flight at this moment (a call started later, such as a retry under
// the same approval, proceeds), and the cancel is confirmed. Cancelling twice
// confirms twice. A tool without the cancel guarantee fails with
// errors.ErrUnsupported.
func (t *Tool) Cancel(ctx context.Context, dedupKey string) (engine.CancelResult, error) {
	name := t.desc.Name
	if !t.desc.Guarantees.Cancel {
		return engine.CancelResult{}, fmt.Errorf("%s declares no cancel guarantee: %w", name, errors.ErrUnsupported)
	}
	res, err := t.store.cancel(ctx, dedupKey)
	if err != nil {
		return engine.CancelResult{}, fmt.Errorf("%s: %w", name, err)
	}
	detail, err := json.Marshal(cancelDetail{DedupKey: dedupKey, Cancelled: res.Confirmed, EffectSeq: res.EffectSeq})
	if err != nil {
		return engine.CancelResult{}, fmt.Errorf("%s: %w", name, err)
	}
	return engine.CancelResult{Confirmed: res.Confirmed, Detail: detail}, nil
}

// writeOutput is a write tool's output, stored with its effect.
type writeOutput struct {
	EffectSeq int64  `json:"effect_seq"`
	Title     string `json:"title,omitempty"`
	Written   int    `json:"written"`
}

// readOutput is a read tool's output.
type readOutput struct {
	Count int    `json:"count"`
	Title string `json:"title,omitempty"`
}

// cancelDetail is Cancel's detail.
type cancelDetail struct {
	DedupKey  string `json:"dedup_key"`
	Cancelled bool   `json:"cancelled"`
	EffectSeq int64  `json:"effect_seq,omitempty"`
}

// arguments is what the simulator reads of a call's arguments.
type arguments struct {
	digest  ledger.Digest
	title   string
	written int
}

// parseArguments digests the arguments (refusing what the ledger refuses:
// invalid JSON, duplicate keys, deep nesting) and reads their title and
// number of cards.
func parseArguments(raw json.RawMessage) (arguments, error) {
	digest, err := ledger.DigestJSON(raw)
	if err != nil {
		return arguments{}, fmt.Errorf("arguments: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return arguments{}, errors.New("arguments: not a JSON object")
	}
	a := arguments{digest: digest, written: 1}
	var title string
	if json.Unmarshal(fields["title"], &title) == nil {
		a.title = title
	}
	var cards []json.RawMessage
	if json.Unmarshal(fields["cards"], &cards) == nil && cards != nil {
		a.written = len(cards)
	}
	return a, nil
}
