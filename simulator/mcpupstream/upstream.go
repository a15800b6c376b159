package mcpupstream

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// Names of the tools the server lists.
const (
	// ToolCardsWrite is the simulator's cards.write: an effect write.
	ToolCardsWrite = "cards_write"
	// ToolCardsCount is the simulator's cards.count: an effect read.
	ToolCardsCount = "cards_count"
	// ToolCardsStatus queries cards_write's effect for a dedup key.
	ToolCardsStatus = "cards_status"
	// ToolCardsCancel cancels cards_write's call for a dedup key.
	ToolCardsCancel = "cards_cancel"
)

// Keys of the _meta objects the server reads (of a tools/call request's
// params) and writes (of every tools/call result): the gateway's wire
// contract (contracts.MCPMeta*). Absent, a dedup key is a fresh random one.
const (
	MetaDedupKey     = contracts.MCPMetaDedupKey
	MetaFencingToken = contracts.MCPMetaFencingToken
	MetaRun          = contracts.MCPMetaRun
	MetaAction       = contracts.MCPMetaAction
	MetaAttempt      = contracts.MCPMetaAttempt
	// MetaEffect is in every result's _meta: what the call did to the
	// world, as the simulator reports it.
	MetaEffect = contracts.MCPMetaEffect
)

// Error codes of the server's own, beside the simulator's (such as
// simulator.CodeFenced); each is the code of a tool-error result.
const (
	// CodeInvalidMeta: a _meta key of the request has the wrong type; the
	// tool was not called (effect not_happened).
	CodeInvalidMeta = "invalid_meta"
	// CodeUnsupported: the tool's guarantees, as configured, do not allow
	// the call (cards_status without query, cards_cancel without cancel);
	// nothing was done (effect not_happened).
	CodeUnsupported = "unsupported"
	// CodeContextEnded: the request's context ended (the client cancelled
	// or went away) before the tool answered (effect unknown; not_happened
	// for hang).
	CodeContextEnded = "context_ended"
	// CodeToolFailure: the tool failed otherwise, for instance its effect
	// store did (effect unknown).
	CodeToolFailure = "tool_failure"
)

// Options configures the server.
type Options struct {
	// Misbehaving adds the tools huge_read, hang, exit_now and malformed
	// (misbehaving.go), for the gateway's bad-input tests.
	Misbehaving bool
	// Exit is what exit_now calls with ExitStatus; nil means os.Exit. A test
	// injects a function that records the status and returns: exit_now then
	// answers a tool error, CodeExitReturned.
	Exit func(status int)
	// Version is the server's version in its initialize answer; "" means
	// "dev".
	Version string
	// Logger receives the SDK's log; nil means none.
	Logger *slog.Logger
}

// ImplementationName is the server's name in its initialize answer.
const ImplementationName = "ledger-simulator-upstream"

// upstream holds the simulator's tools the handlers call.
type upstream struct {
	write *simulator.Tool
	count *simulator.Tool
	opts  Options
}

