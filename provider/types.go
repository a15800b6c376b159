package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Role says who wrote a Message.
type Role string

// Roles of a transcript.
const (
	RoleUser      Role = "user"      // the person or the run's input: Text
	RoleAssistant Role = "assistant" // the model: Text, ToolCalls, Opaque
	RoleTool      Role = "tool"      // a tool's answer to one call: ToolResult
)

// Request is what a model is asked: a system prompt, the transcript so far,
// the tools it may call and, optionally, the JSON Schema its final answer
// must meet.
type Request struct {
	System   string     `json:"system,omitempty"`
	Messages []Message  `json:"messages"`
	Tools    []ToolSpec `json:"tools,omitempty"`
	// OutputSchema is a JSON Schema (an object) for the final answer's text.
	// How each format passes it, and which enforce it, is in docs/providers.md;
	// the caller still validates the answer.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// MaxOutputTokens caps the answer; 0 takes the tier's max_output_tokens.
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
}

// Message is one entry of the transcript.
type Message struct {
	Role Role   `json:"role"`
	Text string `json:"text,omitempty"`
	// ToolCalls are the calls an assistant message made, in order.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolResult is a tool message's answer.
	ToolResult *ToolResult `json:"tool_result,omitempty"`
	// Opaque are an assistant message's items only their own wire format
	// can read back; they are sent back before the text and tool calls.
	Opaque []Opaque `json:"opaque,omitempty"`
}

// ToolCall is one call a model asked for.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"` // a JSON object
}

// ToolResult is a tool's answer to the call with CallID.
type ToolResult struct {
	CallID  string `json:"call_id"`
	Content string `json:"content"`
	// IsError marks a failed call. Anthropic Messages carries it
	// (tool_result.is_error); the OpenAI formats have no such field and get
	// Content alone, so say so in Content too.
	IsError bool `json:"is_error,omitempty"`
}

// Opaque is a provider item that only the wire format that wrote it can
// read back: an OpenAI Responses reasoning item (with encrypted_content),
// an Anthropic thinking or redacted_thinking block (with its signature).
type Opaque struct {
	Kind Kind            `json:"kind"` // the adapter that wrote it
	Type string          `json:"type"` // the item's own type: reasoning, thinking, redacted_thinking
	Data json.RawMessage `json:"data"` // the item as the provider sent it
}

// ToolSpec declares a tool the model may call.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"` // a JSON Schema object; empty means any object
}

// StopReason says why a model stopped.
type StopReason string

// Stop reasons. The mapping of each wire format's values is in
// docs/providers.md and in each adapter's stop function.
const (
	StopEndTurn       StopReason = "end_turn"       // a finished answer
	StopToolUse       StopReason = "tool_use"       // the model waits for its tool calls' results
	StopMaxTokens     StopReason = "max_tokens"     // cut at the output (or context) limit
	StopRefusal       StopReason = "refusal"        // the model declined: Turn.Refusal says why
	StopContentFilter StopReason = "content_filter" // the provider withheld content
	StopOther         StopReason = "other"          // anything else the provider said
)

// Turn is a model's answer.
type Turn struct {
	Text string `json:"text,omitempty"`
	// ToolCalls are in the order the model gave them.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Refusal is set when the model declined (Stop is StopRefusal): an
	// answer, not an error.
	Refusal string     `json:"refusal,omitempty"`
	Stop    StopReason `json:"stop"`
	// Usage is nil when the provider reported none: token accounting is
	// unavailable for this turn, which is not the same as zero.
	Usage *Usage `json:"usage"`
	// Opaque are the turn's items to send back with it (see Opaque).
	Opaque []Opaque `json:"opaque,omitempty"`
	// Model is the model that answered, as the provider named it.
	Model string `json:"model,omitempty"`
}

// Message returns the turn as the assistant message to append to the
// transcript.
func (t Turn) Message() Message {
	text := t.Text
	if text == "" && t.Refusal != "" {
		text = t.Refusal
	}
	return Message{Role: RoleAssistant, Text: text, ToolCalls: t.ToolCalls, Opaque: t.Opaque}
}

// Usage is what one turn consumed, normalised the same way for every
// format:
//
//   - InputTokens is every input token billed, cache reads and cache
//     writes included;
//   - CachedInputTokens is the cache reads among them;
//   - CacheWriteTokens is the cache writes among them;
//   - OutputTokens is every output token, reasoning included;
//   - ReasoningTokens is the reasoning among them.
//
// OpenAI's prompt/input tokens already include cached tokens; Anthropic's
// input_tokens exclude cache_read_input_tokens and
// cache_creation_input_tokens, so its adapter adds them.
type Usage struct {
	InputTokens       int64 `json:"input_tokens"`
	CachedInputTokens int64 `json:"cached_input_tokens"`
	CacheWriteTokens  int64 `json:"cache_write_tokens"`
	OutputTokens      int64 `json:"output_tokens"`
	ReasoningTokens   int64 `json:"reasoning_tokens"`
}

