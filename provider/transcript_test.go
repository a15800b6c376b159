package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/provider"
)

// The neutral requests the transcripts answer.

var answerSchema = json.RawMessage(`{"type":"object","properties":{"capital":{"type":"string"}},"required":["capital"],"additionalProperties":false}`)

// reqSimple asks one question with an output schema and a token cap.
func reqSimple() provider.Request {
	return provider.Request{
		System:          "You are a terse geography assistant.",
		Messages:        []provider.Message{{Role: provider.RoleUser, Text: "What is the capital of France? Answer in JSON."}},
		OutputSchema:    answerSchema,
		MaxOutputTokens: 256,
	}
}

var weatherTool = provider.ToolSpec{
	Name:        "get_weather",
	Description: "Current weather for a city.",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}`),
}

// uncapped takes a request's token cap away.
func uncapped(r provider.Request) provider.Request { return capped(r, 0) }

// capped sets a request's token cap.
func capped(r provider.Request, n int64) provider.Request {
	r.MaxOutputTokens = n
	return r
}

// reqTools asks a question two tool calls answer.
func reqTools() provider.Request {
	return provider.Request{
		System:   "You answer weather questions with the tools.",
		Tools:    []provider.ToolSpec{weatherTool},
		Messages: []provider.Message{{Role: provider.RoleUser, Text: "What is the weather in Paris and in Tokyo?"}},
	}
}

// An earlier turn's opaque items, one of each format that writes them.
var (
	thinkingItem = provider.Opaque{
		Kind: provider.KindAnthropicMessages, Type: "thinking",
		Data: json.RawMessage(`{"type":"thinking","thinking":"Two cities, so two get_weather calls.","signature":"EqQBCgIYAhIMthinkingSignature"}`),
	}
	reasoningItem = provider.Opaque{
		Kind: provider.KindOpenAIResponses, Type: "reasoning",
		Data: json.RawMessage(`{"type":"reasoning","id":"rs_6820f383d7c08191846711c5df8233bc","summary":[],"encrypted_content":"gAAAAABoISQ24encryptedReasoning"}`),
	}
)

// reqToolResults carries on from reqTools: the two calls made (with the
// turn's opaque items of both formats) and their results, one failed.
func reqToolResults() provider.Request {
	r := reqTools()
	r.Messages = append(r.Messages,
		provider.Message{
			Role:   provider.RoleAssistant,
			Opaque: []provider.Opaque{thinkingItem, reasoningItem},
			ToolCalls: []provider.ToolCall{
				{ID: "call_paris", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Paris"}`)},
				{ID: "call_tokyo", Name: "get_weather", Arguments: json.RawMessage(`{"location":"Tokyo"}`)},
			},
		},
		provider.Message{Role: provider.RoleTool, ToolResult: &provider.ToolResult{CallID: "call_paris", Content: "18°C, light rain"}},
		provider.Message{Role: provider.RoleTool, ToolResult: &provider.ToolResult{CallID: "call_tokyo", Content: "error: the weather service timed out", IsError: true}},
	)
	return r
}

// wireCase is one transcript: testdata/<kind>/<name>/{request.json,
// response.http}. A name starting with stream_ is sent with stream on.
type wireCase struct {
	name string
	req  provider.Request
	tier func(*provider.TierConfig)
	// want is the turn, as JSON; wantErr the failure.
	want    string
	wantErr *provider.Error
}

func usageJSON(in, cached, write, out, reasoning int64) string {
	raw, _ := json.Marshal(provider.Usage{InputTokens: in, CachedInputTokens: cached, CacheWriteTokens: write, OutputTokens: out, ReasoningTokens: reasoning})
	return string(raw)
}

// tierFor is the tier a transcript of kind is sent through.
func tierFor(kind provider.Kind, url string) provider.TierConfig {
	switch kind {
	case provider.KindAnthropicMessages:
		return provider.TierConfig{Name: "claude", Kind: kind, BaseURL: url, Model: "claude-sonnet-4-5-20250929", APIKeyEnv: anthropicKeyEnv}
	case provider.KindOpenAIResponses:
		return provider.TierConfig{Name: "responses", Kind: kind, BaseURL: url + "/v1", Model: "gpt-4.1-2025-04-14", APIKeyEnv: openaiKeyEnv}
	default:
		return provider.TierConfig{Name: "chat", Kind: kind, BaseURL: url + "/v1", Model: "gpt-4o-2024-08-06", APIKeyEnv: openaiKeyEnv}
	}
}