// New returns an MCP server whose tools are the simulator's cards.write and
// cards.count, keeping their effects in store, configured and faulted as
// cfg says under the simulator's tool names (cards.write, cards.count), plus
// the misbehaving tools if opts says so. Run it on a transport with
// mcp.Server.Run, or serve it with mcp.NewStreamableHTTPHandler. A cfg that
// fails Validate is an error.
func New(store *simulator.EffectStore, cfg simulator.Config, opts Options) (*mcp.Server, error) {
	if store == nil {
		return nil, errors.New("mcpupstream: no effect store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("mcpupstream: %w", err)
	}
	if opts.Exit == nil {
		opts.Exit = os.Exit
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	u := &upstream{
		write: simulator.NewTool(simulator.CardsWriteDescriptor(), store, toolConfig(cfg, simulator.CardsWriteTool)),
		count: simulator.NewTool(simulator.CardsCountDescriptor(), store, toolConfig(cfg, simulator.CardsCountTool)),
		opts:  opts,
	}
	s := mcp.NewServer(&mcp.Implementation{Name: ImplementationName, Version: opts.Version},
		&mcp.ServerOptions{Logger: logger})

	wd, cd := u.write.Descriptor(), u.count.Descriptor()
	s.AddTool(&mcp.Tool{
		Name:  ToolCardsWrite,
		Title: "Write practice cards",
		Description: wd.Description + " The simulator's " + simulator.CardsWriteTool +
			"; _meta " + MetaDedupKey + " is its dedup key (a fresh one when absent).",
		InputSchema: json.RawMessage(wd.ArgumentsSchema),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, u.execute(u.write, ledger.EffectHappened))
	s.AddTool(&mcp.Tool{
		Name:        ToolCardsCount,
		Title:       "Count practice cards",
		Description: cd.Description + " The simulator's " + simulator.CardsCountTool + ".",
		InputSchema: json.RawMessage(cd.ArgumentsSchema),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, u.execute(u.count, ledger.EffectNotHappened))
	s.AddTool(&mcp.Tool{
		Name:  ToolCardsStatus,
		Title: "Status of a cards_write call",
		Description: "Whether cards_write's effect for a dedup key happened: " +
			`{"effect": "happened"|"not_happened"|"unknown", "output": <the effect's output, if it happened>}.`,
		InputSchema: json.RawMessage(dedupKeySchema),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, u.status)
	s.AddTool(&mcp.Tool{
		Name:  ToolCardsCancel,
		Title: "Cancel a cards_write call",
		Description: "Cancels cards_write's call for a dedup key if it has not taken effect: " +
			`{"confirmed": bool, "detail": {...}}. Confirmed, calls of the key in flight are refused; nothing is undone.`,
		InputSchema: json.RawMessage(dedupKeySchema),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, u.cancel)
	if opts.Misbehaving {
		u.addMisbehaving(s)
	}
	return s, nil
}

// toolConfig is cfg's config of the simulator's tool name, with cfg's crash
// function where the tool sets none (as the practice-cards agent has it).
func toolConfig(cfg simulator.Config, name string) simulator.ToolConfig {
	tc := cfg.Tools[name]
	if tc.CrashFunc == nil {
		tc.CrashFunc = cfg.CrashFunc
	}
	return tc
}

// dedupKeySchema is the arguments schema of cards_status and cards_cancel.
const dedupKeySchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["dedup_key"],
  "properties": {
    "dedup_key": {"type": "string", "minLength": 1}
  }
}`

// execute is the handler of a tool that is a simulator.Tool's Execute:
// the call from the request's _meta and arguments, the output as the
// result, the effect the simulator reports (dflt if it reports none).
func (u *upstream) execute(tool *simulator.Tool, dflt ledger.EffectFact) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		call, err := callFromMeta(req.Params.Meta)
		if err != nil {
			return failure(CodeInvalidMeta, err.Error(), ledger.EffectNotHappened), nil
		}
		call.Arguments = req.Params.Arguments
		res, err := tool.Execute(ctx, call)
		if err != nil {
			return fromError(ctx, err), nil
		}
		effect := res.Effect
		if effect == "" {
			effect = dflt
		}
		return success(res.Output, effect), nil
	}
}

// statusOutput is cards_status's structured content.
type statusOutput struct {
	Effect ledger.EffectFact `json:"effect"`
	Output json.RawMessage   `json:"output,omitempty"`
}

// status is cards_status: cards_write's Query. It changes nothing: its
// effect is not_happened, whatever the answer says of the dedup key's.
func (u *upstream) status(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, err := dedupKeyArgument(req.Params.Arguments)
	if err != nil {
		return failure(simulator.CodeInvalidArguments, err.Error(), ledger.EffectNotHappened), nil
	}
	qr, err := u.write.Query(ctx, key)
	if err != nil {
		return fromError(ctx, err), nil
	}
	out, err := json.Marshal(statusOutput{Effect: qr.Effect, Output: qr.Output})
	if err != nil {
		return failure(CodeToolFailure, err.Error(), ledger.EffectNotHappened), nil
	}
	return success(out, ledger.EffectNotHappened), nil
}

// cancelOutput is cards_cancel's structured content.
type cancelOutput struct {
	Confirmed bool            `json:"confirmed"`
	Detail    json.RawMessage `json:"detail,omitempty"`
}

// cancel is cards_cancel: cards_write's Cancel. A confirmed cancel wrote
// its tombstone (effect happened); one not confirmed changed nothing
// (not_happened).
func (u *upstream) cancel(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	key, err := dedupKeyArgument(req.Params.Arguments)
	if err != nil {
		return failure(simulator.CodeInvalidArguments, err.Error(), ledger.EffectNotHappened), nil
	}
	cr, err := u.write.Cancel(ctx, key)
	if err != nil {
		return fromError(ctx, err), nil
	}
	out, err := json.Marshal(cancelOutput{Confirmed: cr.Confirmed, Detail: cr.Detail})
	if err != nil {
		return failure(CodeToolFailure, err.Error(), ledger.EffectUnknown), nil
	}
	effect := ledger.EffectNotHappened
	if cr.Confirmed {
		effect = ledger.EffectHappened
	}
	return success(out, effect), nil
}

// dedupKeyArgument reads {"dedup_key": "…"}, refusing other fields.
func dedupKeyArgument(raw json.RawMessage) (string, error) {
	var args struct {
		DedupKey string `json:"dedup_key"`
	}
	if err := decodeArguments(raw, &args); err != nil {
		return "", err
	}
	if args.DedupKey == "" {
		return "", errors.New("arguments: dedup_key is required")
	}
	return args.DedupKey, nil
}

// decodeArguments decodes a tool's arguments object into out, refusing
// unknown fields and trailing data; absent arguments are an empty object.
func decodeArguments(raw json.RawMessage, out any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("arguments: unexpected data after the object")
	}
	return nil
}

// callFromMeta builds the engine.Call a request's _meta describes, without
// its arguments. A key of the wrong type is an error; a missing dedup key
// is a fresh random one.
func callFromMeta(meta mcp.Meta) (engine.Call, error) {
	var (
		c   engine.Call
		err error
		run string
		act string
	)
	if c.DedupKey, err = metaString(meta, MetaDedupKey); err != nil {
		return engine.Call{}, err
	}
	if run, err = metaString(meta, MetaRun); err != nil {
		return engine.Call{}, err
	}
	if act, err = metaString(meta, MetaAction); err != nil {
		return engine.Call{}, err
	}
	if c.FencingToken, err = metaInt(meta, MetaFencingToken); err != nil {
		return engine.Call{}, err
	}
	if c.Attempt, err = metaInt(meta, MetaAttempt); err != nil {
		return engine.Call{}, err
	}
	c.RunID, c.ActionID = ledger.RunID(run), ledger.ActionID(act)
	if c.DedupKey == "" {
		c.DedupKey = "mcp-upstream/" + rand.Text()
	}
	return c, nil
}

// metaString reads a string _meta key; "" when absent or null.
func metaString(meta mcp.Meta, key string) (string, error) {
	v, ok := meta[key]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("_meta %s: a string, not %T", key, v)
	}
	return s, nil
}

// maxExactInt is the largest integer a JSON number decoded as float64
// holds exactly (2^53).
const maxExactInt = 1 << 53

// metaInt reads a non-negative integer _meta key; 0 when absent or null.
func metaInt(meta mcp.Meta, key string) (int64, error) {
	v, ok := meta[key]
	if !ok || v == nil {
		return 0, nil
	}
	var n int64
	switch x := v.(type) {
	case float64:
		if x != math.Trunc(x) || x < 0 || x > maxExactInt {
			return 0, fmt.Errorf("_meta %s: a non-negative integer up to 2^53, not %v", key, x)
		}
		n = int64(x)
	case json.Number:
		i, err := x.Int64()
		if err != nil {
			return 0, fmt.Errorf("_meta %s: an integer: %w", key, err)
		}
		n = i
	case int:
		n = int64(x)
	case int64:
		n = x
	default:
		return 0, fmt.Errorf("_meta %s: a number, not %T", key, v)
	}
	if n < 0 {
		return 0, fmt.Errorf("_meta %s: negative", key)
	}
	return n, nil
}

// success is a result whose structured content, and text, is output.
func success(output json.RawMessage, effect ledger.EffectFact) *mcp.CallToolResult {
	r := &mcp.CallToolResult{Meta: effectMeta(effect), Content: []mcp.Content{}}
	if len(output) > 0 {
		r.Content = []mcp.Content{&mcp.TextContent{Text: string(output)}}
		r.StructuredContent = output
	}
	return r
}

// toolErrorOutput is a tool error's structured content.
type toolErrorOutput struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// failure is a tool-error result: isError, "CODE: message" as text,
// {"code", "message"} as structured content.
func failure(code, message string, effect ledger.EffectFact) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Meta:              effectMeta(effect),
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: code + ": " + message}},
		StructuredContent: toolErrorOutput{Code: code, Message: message},
	}
}

// fromError is the tool-error result of a simulator error: a
// *engine.ToolError as it is (effect unknown if it names none); a
// guarantee the tool does not declare, CodeUnsupported (not_happened); the
// request's context ended, CodeContextEnded; anything else, CodeToolFailure
// (both unknown).
func fromError(ctx context.Context, err error) *mcp.CallToolResult {
	var te *engine.ToolError
	switch {
	case errors.As(err, &te):
		effect := te.Effect
		if effect == "" {
			effect = ledger.EffectUnknown
		}
		return failure(te.Code, te.Message, effect)
	case errors.Is(err, errors.ErrUnsupported):
		return failure(CodeUnsupported, err.Error(), ledger.EffectNotHappened)
	case ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return failure(CodeContextEnded, err.Error(), ledger.EffectUnknown)
	default:
		return failure(CodeToolFailure, err.Error(), ledger.EffectUnknown)
	}
}

// effectMeta is a result's _meta.
func effectMeta(effect ledger.EffectFact) mcp.Meta {
	return mcp.Meta{MetaEffect: string(effect)}
}

func ptr[T any](v T) *T { return &v }
