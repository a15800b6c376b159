package provider

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
)

// responsesAPI is the openai-responses adapter: OpenAI Responses.
//
// Requests are stateless (store: false): the ledger keeps the transcript
// and sends it whole as input items. The system prompt is instructions; an
// assistant message becomes its reasoning items (this format's Opaque,
// sent back verbatim, but only with encrypted_content, which a stateless
// request needs), a message and its function_call items; a tool result is
// a function_call_output with its call_id. Tools are function tools and
// the output schema is text.format json_schema, both with strict off
// (strict mode refuses schemas outside its subset): the API steers the
// answer but does not guarantee it. With the tier's reasoning_effort set,
// it asks for reasoning.encrypted_content.
type responsesAPI struct {
	*remote
	svc responses.ResponseService
}

func newResponses(r *remote) *responsesAPI {
	return &responsesAPI{remote: r, svc: responses.NewResponseService(openaiOptions(r)...)}
}

// Complete implements Model.
func (a *responsesAPI) Complete(ctx context.Context, req Request) (Turn, error) {
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
	if !a.stream {
		resp, err := a.svc.New(tctx, p, option.WithResponseInto(&res))
		if err != nil {
			return Turn{}, a.classify(ctx, tctx, openaiFailure(err, res))
		}
		return a.turn(ctx, tctx, resp, rawItems(resp.Output))
	}
	stream := a.svc.NewStreaming(tctx, p, option.WithResponseInto(&res))
	defer func() { _ = stream.Close() }()
	var acc responsesStream
	for stream.Next() {
		acc.add(stream.Current())
	}
	if err := stream.Err(); err != nil {
		return Turn{}, a.classify(ctx, tctx, openaiFailure(err, res))
	}
	switch {
	case acc.errKind != "":
		return Turn{}, a.classify(ctx, tctx, failure{kind: acc.errKind, message: acc.errMessage})
	case acc.final == nil:
		return Turn{}, a.classify(ctx, tctx, failure{kind: ErrorTransport, message: "the stream ended before response.completed"})
	}
	items := acc.items()
	if len(items) == 0 { // a terminal event that alone carries the output
		items = rawItems(acc.final.Output)
	}
	return a.turn(ctx, tctx, acc.final, items)
}

// params translates req into a Responses request.
func (a *responsesAPI) params(req Request) (responses.ResponseNewParams, error) {
	p := responses.ResponseNewParams{Model: a.model, Store: param.NewOpt(false)}
	if req.System != "" {
		p.Instructions = param.NewOpt(req.System)
	}
	var items responses.ResponseInputParam
	for _, m := range req.Messages {
		switch m.Role {
		case RoleUser:
			items = append(items, responses.ResponseInputItemParamOfMessage(m.Text, responses.EasyInputMessageRoleUser))
		case RoleTool:
			out := responses.ResponseInputItemParamOfFunctionCallOutput(m.ToolResult.Content)
			out.OfFunctionCallOutput.CallID = param.NewOpt(m.ToolResult.CallID)
			items = append(items, out)
		case RoleAssistant:
			for _, o := range keptOpaque(a.kind, m.Opaque) {
				items = append(items, param.Override[responses.ResponseInputItemUnionParam](o.Data))
			}
			if m.Text != "" {
				items = append(items, responses.ResponseInputItemParamOfMessage(m.Text, responses.EasyInputMessageRoleAssistant))
			}
			for _, tc := range m.ToolCalls {
				items = append(items, responses.ResponseInputItemParamOfFunctionCall(string(arguments(tc.Arguments)), tc.ID, tc.Name))
			}
		}
	}
	p.Input.OfInputItemList = items
	for _, t := range req.Tools {
		schema, err := schemaMap(t.InputSchema)
		if err != nil {
			return p, fmt.Errorf("tool %s: input_schema: %w", t.Name, err)
		}
		fn := &responses.FunctionToolParam{Name: t.Name, Parameters: schema, Strict: param.NewOpt(false)}
		if t.Description != "" {
			fn.Description = param.NewOpt(t.Description)
		}
		p.Tools = append(p.Tools, responses.ToolUnionParam{OfFunction: fn})
	}
	if len(req.OutputSchema) > 0 {
		schema, err := schemaMap(req.OutputSchema)
		if err != nil {
			return p, fmt.Errorf("output_schema: %w", err)
		}
		p.Text.Format.OfJSONSchema = &responses.ResponseFormatTextJSONSchemaConfigParam{
			Name: "answer", Schema: schema, Strict: param.NewOpt(false),
		}
	}
	if n := a.maxTokens(req); n > 0 {
		p.MaxOutputTokens = param.NewOpt(n)
	}
	if a.effort != "" {
		p.Reasoning = shared.ReasoningParam{Effort: shared.ReasoningEffort(a.effort)}
		p.Include = []responses.ResponseIncludable{responses.ResponseIncludableReasoningEncryptedContent}
	}
	return p, nil
}

// responseItem is the part of an output item this adapter reads.
type responseItem struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Content   []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	} `json:"content"`
}

// rawItems returns each output item as the provider sent it.
func rawItems(output []responses.ResponseOutputItemUnion) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(output))
	for _, it := range output {
		if raw := it.RawJSON(); raw != "" {
			out = append(out, json.RawMessage(raw))
		}
	}
	return out
}

