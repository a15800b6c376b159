package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/anthropics/anthropic-sdk-go/v2/packages/param"
)

// anthropicAPI is the anthropic-messages adapter: Anthropic Messages.
//
// The system prompt is system; consecutive user and tool messages become
// one user message (a tool result is a tool_result block with its
// tool_use_id and is_error); an assistant message is its thinking blocks
// (this format's Opaque, sent back verbatim with their signatures), a text
// block and its tool_use blocks, in that order. Tools are client tools with
// their input_schema as given; the output schema is output_config.format
// json_schema, which the API enforces (and refuses, with a 400, for schema
// features it does not support). max_tokens is required: the request's,
// else the tier's, else DefaultAnthropicMaxTokens (plus the thinking
// budget when thinking is on).
type anthropicAPI struct {
	*remote
	svc anthropic.MessageService
}

func newAnthropic(r *remote) *anthropicAPI {
	base := r.baseURL
	if base == "" {
		base = DefaultAnthropicBaseURL
	}
	client := anthropic.NewClient(
		// No ANTHROPIC_* variable of the environment (another key, a
		// bearer token, a profile) reaches a request the config did not
		// describe.
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(base),
		option.WithAPIKey(string(r.key)),
		option.WithHTTPClient(r.client),
		// The ledger's budgets count every try: the SDK makes one.
		option.WithMaxRetries(0),
	)
	return &anthropicAPI{remote: r, svc: client.Messages}
}

// Complete implements Model.
func (a *anthropicAPI) Complete(ctx context.Context, req Request) (Turn, error) {
	tctx, cancel, err := a.begin(ctx, req)
	if err != nil {
		return Turn{}, err
	}
	defer cancel()
	p, err := a.params(req)
	if err != nil {
		return Turn{}, a.invalid(ErrorClient, err)
	}
	var res *http.Response
	into := option.WithResponseInto(&res)
	if !a.stream {
		// The SDK refuses a non-streamed call it expects to outlast its own
		// default timeout; the tier's timeout is the one that counts.
		msg, err := a.svc.New(tctx, p, into, option.WithRequestTimeout(a.timeout))
		if err != nil {
			return Turn{}, a.classify(ctx, tctx, anthropicFailure(err, res))
		}
		return a.turn(msg, msg.JSON.Usage.Valid(), nil)
	}
	stream := a.svc.NewStreaming(tctx, p, into)
	defer func() { _ = stream.Close() }()
	var msg anthropic.Message
	var usage, stopped bool
	// The tool calls' argument text as streamed: the SDK empties one that
	// a max_tokens stop cut off, which would read as a call with no
	// arguments.
	partial := map[int64]*strings.Builder{}
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			return Turn{}, a.invalid(ErrorInvalidResponse, err)
		}
		switch ev.Type {
		case "message_start":
			usage = ev.Message.JSON.Usage.Valid()
		case "message_delta":
			usage = usage || ev.JSON.Usage.Valid()
		case "message_stop":
			stopped = true
		case "content_block_delta":
			if ev.Delta.Type == "input_json_delta" {
				if partial[ev.Index] == nil {
					partial[ev.Index] = &strings.Builder{}
				}
				partial[ev.Index].WriteString(ev.Delta.PartialJSON)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return Turn{}, a.classify(ctx, tctx, anthropicFailure(err, res))
	}
	if !stopped {
		return Turn{}, a.classify(ctx, tctx, failure{kind: ErrorTransport, message: "the stream ended before message_stop"})
	}
	args := make(map[int]string, len(partial))
	for i, b := range partial {
		args[int(i)] = b.String()
	}
	return a.turn(&msg, usage, args)
}

// params translates req into a Messages request.
func (a *anthropicAPI) params(req Request) (anthropic.MessageNewParams, error) {
	maxTokens := a.maxTokens(req)
	if maxTokens == 0 {
		maxTokens = DefaultAnthropicMaxTokens + a.budget
	}
	if a.budget > 0 && maxTokens <= a.budget {
		return anthropic.MessageNewParams{}, fmt.Errorf("max tokens %d leave nothing beyond the thinking budget %d", maxTokens, a.budget)
	}
	p := anthropic.MessageNewParams{Model: anthropic.Model(a.model), MaxTokens: maxTokens}
	if req.System != "" {
		p.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	for _, m := range req.Messages {
		role, blocks := a.blocks(m)
		if len(blocks) == 0 {
			continue
		}
		// The API alternates user and assistant: consecutive tool results
		// (and a user message after them) share one user message.
		if n := len(p.Messages); n > 0 && roleOf(p.Messages[n-1]) == role {
			last := &p.Messages[n-1]
			if role == RoleUser {
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
			} else {
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
			}
			continue
		}
		if role == RoleUser {
			p.Messages = append(p.Messages, anthropic.NewUserMessage(blocks...))
		} else {
			p.Messages = append(p.Messages, anthropic.NewAssistantMessage(blocks...))
		}
	}
	for _, t := range req.Tools {
		schema := t.InputSchema
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		tool := &anthropic.ToolParam{Name: t.Name, InputSchema: param.Override[anthropic.ToolInputSchemaParam](schema)}
		if t.Description != "" {
			tool.Description = param.NewOpt(t.Description)
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: tool})
	}
	if len(req.OutputSchema) > 0 {
		schema, err := schemaMap(req.OutputSchema)
		if err != nil {
			return p, fmt.Errorf("output_schema: %w", err)
		}
		p.OutputConfig.Format = anthropic.JSONOutputFormatParam{Schema: schema}
	}
	if a.budget > 0 {
		p.Thinking = anthropic.ThinkingConfigParamOfEnabled(a.budget)
	}
	return p, nil
}

