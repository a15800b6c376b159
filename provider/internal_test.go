package provider

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"
)

// TestUsageNormalisation reads each format's usage as its wire has it and
// requires one rule: InputTokens counts every input token, cache reads and
// writes included; OutputTokens counts reasoning. The same prompt (4250
// tokens: 3000 read from the cache, 1200 written to it) and answer (420
// tokens, 380 of them reasoning) reads the same in every format.
func TestUsageNormalisation(t *testing.T) {
	cases := []struct {
		name string
		kind Kind
		wire string
		want Usage
	}{
		{"chat plain", KindOpenAIChat,
			`{"prompt_tokens":41,"completion_tokens":7,"total_tokens":48}`,
			Usage{InputTokens: 41, OutputTokens: 7}},
		{"chat cache and reasoning", KindOpenAIChat,
			`{"prompt_tokens":4250,"completion_tokens":420,"total_tokens":4670,
			  "prompt_tokens_details":{"cached_tokens":3000,"cache_write_tokens":1200},
			  "completion_tokens_details":{"reasoning_tokens":380}}`,
			Usage{4250, 3000, 1200, 420, 380}},
		{"responses plain", KindOpenAIResponses,
			`{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":43}`,
			Usage{InputTokens: 36, OutputTokens: 7}},
		{"responses cache and reasoning", KindOpenAIResponses,
			`{"input_tokens":4250,"input_tokens_details":{"cached_tokens":3000,"cache_write_tokens":1200},
			  "output_tokens":420,"output_tokens_details":{"reasoning_tokens":380},"total_tokens":4670}`,
			Usage{4250, 3000, 1200, 420, 380}},
		{"anthropic plain", KindAnthropicMessages,
			`{"input_tokens":35,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":9}`,
			Usage{InputTokens: 35, OutputTokens: 9}},
		{"anthropic cache reads and writes are added to input", KindAnthropicMessages,
			`{"input_tokens":50,"cache_creation_input_tokens":1200,"cache_read_input_tokens":3000,
			  "output_tokens":420,"output_tokens_details":{"thinking_tokens":380}}`,
			Usage{4250, 3000, 1200, 420, 380}},
		{"anthropic without cache fields", KindAnthropicMessages,
			`{"input_tokens":12,"output_tokens":3}`,
			Usage{InputTokens: 12, OutputTokens: 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got Usage
			switch c.kind {
			case KindOpenAIChat:
				var u openai.CompletionUsage
				require.NoError(t, json.Unmarshal([]byte(c.wire), &u))
				got = chatUsage(u)
			case KindOpenAIResponses:
				var u responses.ResponseUsage
				require.NoError(t, json.Unmarshal([]byte(c.wire), &u))
				got = responsesUsage(u)
			case KindAnthropicMessages:
				var u anthropic.Usage
				require.NoError(t, json.Unmarshal([]byte(c.wire), &u))
				got = anthropicUsage(u)
			}
			require.Equal(t, c.want, got)
			require.LessOrEqual(t, got.CachedInputTokens+got.CacheWriteTokens, got.InputTokens)
			require.LessOrEqual(t, got.ReasoningTokens, got.OutputTokens)
		})
	}
}