// turn reads a response's status, usage and output items into a Turn. A
// failed response is an error, classified by its error code.
func (a *responsesAPI) turn(ctx, tctx context.Context, resp *responses.Response, items []json.RawMessage) (Turn, error) {
	if resp.Status == "failed" {
		return Turn{}, a.classify(ctx, tctx, failure{kind: streamErrorKind(string(resp.Error.Code)), message: resp.Error.Message})
	}
	t := Turn{Model: resp.Model}
	if t.Model == "" {
		t.Model = a.model
	}
	var text, refusal strings.Builder
	var calls []rawCall
	for _, raw := range items {
		var it responseItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return Turn{}, a.invalid(ErrorInvalidResponse, fmt.Errorf("an output item: %w", err))
		}
		switch it.Type {
		case "message":
			for _, c := range it.Content {
				text.WriteString(c.Text)
				refusal.WriteString(c.Refusal)
			}
		case "function_call":
			calls = append(calls, rawCall{id: it.CallID, name: it.Name, args: it.Arguments})
		case "reasoning":
			t.Opaque = append(t.Opaque, Opaque{Kind: a.kind, Type: it.Type, Data: raw})
		}
	}
	t.Text, t.Refusal = text.String(), refusal.String()
	t.Stop = responsesStop(string(resp.Status), resp.IncompleteDetails.Reason, t.Refusal != "", len(calls) > 0)
	var err error
	if t.ToolCalls, err = toolCalls(calls, t.Stop); err != nil {
		return Turn{}, a.invalid(ErrorInvalidResponse, err)
	}
	if resp.JSON.Usage.Valid() {
		u := responsesUsage(resp.Usage)
		t.Usage = &u
	}
	return t, nil
}

// responsesStop maps a response's status: completed → tool_use when it
// has function calls, else end_turn; incomplete with reason
// max_output_tokens → max_tokens, with content_filter → content_filter;
// anything else → other; refusal content → refusal whatever the status.
func responsesStop(status, incomplete string, refused, calls bool) StopReason {
	switch {
	case refused:
		return StopRefusal
	case status == "incomplete" && incomplete == "max_output_tokens":
		return StopMaxTokens
	case status == "incomplete" && incomplete == "content_filter":
		return StopContentFilter
	case status == "completed" && calls:
		return StopToolUse
	case status == "completed":
		return StopEndTurn
	}
	return StopOther
}

// responsesUsage normalises Responses usage: input_tokens already include
// cached_tokens and cache_write_tokens, output_tokens include
// reasoning_tokens.
func responsesUsage(u responses.ResponseUsage) Usage {
	return Usage{
		InputTokens:       u.InputTokens,
		CachedInputTokens: u.InputTokensDetails.CachedTokens,
		CacheWriteTokens:  u.InputTokensDetails.CacheWriteTokens,
		OutputTokens:      u.OutputTokens,
		ReasoningTokens:   u.OutputTokensDetails.ReasoningTokens,
	}
}

// responsesStream accumulates a streamed response: output items by
// output_index as announced (response.output_item.added), their text,
// refusal and argument deltas, each replaced whole by its
// response.output_item.done; the terminal event's response (completed,
// incomplete, failed) for status and usage, and for the output only when
// no item was streamed; an error event.
type responsesStream struct {
	byIndex    map[int64]*streamItem
	final      *responses.Response
	errKind    ErrorKind
	errMessage string
}

// streamItem is an output item while its events arrive.
type streamItem struct {
	index              int64
	raw                json.RawMessage
	done               bool
	text, refusal, arg strings.Builder
}

func (s *responsesStream) add(ev responses.ResponseStreamEventUnion) {
	item := func() *streamItem {
		if s.byIndex == nil {
			s.byIndex = map[int64]*streamItem{}
		}
		it := s.byIndex[ev.OutputIndex]
		if it == nil {
			it = &streamItem{index: ev.OutputIndex}
			s.byIndex[ev.OutputIndex] = it
		}
		return it
	}
	switch ev.Type {
	case "response.output_item.added":
		item().raw = json.RawMessage(ev.Item.RawJSON())
	case "response.output_item.done":
		it := item()
		it.raw, it.done = json.RawMessage(ev.Item.RawJSON()), true
	case "response.output_text.delta":
		item().text.WriteString(ev.Delta)
	case "response.refusal.delta":
		item().refusal.WriteString(ev.Delta)
	case "response.function_call_arguments.delta":
		item().arg.WriteString(ev.Delta)
	case "response.completed", "response.incomplete", "response.failed":
		resp := ev.Response
		s.final = &resp
	case "error":
		s.errKind, s.errMessage = streamErrorKind(ev.Code), ev.Message
	}
}

// items returns the streamed output items in index order: an item whose
// done event came as that event gave it, any other as announced with its
// deltas applied.
func (s *responsesStream) items() []json.RawMessage {
	list := make([]*streamItem, 0, len(s.byIndex))
	for _, it := range s.byIndex {
		list = append(list, it)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].index < list[j].index })
	out := make([]json.RawMessage, 0, len(list))
	for _, it := range list {
		if it.done || len(it.raw) == 0 {
			if len(it.raw) > 0 {
				out = append(out, it.raw)
			}
			continue
		}
		var obj map[string]any
		if json.Unmarshal(it.raw, &obj) != nil {
			continue
		}
		switch obj["type"] {
		case "message":
			var content []map[string]string
			if it.text.Len() > 0 {
				content = append(content, map[string]string{"type": "output_text", "text": it.text.String()})
			}
			if it.refusal.Len() > 0 {
				content = append(content, map[string]string{"type": "refusal", "refusal": it.refusal.String()})
			}
			obj["content"] = content
		case "function_call":
			obj["arguments"] = it.arg.String()
		}
		raw, _ := json.Marshal(obj)
		out = append(out, raw)
	}
	return out
}