// runWire plays every case of kind against its transcript, and requires
// that every transcript of kind is played.
func runWire(t *testing.T, kind provider.Kind, cases []wireCase) {
	t.Helper()
	dirs, err := os.ReadDir(filepath.Join("testdata", string(kind)))
	require.NoError(t, err)
	var onDisk, inTable []string
	for _, d := range dirs {
		if d.IsDir() {
			onDisk = append(onDisk, d.Name())
		}
	}
	for _, c := range cases {
		inTable = append(inTable, c.name)
	}
	sort.Strings(inTable)
	require.Equal(t, onDisk, inTable, "every transcript is played, and every case has one")

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("testdata", string(kind), c.name)
			srv, rec := serveTranscript(t, dir)
			cfg := tierFor(kind, srv.URL)
			cfg.Stream = strings.HasPrefix(c.name, "stream_")
			if c.tier != nil {
				c.tier(&cfg)
			}
			m, err := provider.New(cfg, provider.Options{Getenv: getenv, Now: func() time.Time { return testNow }})
			require.NoError(t, err)

			turn, err := m.Complete(context.Background(), c.req)
			checkRequest(t, dir, rec)
			if c.wantErr != nil {
				require.Error(t, err)
				var pe *provider.Error
				require.True(t, errors.As(err, &pe), "%T: %v", err, err)
				require.Equal(t, c.wantErr.Kind, pe.Kind, "%v", err)
				require.Equal(t, c.wantErr.Status, pe.Status)
				require.Equal(t, c.wantErr.RetryAfter, pe.RetryAfter)
				require.Equal(t, cfg.Name, pe.Tier)
				require.Contains(t, pe.Message, c.wantErr.Message)
				require.Equal(t, provider.Retryable(c.wantErr), provider.Retryable(err))
				for _, key := range []string{openaiKey, anthropicKey, "***"} {
					require.NotContains(t, err.Error(), key)
				}
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, c.want, turnJSON(t, turn))
		})
	}
}

func TestOpenAIChatWire(t *testing.T) {
	text := `"text":"{\"capital\":\"Paris\"}"`
	runWire(t, provider.KindOpenAIChat, []wireCase{
		{name: "text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4o-2024-08-06","usage":` + usageJSON(41, 0, 0, 7, 0) + `}`},
		{name: "stream_text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4o-2024-08-06","usage":` + usageJSON(41, 0, 0, 7, 0) + `}`},
		{name: "tools_parallel", req: reqTools(),
			want: `{"tool_calls":[
				{"id":"call_JhCtNdlDQNvAvyVqnpkn5Tmq","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"call_8cUeWHZQZa1AwyDuJ1kXzm3Q","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use","model":"gpt-4o-2024-08-06","usage":` + usageJSON(68, 0, 0, 47, 0) + `}`},
		{name: "stream_tools_parallel", req: reqTools(),
			want: `{"tool_calls":[
				{"id":"call_FXoAjBUMcVv1k40fficJ9cSs","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"call_r7PmNS3ixXbVSgvwMHZjBuNH","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use","model":"gpt-4o-2024-08-06","usage":` + usageJSON(68, 0, 0, 47, 0) + `}`},
		{name: "tool_results", req: reqToolResults(),
			want: `{"text":"Paris: 18°C with light rain. I could not get the weather for Tokyo: the service timed out.",
				"stop":"end_turn","model":"gpt-4o-2024-08-06","usage":` + usageJSON(142, 0, 0, 24, 0) + `}`},
		{name: "refusal", req: reqSimple(),
			want: `{"refusal":"I'm sorry, I cannot assist with that request.","stop":"refusal","model":"gpt-4o-2024-08-06","usage":` + usageJSON(81, 0, 0, 11, 0) + `}`},
		{name: "stream_refusal", req: reqSimple(),
			want: `{"refusal":"I'm sorry, I cannot assist with that request.","stop":"refusal","model":"gpt-4o-2024-08-06","usage":` + usageJSON(81, 0, 0, 11, 0) + `}`},
		{name: "error_400", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 400, Message: "Invalid schema for response_format"}},
		{name: "error_401", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 401, Message: "Incorrect API key provided: [redacted]. You can find"}},
		{name: "error_500", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Status: 500, Message: "The server had an error"}},
		{name: "rate_limited_429", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorRateLimited, Status: 429, RetryAfter: 2500 * time.Millisecond, Message: "Rate limit reached"}},
		{name: "no_usage", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4o-2024-08-06","usage":null}`},
		{name: "stream_no_usage", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4o-2024-08-06","usage":null}`},
		{name: "cached_reasoning_usage", req: reqSimple(),
			tier: func(c *provider.TierConfig) { c.Model, c.ReasoningEffort = "o3-mini", "low" },
			want: `{` + text + `,"stop":"end_turn","model":"o3-mini-2025-01-31","usage":` + usageJSON(2006, 1920, 0, 300, 256) + `}`},
		{name: "stream_error", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Message: "The server had an error"}},
		{name: "stream_max_tokens", req: capped(reqTools(), 24),
			want: `{"tool_calls":[{"id":"call_FXoAjBUMcVv1k40fficJ9cSs","name":"get_weather","arguments":{"location":"Paris"}}],
				"stop":"max_tokens","model":"gpt-4o-2024-08-06","usage":` + usageJSON(68, 0, 0, 24, 0) + `}`},
	})
}

