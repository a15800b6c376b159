package provider

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/shared"
)

// chat is the openai-chat adapter: OpenAI Chat Completions.
//
// The system prompt is the first message (role system); a tool result is a
// tool message with its tool_call_id; tools are function tools; the output
// schema is response_format json_schema with strict off, because strict
// mode refuses schemas outside its subset: the API steers the answer but
// does not guarantee it. Chat Completions has no item only it can read
// back, so it writes no Opaque and sends none.
type chat struct {
	*remote
	svc openai.ChatCompletionService
}

func newChat(r *remote) *chat {
	return &chat{remote: r, svc: openai.NewChatCompletionService(openaiOptions(r)...)}
}

// Complete implements Model.
func (c *chat) Complete(ctx context.Context, req Request) (Turn, error) {
	tctx, cancel, err := c.begin(ctx, req)
	if err != nil {
		return Turn{}, err
	}
	defer cancel()
	p, err := c.params(req)
	if err != nil {
		return Turn{}, c.invalid(ErrorClient, err)
	}
	var res *http.Response
	if c.stream {
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)}
		stream := c.svc.NewStreaming(tctx, p, option.WithResponseInto(&res))
		defer func() { _ = stream.Close() }()
		var acc chatStream
		for stream.Next() {
			acc.add(stream.Current())
		}
		if err := stream.Err(); err != nil {
			return Turn{}, c.classify(ctx, tctx, openaiFailure(err, res))
		}
		if acc.finish == "" {
			return Turn{}, c.classify(ctx, tctx, failure{kind: ErrorTransport, message: "the stream ended before a finish_reason"})
		}
		return c.turn(acc.completion())
	}
	cc, err := c.svc.New(tctx, p, option.WithResponseInto(&res))
	if err != nil {
		return Turn{}, c.classify(ctx, tctx, openaiFailure(err, res))
	}
	if len(cc.Choices) == 0 {
		return Turn{}, c.invalid(ErrorInvalidResponse, fmt.Errorf("a chat completion with no choices"))
	}
	ch := cc.Choices[0]
	out := chatCompletion{model: cc.Model, text: ch.Message.Content, refusal: ch.Message.Refusal, finish: ch.FinishReason}
	for _, tc := range ch.Message.ToolCalls {
		if tc.Type != "function" {
			return Turn{}, c.invalid(ErrorInvalidResponse, fmt.Errorf("a tool call of type %q", tc.Type))
		}
		out.calls = append(out.calls, chatCall{id: tc.ID, name: tc.Function.Name, args: tc.Function.Arguments})
	}
	if cc.JSON.Usage.Valid() {
		u := chatUsage(cc.Usage)
		out.usage = &u
	}
	return c.turn(out)
}

// params translates req into a Chat Completions request.
func (c *chat) params(req Request) (openai.ChatCompletionNewParams, error) {
	p := openai.ChatCompletionNewParams{Model: c.model}
	if req.System != "" {
		p.Messages = append(p.Messages, openai.SystemMessage(req.System))
	}
	for _, m := range req.Messages {
		switch m.Role {
		case RoleUser:
			p.Messages = append(p.Messages, openai.UserMessage(m.Text))
		case RoleTool:
			p.Messages = append(p.Messages, openai.ToolMessage(m.ToolResult.Content, m.ToolResult.CallID))
		case RoleAssistant:
			if m.Text == "" && len(m.ToolCalls) == 0 {
				continue // only opaque items, none of them this format's
			}
			var a openai.ChatCompletionAssistantMessageParam
			if m.Text != "" {
				a.Content.OfString = param.NewOpt(m.Text)
			}
			for _, tc := range m.ToolCalls {
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID: tc.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
							Name: tc.Name, Arguments: string(arguments(tc.Arguments)),
						},
					},
				})
			}
			p.Messages = append(p.Messages, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		}
	}
	for _, t := range req.Tools {
		schema, err := schemaMap(t.InputSchema)
		if err != nil {
			return p, fmt.Errorf("tool %s: input_schema: %w", t.Name, err)
		}
		fd := shared.FunctionDefinitionParam{Name: t.Name, Parameters: schema}
		if t.Description != "" {
			fd.Description = param.NewOpt(t.Description)
		}
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(fd))
	}
	if len(req.OutputSchema) > 0 {
		p.ResponseFormat.OfJSONSchema = &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{
				Name: "answer", Schema: req.OutputSchema, Strict: param.NewOpt(false),
			},
		}
	}
	if n := c.maxTokens(req); n > 0 {
		p.MaxCompletionTokens = param.NewOpt(n)
	}
	if c.effort != "" {
		p.ReasoningEffort = shared.ReasoningEffort(c.effort)
	}
	return p, nil
}

