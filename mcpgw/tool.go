package mcpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The _meta keys the gateway sends an upstream with each call, and reads
// of its answer (contracts.MCPMeta*). MetaRun and MetaAction name the call
// in the gateway's answers to its clients too.
const (
	MetaDedupKey     = contracts.MCPMetaDedupKey
	MetaFencingToken = contracts.MCPMetaFencingToken
	MetaRun          = contracts.MCPMetaRun
	MetaAction       = contracts.MCPMetaAction
	MetaAttempt      = contracts.MCPMetaAttempt
	MetaEffect       = contracts.MCPMetaEffect
)

// tool is an upstream's tool as the engine calls it: its descriptor from
// its profile and confirmed definition; Execute calls the upstream, Query
// and Cancel the profile's query and cancel tools of the same upstream.
type tool struct {
	up      *upstream
	name    string // the upstream's name for it
	client  string // <upstream>__<tool>
	desc    contracts.ToolDescriptor
	profile contracts.ToolProfile
	locked  LockedTool
	def     *mcp.Tool // the confirmed definition, as clients see it
	// maxResult caps the answer's JSON kept and passed on.
	maxResult int64
}

var (
	_ engine.Tool      = (*tool)(nil)
	_ engine.Querier   = (*tool)(nil)
	_ engine.Canceller = (*tool)(nil)
)

// Descriptor implements engine.Tool.
func (t *tool) Descriptor() contracts.ToolDescriptor { return t.desc }

// CodeDefinitionChanged is the tool error of a call of a tool whose
// upstream definition is no longer the confirmed one: nothing was sent.
const CodeDefinitionChanged = "definition_changed"

// changed reports why the tool may not be called now: the upstream lists
// another definition than the confirmed one, or none.
func (t *tool) changed() string {
	d, listed := t.up.liveDigest(t.name)
	switch {
	case !listed || d == t.locked.Digest:
		return ""
	case d == "":
		return fmt.Sprintf("upstream %s no longer lists the tool %s", t.up.cfg.Name, t.name)
	default:
		return fmt.Sprintf("upstream %s changed the definition of %s since it was confirmed (%s, now %s): an operator confirms it again with `ledger mcp tools confirm %s`",
			t.up.cfg.Name, t.name, t.locked.Digest, d, t.client)
	}
}

// Execute implements engine.Tool: the upstream's tools/call with the call's
// dedup key, fencing token and names in _meta.
func (t *tool) Execute(ctx context.Context, c engine.Call) (engine.Result, error) {
	if why := t.changed(); why != "" {
		return engine.Result{}, &engine.ToolError{Code: CodeDefinitionChanged, Message: why, Effect: ledger.EffectNotHappened}
	}
	var args map[string]any
	if err := json.Unmarshal(c.Arguments, &args); err != nil {
		return engine.Result{}, &engine.ToolError{Code: "invalid_arguments", Message: err.Error(), Effect: ledger.EffectNotHappened}
	}
	p := &mcp.CallToolParams{Name: t.name, Arguments: args, Meta: mcp.Meta{
		MetaDedupKey: c.DedupKey, MetaRun: string(c.RunID), MetaAction: string(c.ActionID), MetaAttempt: c.Attempt,
	}}
	if c.FencingToken > 0 {
		p.Meta[MetaFencingToken] = c.FencingToken
	}
	hits := t.up.capHits.Load()
	res, err := t.up.call(ctx, p)
	if err != nil {
		if t.up.capHits.Load() > hits {
			err = fmt.Errorf("%w: %v", errTooLarge, err)
		}
		return engine.Result{}, t.callError(ctx, err)
	}
	return t.answer(res)
}

// callError is the engine's view of a call that got no result: a timeout,
// an upstream that could not be reached (nothing was sent), one that
// refused the request as malformed (nothing was done), or one that failed
// or died in between (effect unknown).
func (t *tool) callError(ctx context.Context, err error) error {
	var rpc *jsonrpc.Error
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, errTooLarge) || strings.Contains(err.Error(), "exceeded the configured maximum line length"):
		return &engine.ToolError{Code: "result_too_large", Message: "the upstream's answer was over the gateway's cap, and was not read: " + err.Error(),
			Effect: readEffect(t.desc, ledger.EffectUnknown)}
	case errors.Is(err, errUpstreamDown):
		return &engine.ToolError{Code: "upstream_unavailable", Message: err.Error(), Effect: ledger.EffectNotHappened}
	case errors.As(err, &rpc) && (rpc.Code == jsonrpc.CodeInvalidParams || rpc.Code == jsonrpc.CodeMethodNotFound):
		return &engine.ToolError{Code: "upstream_refused", Message: err.Error(), Effect: ledger.EffectNotHappened}
	default:
		return &engine.ToolError{Code: "upstream_error", Message: err.Error(), Effect: ledger.EffectUnknown}
	}
}