func TestOpenAIResponsesWire(t *testing.T) {
	text := `"text":"{\"capital\":\"Paris\"}"`
	reasoning := func(c *provider.TierConfig, effort string) { c.Model, c.ReasoningEffort = "o4-mini", effort }
	runWire(t, provider.KindOpenAIResponses, []wireCase{
		{name: "text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(36, 0, 0, 7, 0) + `}`},
		{name: "stream_text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(36, 0, 0, 7, 0) + `}`},
		{name: "tools_parallel", req: reqTools(),
			want: `{"tool_calls":[
				{"id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"call_9PnwFdW2tqfBEWfKCBrPeTjy","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(291, 0, 0, 46, 0) + `}`},
		{name: "stream_tools_parallel", req: reqTools(),
			want: `{"tool_calls":[
				{"id":"call_Kq1b9Z3pN1eT6x2gTa0YbS2v","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"call_Wd6w7VfWm3HqQJ2yUuQ8o1hR","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(291, 0, 0, 46, 0) + `}`},
		{name: "tool_results", req: reqToolResults(), tier: func(c *provider.TierConfig) { reasoning(c, "medium") },
			want: `{"text":"Paris: 18°C with light rain. I could not get the weather for Tokyo: the service timed out.",
				"stop":"end_turn","model":"o4-mini-2025-04-16","usage":` + usageJSON(412, 0, 0, 30, 0) + `}`},
		{name: "refusal", req: reqSimple(),
			want: `{"refusal":"I'm sorry, but I can't help with that.","stop":"refusal","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(81, 0, 0, 11, 0) + `}`},
		{name: "error_400", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 400, Message: "Invalid schema for response_format"}},
		{name: "error_401", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 401, Message: "Incorrect API key provided: [redacted]."}},
		{name: "error_500", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Status: 500, Message: "The server had an error"}},
		{name: "rate_limited_429", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorRateLimited, Status: 429, RetryAfter: 30 * time.Second, Message: "Rate limit reached"}},
		{name: "no_usage", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn","model":"gpt-4.1-2025-04-14","usage":null}`},
		{name: "cached_reasoning_usage", req: reqSimple(), tier: func(c *provider.TierConfig) { reasoning(c, "low") },
			want: `{` + text + `,"stop":"end_turn","model":"o4-mini-2025-04-16","usage":` + usageJSON(2006, 1920, 0, 300, 256) + `,
				"opaque":[{"kind":"openai-responses","type":"reasoning","data":{"type":"reasoning","id":"rs_68257c2f1a0c81918f5e3c2b1a0d9e8f0c8a5e1d2f3a4b5c","summary":[],"encrypted_content":"gAAAAABoJXwvQ2xvc2VkUmVhc29uaW5nSXRlbQ=="}}]}`},
		{name: "stream_failed", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Message: "The model failed to generate a response."}},
		{name: "max_tokens", req: capped(reqTools(), 24),
			want: `{"tool_calls":[{"id":"call_unLAR8MvFNptuiZK6K6HCy5k","name":"get_weather","arguments":{"location":"Paris"}}],
				"stop":"max_tokens","model":"gpt-4.1-2025-04-14","usage":` + usageJSON(291, 0, 0, 24, 0) + `}`},
	})
}

func TestAnthropicMessagesWire(t *testing.T) {
	text := `"text":"{\"capital\":\"Paris\"}"`
	const model = `"model":"claude-sonnet-4-5-20250929"`
	runWire(t, provider.KindAnthropicMessages, []wireCase{
		{name: "text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn",` + model + `,"usage":` + usageJSON(35, 0, 0, 9, 0) + `}`},
		{name: "stream_text", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn",` + model + `,"usage":` + usageJSON(35, 0, 0, 9, 0) + `}`},
		{name: "tools_parallel", req: reqTools(),
			want: `{"text":"I'll look up both cities.","tool_calls":[
				{"id":"toolu_01A09q90qw90lq917835lq9","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"toolu_01B7qX5tR2mN8vK3jH6gF4dS","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use",` + model + `,"usage":` + usageJSON(472, 0, 0, 121, 0) + `}`},
		{name: "stream_tools_parallel", req: reqTools(),
			want: `{"text":"I'll look up both cities.","tool_calls":[
				{"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","arguments":{"location":"Paris"}},
				{"id":"toolu_01Ve4L8zNqTqYnZ7c5xWm2Hk","name":"get_weather","arguments":{"location":"Tokyo"}}],
				"stop":"tool_use",` + model + `,"usage":` + usageJSON(472, 0, 0, 121, 0) + `}`},
		{name: "tool_results", req: reqToolResults(), tier: func(c *provider.TierConfig) { c.ThinkingBudgetTokens = 2048 },
			want: `{"text":"Paris: 18°C with light rain. I could not get the weather for Tokyo: the service timed out.",
				"stop":"end_turn",` + model + `,"usage":` + usageJSON(690, 0, 0, 64, 0) + `,
				"opaque":[{"kind":"anthropic-messages","type":"thinking","data":{"type":"thinking","thinking":"Paris answered; the Tokyo call failed, so say so.","signature":"ErUBCkYIBxgCIkB0dGhpbmtpbmdTaWduYXR1cmVUd28"}}]}`},
		{name: "refusal", req: reqSimple(),
			want: `{"refusal":"This request asks for help attacking systems the user does not control.","stop":"refusal",` + model + `,"usage":` + usageJSON(42, 0, 0, 1, 0) + `}`},
		{name: "error_400", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 400, Message: "'additionalProperties' must be explicitly set to false"}},
		{name: "error_401", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorClient, Status: 401, Message: "invalid x-api-key"}},
		{name: "error_500", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Status: 500, Message: "Internal server error"}},
		{name: "rate_limited_429", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorRateLimited, Status: 429, RetryAfter: 7 * time.Second, Message: "exceed the rate limit"}},
		{name: "no_usage", req: reqSimple(),
			want: `{` + text + `,"stop":"end_turn",` + model + `,"usage":null}`},
		{name: "cached_reasoning_usage", req: uncapped(reqSimple()),
			tier: func(c *provider.TierConfig) { c.ThinkingBudgetTokens = 1024 },
			want: `{` + text + `,"stop":"end_turn",` + model + `,"usage":` + usageJSON(4250, 3000, 1200, 420, 380) + `,
				"opaque":[{"kind":"anthropic-messages","type":"redacted_thinking","data":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB8URj2pLmN3kY8Qc0BA"}}]}`},
		{name: "stream_overloaded", req: reqSimple(),
			wantErr: &provider.Error{Kind: provider.ErrorServer, Message: "Overloaded"}},
		{name: "stream_max_tokens", req: capped(reqTools(), 24),
			want: `{"tool_calls":[{"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","arguments":{"location":"Paris"}}],
				"stop":"max_tokens",` + model + `,"usage":` + usageJSON(472, 0, 0, 24, 0) + `}`},
	})
}