func TestRetryable(t *testing.T) {
	for kind, want := range map[ErrorKind]bool{
		ErrorTransport: true, ErrorTimeout: true, ErrorRateLimited: true, ErrorServer: true,
		ErrorClient: false, ErrorInvalidResponse: false,
	} {
		require.Equal(t, want, Retryable(&Error{Kind: kind}), kind)
		require.Equal(t, want, Retryable(fmt.Errorf("wrapped: %w", &Error{Kind: kind})), kind)
	}
	require.False(t, Retryable(nil))
	require.False(t, Retryable(fmt.Errorf("not ours")))

	for status, want := range map[int]ErrorKind{
		400: ErrorClient, 401: ErrorClient, 403: ErrorClient, 404: ErrorClient, 408: ErrorTimeout,
		409: ErrorClient, 413: ErrorClient, 422: ErrorClient, 429: ErrorRateLimited,
		500: ErrorServer, 502: ErrorServer, 503: ErrorServer, 504: ErrorServer, 529: ErrorServer,
	} {
		require.Equal(t, want, kindOfStatus(status), status)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 10, 21, 7, 27, 30, 0, time.UTC)
	cases := []struct {
		name    string
		headers map[string]string
		want    time.Duration
	}{
		{"none", nil, 0},
		{"seconds", map[string]string{"Retry-After": "7"}, 7 * time.Second},
		{"fractional seconds", map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond},
		{"an HTTP date", map[string]string{"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, 30 * time.Second},
		{"an HTTP date passed", map[string]string{"Retry-After": "Wed, 21 Oct 2026 07:00:00 GMT"}, 0},
		{"milliseconds", map[string]string{"retry-after-ms": "2500"}, 2500 * time.Millisecond},
		{"milliseconds first", map[string]string{"retry-after-ms": "250", "Retry-After": "1"}, 250 * time.Millisecond},
		{"bad milliseconds fall back", map[string]string{"retry-after-ms": "soon", "Retry-After": "2"}, 2 * time.Second},
		{"negative", map[string]string{"Retry-After": "-3"}, 0},
		{"garbage", map[string]string{"Retry-After": "later"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.headers {
				h.Set(k, v)
			}
			require.Equal(t, c.want, retryAfter(h, now))
		})
	}
}

func TestSecretNeverPrints(t *testing.T) {
	key := secret("sk-live-abcdefghijklmnop")
	for _, format := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x"} {
		require.Equal(t, "[redacted]", fmt.Sprintf(format, key), format)
	}
	require.Equal(t, "bad key [redacted], or ([redacted]).", key.scrub("bad key sk-live-abcdefghijklmnop, or (sk-live***mnop)."))

	for _, kind := range []Kind{KindOpenAIChat, KindOpenAIResponses, KindAnthropicMessages} {
		m, err := New(TierConfig{Name: "t", Kind: kind, Model: "m", APIKeyEnv: "K"},
			Options{Getenv: func(string) string { return string(key) }})
		require.NoError(t, err)
		require.NotContains(t, fmt.Sprintf("%+v %#v", m, m), string(key), kind)
	}
}

func TestStreamErrorKind(t *testing.T) {
	for s, want := range map[string]ErrorKind{
		"server_error": ErrorServer, "overloaded_error": ErrorServer, "api_error": ErrorServer, "": ErrorServer,
		"rate_limit_error": ErrorRateLimited, "requests rate_limit_exceeded": ErrorRateLimited,
		"invalid_request_error": ErrorClient, "invalid_prompt": ErrorClient, "authentication_error": ErrorClient,
		"permission_error": ErrorClient, "not_found_error": ErrorClient,
	} {
		require.Equal(t, want, streamErrorKind(s), s)
	}
}

func TestRequestValidation(t *testing.T) {
	user := Message{Role: RoleUser, Text: "hi"}
	call := Message{Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "c1", Name: "f", Arguments: json.RawMessage(`{}`)}}}
	cases := []struct {
		name string
		req  Request
		want string
	}{
		{"no messages", Request{}, "no messages"},
		{"a schema that is no object", Request{Messages: []Message{user}, OutputSchema: json.RawMessage(`[1]`)}, "output_schema is not a JSON object"},
		{"a negative cap", Request{Messages: []Message{user}, MaxOutputTokens: -1}, "max_output_tokens is negative"},
		{"a nameless tool", Request{Messages: []Message{user}, Tools: []ToolSpec{{}}}, "tools[0]: no name"},
		{"a tool twice", Request{Messages: []Message{user}, Tools: []ToolSpec{{Name: "f"}, {Name: "f"}}}, `tools[1]: "f" declared twice`},
		{"a tool schema that is no object", Request{Messages: []Message{user}, Tools: []ToolSpec{{Name: "f", InputSchema: json.RawMessage(`"x"`)}}}, "input_schema is not a JSON object"},
		{"an empty user message", Request{Messages: []Message{{Role: RoleUser}}}, "messages[0]: a user message has text and nothing else"},
		{"an unknown role", Request{Messages: []Message{{Role: "system", Text: "x"}}}, `unknown role "system"`},
		{"an empty assistant message", Request{Messages: []Message{user, {Role: RoleAssistant}}}, "messages[1]: empty assistant message"},
		{"arguments that are no object", Request{Messages: []Message{user, {Role: RoleAssistant, ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: json.RawMessage(`[]`)}}}}}, "arguments are not a JSON object"},
		{"a call without id", Request{Messages: []Message{user, {Role: RoleAssistant, ToolCalls: []ToolCall{{Name: "f"}}}}}, "tool_calls[0]: no id or name"},
		{"an opaque item without data", Request{Messages: []Message{user, {Role: RoleAssistant, Opaque: []Opaque{{Kind: KindAnthropicMessages, Type: "thinking"}}}}}, "opaque[0]: needs kind, type and JSON data"},
		{"a result of no call", Request{Messages: []Message{user, {Role: RoleTool, ToolResult: &ToolResult{CallID: "c9"}}}}, `tool result for "c9", which no earlier tool call has`},
		{"a tool message with text", Request{Messages: []Message{user, call, {Role: RoleTool, Text: "x", ToolResult: &ToolResult{CallID: "c1"}}}}, "a tool message has a tool result and nothing else"},
		{"fine", Request{Messages: []Message{user, call, {Role: RoleTool, ToolResult: &ToolResult{CallID: "c1", Content: "ok"}}}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.req.validate()
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, errInvalidRequest)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestDrops(t *testing.T) {
	thinking := Opaque{Kind: KindAnthropicMessages, Type: "thinking", Data: json.RawMessage(`{"type":"thinking","thinking":"t","signature":"s"}`)}
	redacted := Opaque{Kind: KindAnthropicMessages, Type: "redacted_thinking", Data: json.RawMessage(`{"type":"redacted_thinking","data":"d"}`)}
	sealed := Opaque{Kind: KindOpenAIResponses, Type: "reasoning", Data: json.RawMessage(`{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"}`)}
	bare := Opaque{Kind: KindOpenAIResponses, Type: "reasoning", Data: json.RawMessage(`{"type":"reasoning","id":"rs_2","summary":[]}`)}
	req := Request{Messages: []Message{
		{Role: RoleUser, Text: "q"},
		{Role: RoleAssistant, Text: "a", Opaque: []Opaque{thinking, sealed}},
		{Role: RoleUser, Text: "q2"},
		{Role: RoleAssistant, Text: "b", Opaque: []Opaque{thinking, redacted, bare}},
	}}
	require.Equal(t, []Drop{
		{Kind: KindOpenAIResponses, Type: "reasoning", Count: 2, Reason: DropOtherFormat},
	}, drops(KindAnthropicMessages, req))
	require.Equal(t, []Drop{
		{Kind: KindAnthropicMessages, Type: "redacted_thinking", Count: 1, Reason: DropOtherFormat},
		{Kind: KindAnthropicMessages, Type: "thinking", Count: 2, Reason: DropOtherFormat},
		{Kind: KindOpenAIResponses, Type: "reasoning", Count: 1, Reason: DropNoEncryptedContent},
	}, drops(KindOpenAIResponses, req))
	require.Len(t, drops(KindOpenAIChat, req), 3)
	require.Equal(t, []Opaque{sealed}, keptOpaque(KindOpenAIResponses, []Opaque{thinking, sealed, bare}))
	require.Equal(t, []Opaque{thinking, redacted}, keptOpaque(KindAnthropicMessages, []Opaque{thinking, sealed, redacted}))
}

// TestResponsesStreamDeltas feeds a stream whose items never get their
// done event: the text, refusal and arguments come from the deltas alone,
// in output_index order whatever order the events came in.
func TestResponsesStreamDeltas(t *testing.T) {
	events := []string{
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":""}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","role":"assistant","content":[]}}`,
		`{"type":"response.function_call_arguments.delta","output_index":1,"item_id":"fc_1","delta":"{\"location\":"}`,
		`{"type":"response.output_text.delta","output_index":0,"item_id":"msg_1","content_index":0,"delta":"Let me "}`,
		`{"type":"response.function_call_arguments.delta","output_index":1,"item_id":"fc_1","delta":"\"Paris\"}"}`,
		`{"type":"response.output_text.delta","output_index":0,"item_id":"msg_1","content_index":0,"delta":"check."}`,
		`{"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[]}}`,
	}
	var s responsesStream
	for _, e := range events {
		var ev responses.ResponseStreamEventUnion
		require.NoError(t, json.Unmarshal([]byte(e), &ev))
		s.add(ev)
	}
	require.NotNil(t, s.final)
	items := s.items()
	require.Len(t, items, 2)
	require.JSONEq(t, `{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Let me check."}]}`, string(items[0]))
	require.JSONEq(t, `{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"location\":\"Paris\"}"}`, string(items[1]))
}

func TestDeterministicTier(t *testing.T) {
	m, err := New(TierConfig{Name: "canned", Kind: KindDeterministic, Text: "I cannot reach a model now."}, Options{})
	require.NoError(t, err)
	turn, err := m.Complete(t.Context(), Request{})
	require.NoError(t, err)
	require.Equal(t, Turn{Text: "I cannot reach a model now.", Stop: StopEndTurn, Usage: &Usage{}, Model: "deterministic"}, turn)
	require.Equal(t, KindDeterministic, m.Kind())
	require.Equal(t, "canned", m.Name())

	_, err = New(TierConfig{Name: "x", Kind: KindDeterministic, Answer: json.RawMessage(`{`)}, Options{})
	require.ErrorContains(t, err, "answer: not JSON")
}