// errInvalidRequest marks a Request this package refuses before sending it.
var errInvalidRequest = errors.New("invalid request")

// validate checks a request before any adapter sends it; the error wraps
// errInvalidRequest.
func (r Request) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", errInvalidRequest, fmt.Sprintf(format, a...))
	}
	if len(r.Messages) == 0 {
		return bad("no messages")
	}
	if len(r.OutputSchema) > 0 && !isObject(r.OutputSchema) {
		return bad("output_schema is not a JSON object")
	}
	if r.MaxOutputTokens < 0 {
		return bad("max_output_tokens is negative")
	}
	names := map[string]bool{}
	for i, t := range r.Tools {
		switch {
		case t.Name == "":
			return bad("tools[%d]: no name", i)
		case names[t.Name]:
			return bad("tools[%d]: %q declared twice", i, t.Name)
		case len(t.InputSchema) > 0 && !isObject(t.InputSchema):
			return bad("tools[%d]: input_schema is not a JSON object", i)
		}
		names[t.Name] = true
	}
	calls := map[string]bool{}
	for i, m := range r.Messages {
		if err := m.validate(calls); err != nil {
			return bad("messages[%d]: %v", i, err)
		}
	}
	return nil
}

// validate checks one message; calls holds the ids of the tool calls made
// before it, and gains this message's.
func (m Message) validate(calls map[string]bool) error {
	switch m.Role {
	case RoleUser:
		if m.Text == "" || len(m.ToolCalls) > 0 || m.ToolResult != nil || len(m.Opaque) > 0 {
			return errors.New("a user message has text and nothing else")
		}
	case RoleAssistant:
		if m.ToolResult != nil {
			return errors.New("an assistant message has no tool result")
		}
		if m.Text == "" && len(m.ToolCalls) == 0 && len(m.Opaque) == 0 {
			return errors.New("empty assistant message")
		}
		for j, c := range m.ToolCalls {
			if c.ID == "" || c.Name == "" {
				return fmt.Errorf("tool_calls[%d]: no id or name", j)
			}
			if len(c.Arguments) > 0 && !isObject(c.Arguments) {
				return fmt.Errorf("tool_calls[%d]: arguments are not a JSON object", j)
			}
			calls[c.ID] = true
		}
		for j, o := range m.Opaque {
			if o.Kind == "" || o.Type == "" || !json.Valid(o.Data) {
				return fmt.Errorf("opaque[%d]: needs kind, type and JSON data", j)
			}
		}
	case RoleTool:
		if m.ToolResult == nil || m.Text != "" || len(m.ToolCalls) > 0 || len(m.Opaque) > 0 {
			return errors.New("a tool message has a tool result and nothing else")
		}
		if !calls[m.ToolResult.CallID] {
			return fmt.Errorf("tool result for %q, which no earlier tool call has", m.ToolResult.CallID)
		}
	default:
		return fmt.Errorf("unknown role %q", m.Role)
	}
	return nil
}

// isObject reports whether raw is a JSON object.
func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

// arguments returns a tool call's arguments as sent: an empty value is the
// empty object.
func arguments(raw json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage(`{}`)
	}
	return raw
}

// rawCall is a tool call as a provider gave it, its arguments as text.
type rawCall struct {
	id, name, args string
}

// toolCalls parses the turn's calls in order. A call whose arguments are
// not a JSON object fails the turn (invalid_response), unless the turn was
// cut at its token cap: then the call was cut off mid-arguments and is
// left out, and the turn's max_tokens stop says so.
func toolCalls(raw []rawCall, stop StopReason) ([]ToolCall, error) {
	var out []ToolCall
	for _, c := range raw {
		args := json.RawMessage(bytes.TrimSpace([]byte(c.args)))
		if len(args) == 0 {
			args = json.RawMessage(`{}`)
		}
		if !isObject(args) {
			if stop == StopMaxTokens {
				continue
			}
			return nil, fmt.Errorf("tool call %s (%s): arguments are not a JSON object", c.id, c.name)
		}
		out = append(out, ToolCall{ID: c.id, Name: c.name, Arguments: args})
	}
	return out, nil
}

// schemaMap decodes a JSON Schema for the SDKs' map-typed fields, keeping
// numbers exact.
func schemaMap(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 {
		return map[string]any{"type": "object"}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}