// blocks returns the role a message is sent under and its content blocks.
func (a *anthropicAPI) blocks(m Message) (Role, []anthropic.ContentBlockParamUnion) {
	switch m.Role {
	case RoleUser:
		return RoleUser, []anthropic.ContentBlockParamUnion{anthropic.NewTextBlock(m.Text)}
	case RoleTool:
		r := m.ToolResult
		block := anthropic.ToolResultBlockParam{ToolUseID: r.CallID}
		if r.Content != "" { // the API refuses an empty text block
			block.Content = []anthropic.ToolResultBlockParamContentUnion{{OfText: &anthropic.TextBlockParam{Text: r.Content}}}
		}
		if r.IsError {
			block.IsError = param.NewOpt(true)
		}
		return RoleUser, []anthropic.ContentBlockParamUnion{{OfToolResult: &block}}
	}
	var blocks []anthropic.ContentBlockParamUnion
	for _, o := range keptOpaque(a.kind, m.Opaque) {
		blocks = append(blocks, param.Override[anthropic.ContentBlockParamUnion](o.Data))
	}
	if m.Text != "" {
		blocks = append(blocks, anthropic.NewTextBlock(m.Text))
	}
	for _, tc := range m.ToolCalls {
		blocks = append(blocks, anthropic.NewToolUseBlock(tc.ID, arguments(tc.Arguments), tc.Name))
	}
	return RoleAssistant, blocks
}

// roleOf is the role a built message param has.
func roleOf(m anthropic.MessageParam) Role {
	if m.OfAssistant != nil {
		return RoleAssistant
	}
	return RoleUser
}

// turn reads a message into a Turn; usage says whether the provider
// reported any; streamed holds a streamed tool call's argument text by its
// block's index.
func (a *anthropicAPI) turn(msg *anthropic.Message, usage bool, streamed map[int]string) (Turn, error) {
	t := Turn{Model: string(msg.Model)}
	if t.Model == "" {
		t.Model = a.model
	}
	var text strings.Builder
	var calls []rawCall
	for i, b := range msg.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			args, ok := streamed[i]
			if !ok {
				args = string(b.Input)
			}
			calls = append(calls, rawCall{id: b.ID, name: b.Name, args: args})
		case "thinking", "redacted_thinking":
			t.Opaque = append(t.Opaque, Opaque{Kind: a.kind, Type: b.Type, Data: json.RawMessage(b.RawJSON())})
		}
	}
	t.Text = text.String()
	t.Stop = anthropicStop(string(msg.StopReason))
	var err error
	if t.ToolCalls, err = toolCalls(calls, t.Stop); err != nil {
		return Turn{}, a.invalid(ErrorInvalidResponse, err)
	}
	if t.Stop == StopRefusal {
		t.Refusal = msg.StopDetails.Explanation
		if t.Refusal == "" {
			t.Refusal = t.Text
		}
		if t.Refusal == "" {
			t.Refusal = "the model declined to answer"
		}
	}
	if usage {
		u := anthropicUsage(msg.Usage)
		t.Usage = &u
	}
	return t, nil
}

// anthropicStop maps stop_reason: end_turn and stop_sequence → end_turn,
// tool_use → tool_use, max_tokens and model_context_window_exceeded →
// max_tokens, refusal → refusal, anything else (pause_turn) → other.
func anthropicStop(reason string) StopReason {
	switch reason {
	case "end_turn", "stop_sequence":
		return StopEndTurn
	case "tool_use":
		return StopToolUse
	case "max_tokens", "model_context_window_exceeded":
		return StopMaxTokens
	case "refusal":
		return StopRefusal
	}
	return StopOther
}

// anthropicUsage normalises Messages usage: input_tokens exclude the cache
// reads and writes, so InputTokens adds them; output_tokens include the
// thinking tokens.
func anthropicUsage(u anthropic.Usage) Usage {
	return Usage{
		InputTokens:       u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens,
		CachedInputTokens: u.CacheReadInputTokens,
		CacheWriteTokens:  u.CacheCreationInputTokens,
		OutputTokens:      u.OutputTokens,
		ReasoningTokens:   u.OutputTokensDetails.ThinkingTokens,
	}
}

// anthropicFailure reads what an Anthropic SDK error says. An error event
// inside a stream arrives as an API error with the stream's 200 status.
func anthropicFailure(err error, res *http.Response) failure {
	f := failure{err: err, res: res}
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) {
		return f
	}
	f.message = apiErr.Message
	f.err = nil // its text holds the provider's body: Message is the scrubbed part of it
	if apiErr.StatusCode >= 400 {
		f.status = apiErr.StatusCode
		if apiErr.Response != nil {
			f.res = apiErr.Response
		}
		return f
	}
	f.kind = streamErrorKind(string(apiErr.Type()))
	return f
}