// answer is the engine's view of an upstream's result: its content and
// structured content as the output (or a note of its size, past the cap),
// the effect its _meta states (else the engine's default for a success,
// unknown for an error), and a tool error for isError.
func (t *tool) answer(res *mcp.CallToolResult) (engine.Result, error) {
	effect := ledger.EffectFact("")
	if s, ok := res.Meta[MetaEffect].(string); ok && ledger.EffectFact(s).Valid() {
		effect = ledger.EffectFact(s)
	}
	var out []byte
	size := contentSize(res.Content)
	if size <= t.maxResult {
		var err error
		if out, err = json.Marshal(output{Content: res.Content, StructuredContent: res.StructuredContent}); err != nil {
			return engine.Result{}, &engine.ToolError{Code: "malformed_result", Message: err.Error(), Effect: orUnknown(effect)}
		}
		size = int64(len(out))
	}
	if size > t.maxResult {
		msg := fmt.Sprintf("the upstream's answer was at least %d bytes, over the gateway's max_result_bytes (%d): it was not kept", size, t.maxResult)
		if t.desc.Effect == contracts.EffectRead || res.IsError {
			return engine.Result{}, &engine.ToolError{Code: "result_too_large", Message: msg, Effect: readEffect(t.desc, orUnknown(effect))}
		}
		out, _ = json.Marshal(output{Content: []mcp.Content{&mcp.TextContent{Text: msg}}, Omitted: size})
	}
	if res.IsError {
		return engine.Result{}, &engine.ToolError{Code: "upstream_tool_error", Message: errorText(res, 4096), Effect: readEffect(t.desc, orUnknown(effect))}
	}
	return engine.Result{Output: out, Effect: effect}, nil
}

// output is what the ledger keeps of a successful call: what a client
// gets back, and nothing of the upstream's _meta.
type output struct {
	Content           []mcp.Content `json:"content"`
	StructuredContent any           `json:"structuredContent,omitempty"`
	// Omitted is the size of an answer not kept, over the cap.
	Omitted int64 `json:"omitted_bytes,omitempty"`
}

// contentSize is a lower bound of the content's size as JSON, read
// without encoding it: the text and the data it carries.
func contentSize(cs []mcp.Content) int64 {
	var n int64
	for _, c := range cs {
		switch c := c.(type) {
		case *mcp.TextContent:
			n += int64(len(c.Text))
		case *mcp.ImageContent:
			n += int64(len(c.Data))
		case *mcp.AudioContent:
			n += int64(len(c.Data))
		}
	}
	return n
}

// readEffect is effect, except that a read takes no effect whatever
// happened to it.
func readEffect(d contracts.ToolDescriptor, effect ledger.EffectFact) ledger.EffectFact {
	if d.Effect == contracts.EffectRead {
		return ledger.EffectNotHappened
	}
	return effect
}

func orUnknown(f ledger.EffectFact) ledger.EffectFact {
	if f == "" {
		return ledger.EffectUnknown
	}
	return f
}

// errorText is the text of an error result's content, at most max bytes.
func errorText(res *mcp.CallToolResult, max int) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString("\n")
			}
			b.WriteString(tc.Text)
		}
	}
	s := b.String()
	if s == "" {
		s = "the upstream tool reported an error without text"
	}
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// Query implements engine.Querier through the profile's query tool: its
// structured answer at the effect pointer says happened, not_happened or
// unknown; anything else is unknown.
func (t *tool) Query(ctx context.Context, dedupKey string) (engine.QueryResult, error) {
	q := t.profile.Query
	if q == nil {
		return engine.QueryResult{}, errors.ErrUnsupported
	}
	res, err := t.probe(ctx, q, dedupKey)
	if err != nil {
		return engine.QueryResult{}, err
	}
	out, _ := json.Marshal(res.StructuredContent)
	effect := ledger.EffectUnknown
	if s, ok := pointerValue(res.StructuredContent, orDefault(q.EffectPointer, "/effect")).(string); ok && ledger.EffectFact(s).Valid() {
		effect = ledger.EffectFact(s)
	}
	return engine.QueryResult{Effect: effect, Output: out}, nil
}

// Cancel implements engine.Canceller through the profile's cancel tool:
// confirmed when its structured answer holds true at the confirmed pointer.
func (t *tool) Cancel(ctx context.Context, dedupKey string) (engine.CancelResult, error) {
	c := t.profile.Cancel
	if c == nil {
		return engine.CancelResult{}, errors.ErrUnsupported
	}
	res, err := t.probe(ctx, c, dedupKey)
	if err != nil {
		return engine.CancelResult{}, err
	}
	out, _ := json.Marshal(res.StructuredContent)
	confirmed, _ := pointerValue(res.StructuredContent, orDefault(c.ConfirmedPointer, "/confirmed")).(bool)
	return engine.CancelResult{Confirmed: confirmed, Detail: out}, nil
}

// probe calls a query or cancel tool with the dedup key.
func (t *tool) probe(ctx context.Context, p *contracts.ProbeTool, dedupKey string) (*mcp.CallToolResult, error) {
	res, err := t.up.call(ctx, &mcp.CallToolParams{Name: p.Tool, Arguments: map[string]any{orDefault(p.KeyArgument, "dedup_key"): dedupKey}})
	if err != nil {
		return nil, fmt.Errorf("%s of upstream %s: %w", p.Tool, t.up.cfg.Name, err)
	}
	if res.IsError {
		return nil, fmt.Errorf("%s of upstream %s: %s", p.Tool, t.up.cfg.Name, errorText(res, 1024))
	}
	return res, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// pointerValue is the value at a JSON Pointer in a decoded document, nil
// if there is none.
func pointerValue(doc any, pointer string) any {
	if pointer == "" {
		return doc
	}
	// Through JSON, so that a typed structured content reads as decoded.
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	for _, tok := range strings.Split(pointer[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[tok]
	}
	return v
}
