package engine

import (
	"context"
	"errors"

	"github.com/actionledger/ledger/ledger"
)

var errProtocolPending = errors.New("agent protocol: not built yet")

// Propose records a client's proposal of one tool call through the gate.
func (e *Engine) Propose(ctx context.Context, p ProposeParams) (ProposeResult, error) {
	return ProposeResult{}, errProtocolPending
}

// Begin begins an attempt of an approved action, durable before it answers.
func (e *Engine) Begin(ctx context.Context, p BeginParams) (BeginResult, error) {
	return BeginResult{}, errProtocolPending
}

// Heartbeat renews an attempt's lease.
func (e *Engine) Heartbeat(ctx context.Context, p HeartbeatParams) (HeartbeatResult, error) {
	return HeartbeatResult{}, errProtocolPending
}

// Complete records what a client's call did.
func (e *Engine) Complete(ctx context.Context, p CompleteParams) (CompleteResult, error) {
	return CompleteResult{}, errProtocolPending
}

// Abandon closes an attempt whose call the agent lost.
func (e *Engine) Abandon(ctx context.Context, p AbandonParams) (CompleteResult, error) {
	return CompleteResult{}, errProtocolPending
}

// Observe records what the agent learned from its tool, and decides.
func (e *Engine) Observe(ctx context.Context, p ObserveParams) (ObserveResult, error) {
	return ObserveResult{}, errProtocolPending
}

// Next says what the agent of a run must do now.
func (e *Engine) Next(ctx context.Context, c Caller, run ledger.RunID) (NextResult, error) {
	return NextResult{}, errProtocolPending
}

// FinishRun ends a client-driven run.
func (e *Engine) FinishRun(ctx context.Context, p FinishParams) (*ledger.Run, error) {
	return nil, errProtocolPending
}
