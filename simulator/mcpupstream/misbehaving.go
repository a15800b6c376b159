package mcpupstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// Names of the misbehaving tools (Options.Misbehaving).
const (
	// ToolHugeRead answers {"bytes": N} with a text content of N bytes.
	ToolHugeRead = "huge_read"
	// ToolHang answers nothing until the request's context ends.
	ToolHang = "hang"
	// ToolExitNow ends the process with ExitStatus before answering.
	ToolExitNow = "exit_now"
	// ToolMalformed answers a result that is not a CallToolResult.
	ToolMalformed = "malformed"
)

// ExitStatus is the status exit_now ends the process with.
const ExitStatus = 3

// MaxHugeReadBytes bounds huge_read's answer, so that a mistyped test asks
// for a quarter of a GiB at most.
const MaxHugeReadBytes = 256 << 20

// CodeExitReturned is exit_now's tool error when Options.Exit returned
// instead of ending the process (a test's exit function).
const CodeExitReturned = "exit_returned"

// Kinds of malformed answer ({"kind": …} of the malformed tool).
const (
	// MalformedContentNotArray (the default): "content" is a string, where
	// a CallToolResult has an array.
	MalformedContentNotArray = "content_not_array"
	// MalformedUnknownContent: a content item of a type MCP does not have
	// ("hologram").
	MalformedUnknownContent = "unknown_content_type"
	// MalformedDeepNesting: structuredContent is arrays nested
	// MalformedDepth deep, deeper than the SDK's decoder accepts (1000)
	// and within what encoding/json writes (10000).
	MalformedDeepNesting = "deep_nesting"
)

// MalformedDepth is the nesting of MalformedDeepNesting's structured
// content.
const MalformedDepth = 5000

// addMisbehaving adds the misbehaving tools and the middleware that answers
// malformed's calls.
func (u *upstream) addMisbehaving(s *mcp.Server) {
	s.AddTool(&mcp.Tool{
		Name:        ToolHugeRead,
		Description: fmt.Sprintf("Answers a text content of the given number of bytes (at most %d).", MaxHugeReadBytes),
		InputSchema: json.RawMessage(fmt.Sprintf(`{"type": "object", "additionalProperties": false, "required": ["bytes"],
  "properties": {"bytes": {"type": "integer", "minimum": 0, "maximum": %d}}}`, MaxHugeReadBytes)),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, hugeRead)
	s.AddTool(&mcp.Tool{
		Name:        ToolHang,
		Description: "Answers nothing until the request is cancelled or the connection ends.",
		InputSchema: json.RawMessage(`{"type": "object", "additionalProperties": false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, hang)
	s.AddTool(&mcp.Tool{
		Name:        ToolExitNow,
		Description: fmt.Sprintf("Ends the server's process with status %d before answering.", ExitStatus),
		InputSchema: json.RawMessage(`{"type": "object", "additionalProperties": false}`),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: false, OpenWorldHint: ptr(false)},
	}, u.exitNow)
	s.AddTool(&mcp.Tool{
		Name: ToolMalformed,
		Description: "Answers a result no client can use: content not an array (kind content_not_array, the default), " +
			"a content of an unknown type (unknown_content_type), or structured content nested too deep (deep_nesting).",
		InputSchema: json.RawMessage(`{"type": "object", "additionalProperties": false,
  "properties": {"kind": {"type": "string", "enum": ["content_not_array", "unknown_content_type", "deep_nesting"]}}}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// Never reached: malformedMiddleware answers first.
		return nil, errors.New("malformed: the middleware did not answer")
	})
	s.AddReceivingMiddleware(malformedMiddleware)
}

// hugeRead is huge_read.
func hugeRead(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Bytes *int `json:"bytes"`
	}
	if err := decodeArguments(req.Params.Arguments, &args); err != nil {
		return failure(simulator.CodeInvalidArguments, err.Error(), ledger.EffectNotHappened), nil
	}
	if args.Bytes == nil || *args.Bytes < 0 || *args.Bytes > MaxHugeReadBytes {
		return failure(simulator.CodeInvalidArguments,
			fmt.Sprintf("arguments: bytes must be between 0 and %d", MaxHugeReadBytes), ledger.EffectNotHappened), nil
	}
	return &mcp.CallToolResult{
		Meta:    effectMeta(ledger.EffectNotHappened),
		Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", *args.Bytes)}},
	}, nil
}

// hang is hang: it returns once the request's context ends, with a tool
// error nobody reads.
func hang(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	<-ctx.Done()
	return failure(CodeContextEnded, context.Cause(ctx).Error(), ledger.EffectNotHappened), nil
}

// exitNow is exit_now.
func (u *upstream) exitNow(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	u.opts.Exit(ExitStatus)
	return failure(CodeExitReturned, "the exit function returned", ledger.EffectNotHappened), nil
}

// rawResult is a tools/call answer the SDK's types cannot express: its JSON
// is body, as it is.
type rawResult struct {
	mcp.ResultBase
	body json.RawMessage
}

// MarshalJSON implements json.Marshaler.
func (r *rawResult) MarshalJSON() ([]byte, error) { return r.body, nil }

// malformedMiddleware answers tools/call of malformed with a rawResult,
// past the SDK's typed handling of tool results; every other request goes
// on as usual.
func malformedMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		call, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || call.Params == nil || call.Params.Name != ToolMalformed {
			return next(ctx, method, req)
		}
		var args struct {
			Kind string `json:"kind"`
		}
		if err := decodeArguments(call.Params.Arguments, &args); err != nil {
			return failure(simulator.CodeInvalidArguments, err.Error(), ledger.EffectNotHappened), nil
		}
		body, err := malformedBody(args.Kind)
		if err != nil {
			return failure(simulator.CodeInvalidArguments, err.Error(), ledger.EffectNotHappened), nil
		}
		return &rawResult{body: body}, nil
	}
}

// malformedBody is the JSON of a malformed answer of the given kind; each
// still carries MetaEffect, so the only fault is the one named.
func malformedBody(kind string) (json.RawMessage, error) {
	meta := `"_meta": {"` + MetaEffect + `": "not_happened"}`
	switch kind {
	case "", MalformedContentNotArray:
		return json.RawMessage(`{` + meta + `, "content": "this should have been an array of content"}`), nil
	case MalformedUnknownContent:
		return json.RawMessage(`{` + meta + `, "content": [{"type": "hologram", "hologram": "a card, in 3D"}]}`), nil
	case MalformedDeepNesting:
		return json.RawMessage(`{` + meta + `, "content": [], "structuredContent": ` +
			strings.Repeat("[", MalformedDepth) + strings.Repeat("]", MalformedDepth) + `}`), nil
	default:
		return nil, fmt.Errorf("arguments: unknown kind %q (%s, %s or %s)", kind,
			MalformedContentNotArray, MalformedUnknownContent, MalformedDeepNesting)
	}
}