// chatCompletion is the first choice of a completion, streamed or not.
type chatCompletion struct {
	model, text, refusal, finish string
	calls                        []chatCall
	usage                        *Usage
}

type chatCall struct {
	index          int64
	id, name, args string
}

// turn turns a completion into a Turn.
func (c *chat) turn(cc chatCompletion) (Turn, error) {
	t := Turn{Text: cc.text, Refusal: cc.refusal, Usage: cc.usage, Model: cc.model}
	if t.Model == "" {
		t.Model = c.model
	}
	t.Stop = chatStop(cc.finish, cc.refusal != "")
	raw := make([]rawCall, len(cc.calls))
	for i, call := range cc.calls {
		raw[i] = rawCall{id: call.id, name: call.name, args: call.args}
	}
	calls, err := toolCalls(raw, t.Stop)
	if err != nil {
		return Turn{}, c.invalid(ErrorInvalidResponse, err)
	}
	t.ToolCalls = calls
	return t, nil
}

// chatStop maps finish_reason: stop → end_turn, tool_calls and
// function_call → tool_use, length → max_tokens, content_filter →
// content_filter, anything else → other; a refusal → refusal whatever the
// finish_reason.
func chatStop(finish string, refused bool) StopReason {
	if refused {
		return StopRefusal
	}
	switch finish {
	case "stop":
		return StopEndTurn
	case "tool_calls", "function_call":
		return StopToolUse
	case "length":
		return StopMaxTokens
	case "content_filter":
		return StopContentFilter
	}
	return StopOther
}

// chatUsage normalises Chat Completions usage: prompt_tokens already
// include cached_tokens and cache_write_tokens, completion_tokens include
// reasoning_tokens.
func chatUsage(u openai.CompletionUsage) Usage {
	return Usage{
		InputTokens:       u.PromptTokens,
		CachedInputTokens: u.PromptTokensDetails.CachedTokens,
		CacheWriteTokens:  u.PromptTokensDetails.CacheWriteTokens,
		OutputTokens:      u.CompletionTokens,
		ReasoningTokens:   u.CompletionTokensDetails.ReasoningTokens,
	}
}

// chatStream accumulates the chunks of a streamed completion: text and
// refusal deltas in order, tool calls by their index (their argument text
// split over many chunks, several calls interleaved), the finish_reason,
// and the usage the last chunk carries (stream_options.include_usage).
type chatStream struct {
	model         string
	text, refusal strings.Builder
	calls         map[int64]*streamCall
	finish        string
	usage         *Usage
}

// streamCall is a tool call while its chunks arrive.
type streamCall struct {
	index    int64
	id, name string
	args     strings.Builder
}

func (a *chatStream) add(ch openai.ChatCompletionChunk) {
	if ch.Model != "" {
		a.model = ch.Model
	}
	if ch.JSON.Usage.Valid() {
		u := chatUsage(ch.Usage)
		a.usage = &u
	}
	for _, choice := range ch.Choices {
		if choice.Index != 0 {
			continue // one choice is asked for
		}
		a.text.WriteString(choice.Delta.Content)
		a.refusal.WriteString(choice.Delta.Refusal)
		for _, tc := range choice.Delta.ToolCalls {
			if a.calls == nil {
				a.calls = map[int64]*streamCall{}
			}
			call := a.calls[tc.Index]
			if call == nil {
				call = &streamCall{index: tc.Index}
				a.calls[tc.Index] = call
			}
			if tc.ID != "" {
				call.id = tc.ID
			}
			if tc.Function.Name != "" {
				call.name = tc.Function.Name
			}
			call.args.WriteString(tc.Function.Arguments)
		}
		if choice.FinishReason != "" {
			a.finish = choice.FinishReason
		}
	}
}

// completion is what the stream said, tool calls in index order.
func (a *chatStream) completion() chatCompletion {
	cc := chatCompletion{model: a.model, text: a.text.String(), refusal: a.refusal.String(), finish: a.finish, usage: a.usage}
	for _, call := range a.calls {
		cc.calls = append(cc.calls, chatCall{index: call.index, id: call.id, name: call.name, args: call.args.String()})
	}
	sort.Slice(cc.calls, func(i, j int) bool { return cc.calls[i].index < cc.calls[j].index })
	return cc
}
