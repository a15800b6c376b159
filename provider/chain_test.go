package provider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/provider"
)

// failing is a tier's server that fails every request its own way, and
// counts them.
type failing struct {
	srv   *httptest.Server
	calls atomic.Int32
}

func newFailing(t *testing.T, h http.HandlerFunc) *failing {
	t.Helper()
	f := &failing{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		// Read the request whole: only then does the server watch the
		// connection, and end r.Context() when the client gives up.
		_, _ = io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// status answers with an HTTP status, headers and a JSON body.
func status(code int, body string, headers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}
}

// dropped closes the connection before any answer.
func dropped(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }

// droppedMidStream starts a streamed answer, then closes the connection.
func droppedMidStream(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write([]byte(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Par"},"finish_reason":null}]}` + "\n\n"))
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

// cutShort ends a streamed answer cleanly, but before its finish_reason.
func cutShort(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write([]byte(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Par"},"finish_reason":null}]}` + "\n\n"))
}

// hang never answers: it waits until the client gives up.
func hang(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

// chatTier, claudeTier and fallback build the tiers of the chains below.
func chatTier(name, url string) provider.TierConfig {
	return provider.TierConfig{Name: name, Kind: provider.KindOpenAIChat, BaseURL: url + "/v1", Model: "gpt-4o-2024-08-06", APIKeyEnv: openaiKeyEnv}
}

func responsesTier(name, url string) provider.TierConfig {
	return provider.TierConfig{Name: name, Kind: provider.KindOpenAIResponses, BaseURL: url + "/v1", Model: "gpt-4.1-2025-04-14", APIKeyEnv: openaiKeyEnv}
}

func claudeTier(name, url string) provider.TierConfig {
	return provider.TierConfig{Name: name, Kind: provider.KindAnthropicMessages, BaseURL: url, Model: "claude-sonnet-4-5-20250929", APIKeyEnv: anthropicKeyEnv}
}

var fallback = provider.TierConfig{Name: "canned", Kind: provider.KindDeterministic, Answer: json.RawMessage(`{"status": "degraded", "capital": null}`)}

func newChain(t *testing.T, tiers ...provider.TierConfig) *provider.Chain {
	t.Helper()
	c, err := provider.NewChain(tiers, provider.Options{Getenv: getenv, Now: func() time.Time { return testNow }})
	require.NoError(t, err)
	return c
}

func TestChainFallsBackOnRetryableFailures(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		stream  bool
		timeout int64
		want    provider.Failure
	}{
		{name: "503", handler: status(503, `{"error":{"message":"The engine is currently overloaded, please try again later","type":"server_error"}}`),
			want: provider.Failure{Kind: provider.ErrorServer, Status: 503, Message: "The engine is currently overloaded, please try again later"}},
		{name: "503 without a JSON body", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(503)
			_, _ = w.Write([]byte("upstream connect error or disconnect/reset before headers"))
		}, want: provider.Failure{Kind: provider.ErrorServer, Status: 503, Message: "Service Unavailable"}},
		{name: "429", handler: status(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "3"),
			want: provider.Failure{Kind: provider.ErrorRateLimited, Status: 429, RetryAfterMS: 3000, Message: "Rate limit reached"}},
		{name: "408", handler: status(408, `{"error":{"message":"Request timed out."}}`),
			want: provider.Failure{Kind: provider.ErrorTimeout, Status: 408, Message: "Request timed out."}},
		{name: "dropped connection", handler: dropped,
			want: provider.Failure{Kind: provider.ErrorTransport}},
		{name: "dropped mid-stream", handler: droppedMidStream, stream: true,
			want: provider.Failure{Kind: provider.ErrorTransport}},
		{name: "stream cut short", handler: cutShort, stream: true,
			want: provider.Failure{Kind: provider.ErrorTransport, Message: "the stream ended before a finish_reason"}},
		{name: "timeout", handler: hang, timeout: 50,
			want: provider.Failure{Kind: provider.ErrorTimeout, Message: "no answer within 50ms"}},
		{name: "timeout mid-stream", handler: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Par"},"finish_reason":null}]}` + "\n\n"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, stream: true, timeout: 50,
			want: provider.Failure{Kind: provider.ErrorTimeout, Message: "no answer within 50ms"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			first := newFailing(t, c.handler)
			second, rec := serveTranscript(t, filepath.Join("testdata", "anthropic-messages", "text"))
			tier1 := chatTier("gpt", first.srv.URL)
			tier1.Stream, tier1.TimeoutMS = c.stream, c.timeout
			chain := newChain(t, tier1, claudeTier("claude", second.URL), fallback)

			ans, err := chain.Complete(context.Background(), reqSimple())
			require.NoError(t, err)
			require.Equal(t, "claude", ans.Tier)
			require.Equal(t, 1, ans.TierIndex)
			require.Equal(t, provider.KindAnthropicMessages, ans.Kind)
			require.False(t, ans.Degraded)
			require.Equal(t, `{"capital":"Paris"}`, ans.Turn.Text)
			require.Equal(t, int32(1), first.calls.Load(), "one try: the SDK does not retry")
			require.Equal(t, 1, rec.requests())

			require.Len(t, ans.Failures, 1)
			got := ans.Failures[0]
			require.Equal(t, "gpt", got.Tier)
			require.Equal(t, 0, got.TierIndex)
			require.Equal(t, c.want.Kind, got.Kind, got.Message)
			require.Equal(t, c.want.Status, got.Status)
			require.Equal(t, c.want.RetryAfterMS, got.RetryAfterMS)
			require.Contains(t, got.Message, c.want.Message)
		})
	}
}

func TestChainAnswersWithARefusal(t *testing.T) {
	t.Parallel()
	first, _ := serveTranscript(t, filepath.Join("testdata", "openai-chat", "refusal"))
	second := newFailing(t, status(500, `{}`))
	chain := newChain(t, chatTier("gpt", first.URL), claudeTier("claude", second.srv.URL), fallback)

	ans, err := chain.Complete(context.Background(), reqSimple())
	require.NoError(t, err)
	require.Equal(t, "gpt", ans.Tier)
	require.Equal(t, provider.StopRefusal, ans.Turn.Stop)
	require.Equal(t, "I'm sorry, I cannot assist with that request.", ans.Turn.Refusal)
	require.Empty(t, ans.Failures)
	require.False(t, ans.Degraded)
	require.Zero(t, second.calls.Load(), "a refusal is an answer: no other tier is asked")
}

func TestChainReturnsAClientError(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 422} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			t.Parallel()
			first := newFailing(t, status(code, `{"type":"error","error":{"type":"invalid_request_error","message":"messages: field required"}}`))
			second := newFailing(t, status(500, `{}`))
			chain := newChain(t, claudeTier("claude", first.srv.URL), chatTier("gpt", second.srv.URL), fallback)

			ans, err := chain.Complete(context.Background(), reqSimple())
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			require.Equal(t, provider.ErrorClient, pe.Kind)
			require.Equal(t, code, pe.Status)
			require.Equal(t, "claude", pe.Tier)
			require.Contains(t, pe.Message, "messages: field required")
			require.False(t, provider.Retryable(err))
			require.Empty(t, ans.Failures)
			require.Zero(t, second.calls.Load(), "the request's own fault: no other tier is asked")
		})
	}
}

func TestChainDegradesToTheDeterministicTier(t *testing.T) {
	t.Parallel()
	first := newFailing(t, status(529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
	second := newFailing(t, dropped)
	chain := newChain(t, claudeTier("claude", first.srv.URL), responsesTier("gpt", second.srv.URL), fallback)

	ans, err := chain.Complete(context.Background(), reqSimple())
	require.NoError(t, err)
	require.True(t, ans.Degraded)
	require.Equal(t, "canned", ans.Tier)
	require.Equal(t, 2, ans.TierIndex)
	require.Equal(t, provider.KindDeterministic, ans.Kind)
	require.Equal(t, `{"status":"degraded","capital":null}`, ans.Turn.Text)
	require.Equal(t, provider.StopEndTurn, ans.Turn.Stop)
	require.NotNil(t, ans.Turn.Usage, "the deterministic tier used nothing, and knows it")
	require.Equal(t, provider.Usage{}, *ans.Turn.Usage)
	require.Len(t, ans.Failures, 2)
	require.Equal(t, provider.Failure{Tier: "claude", TierIndex: 0, Kind: provider.ErrorServer, Status: 529, Message: "Overloaded"}, ans.Failures[0])
	require.Equal(t, "gpt", ans.Failures[1].Tier)
	require.Equal(t, provider.ErrorTransport, ans.Failures[1].Kind)
}

func TestChainDropsOpaqueItemsOfAnotherFormat(t *testing.T) {
	t.Parallel()
	// The transcript carries an Anthropic thinking block and a Responses
	// reasoning item from the turn that made the tool calls. Claude fails;
	// Chat Completions, which can read neither, answers.
	first := newFailing(t, status(503, `{"type":"error","error":{"type":"api_error","message":"Service unavailable"}}`))
	dir := filepath.Join("testdata", "openai-chat", "tool_results")
	second, rec := serveTranscript(t, dir)
	chain := newChain(t, claudeTier("claude", first.srv.URL), chatTier("gpt", second.URL), fallback)

	ans, err := chain.Complete(context.Background(), reqToolResults())
	require.NoError(t, err)
	require.Equal(t, "gpt", ans.Tier)
	checkRequest(t, dir, rec) // no thinking block, no reasoning item
	require.Equal(t, []provider.Drop{
		{Tier: "claude", TierIndex: 0, Kind: provider.KindOpenAIResponses, Type: "reasoning", Count: 1, Reason: provider.DropOtherFormat},
		{Tier: "gpt", TierIndex: 1, Kind: provider.KindAnthropicMessages, Type: "thinking", Count: 1, Reason: provider.DropOtherFormat},
		{Tier: "gpt", TierIndex: 1, Kind: provider.KindOpenAIResponses, Type: "reasoning", Count: 1, Reason: provider.DropOtherFormat},
	}, ans.Drops)
}

func TestChainStopsWhenTheCallerDoes(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		t.Parallel()
		first := newFailing(t, status(500, `{}`))
		chain := newChain(t, chatTier("gpt", first.srv.URL), fallback)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		ans, err := chain.Complete(ctx, reqSimple())
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, provider.Retryable(err))
		require.Empty(t, ans.Tier)
		require.Zero(t, first.calls.Load())
	})
	t.Run("during", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		first := newFailing(t, func(w http.ResponseWriter, r *http.Request) {
			close(started)
			hang(w, r)
		})
		second := newFailing(t, status(500, `{}`))
		chain := newChain(t, chatTier("gpt", first.srv.URL), chatTier("gpt2", second.srv.URL), fallback)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-started
			cancel()
		}()
		ans, err := chain.Complete(ctx, reqSimple())
		require.ErrorIs(t, err, context.Canceled)
		require.Empty(t, ans.Failures, "the caller's cancellation is no tier's failure")
		require.Zero(t, second.calls.Load())
	})
}

func TestChainNeverShowsTheKey(t *testing.T) {
	t.Parallel()
	// A server that echoes the key it was sent, whole and masked.
	echo := func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		masked := key[:7] + "***" + key[len(key)-4:]
		status(503, `{"error":{"message":"key `+key+` (`+masked+`) is throttled","type":"server_error"}}`)(w, r)
	}
	first := newFailing(t, echo)
	second := newFailing(t, echo)
	chain := newChain(t, chatTier("gpt", first.srv.URL), claudeTier("claude", second.srv.URL), fallback)

	ans, err := chain.Complete(context.Background(), reqSimple())
	require.NoError(t, err)
	require.True(t, ans.Degraded)
	raw, err := json.Marshal(ans)
	require.NoError(t, err)
	for _, key := range []string{openaiKey, anthropicKey, openaiKey[len(openaiKey)-4:] + ")"} {
		require.NotContains(t, string(raw), key)
	}
	require.Contains(t, ans.Failures[0].Message, "key [redacted] ([redacted]) is throttled")

	// A failure that does not fall back is returned whole: no error in its
	// chain holds the key either.
	for _, tier := range []provider.TierConfig{chatTier("gpt", "URL"), claudeTier("claude", "URL")} {
		refused := newFailing(t, func(w http.ResponseWriter, r *http.Request) {
			key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			status(401, `{"type":"error","error":{"type":"authentication_error","message":"invalid key `+key+`"}}`)(w, r)
		})
		tier.BaseURL = strings.Replace(tier.BaseURL, "URL", refused.srv.URL, 1)
		_, err := newChain(t, tier, fallback).Complete(context.Background(), reqSimple())
		require.Error(t, err)
		require.Contains(t, err.Error(), "invalid key [redacted]")
		for e := err; e != nil; e = errors.Unwrap(e) {
			require.NotContains(t, fmt.Sprintf("%v %+v", e, e), openaiKey)
			require.NotContains(t, fmt.Sprintf("%v %+v", e, e), anthropicKey)
		}
	}
}

func TestNewChainRefuses(t *testing.T) {
	url := "http://127.0.0.1:1"
	cases := []struct {
		name  string
		tiers []provider.TierConfig
		want  []string
	}{
		{"no tiers", nil, []string{"no tiers"}},
		{"no deterministic tier last", []provider.TierConfig{chatTier("gpt", url)},
			[]string{`the last tier ("gpt") is openai-chat: it must be deterministic`}},
		{"a deterministic tier before the last", []provider.TierConfig{fallback, chatTier("gpt", url), {Name: "last", Kind: provider.KindDeterministic, Text: "no"}},
			[]string{`tier 0 ("canned") is deterministic but not last`}},
		{"a name used twice", []provider.TierConfig{chatTier("gpt", url), chatTier("gpt", url), fallback},
			[]string{`tier 1: name "gpt" used twice`}},
		{"a missing key", []provider.TierConfig{{Name: "gpt", Kind: provider.KindOpenAIChat, Model: "gpt-4o", APIKeyEnv: "NOT_SET_ANYWHERE"}, fallback},
			[]string{"environment variable NOT_SET_ANYWHERE is not set"}},
		{"an unknown kind", []provider.TierConfig{{Name: "x", Kind: "gemini"}, fallback},
			[]string{`kind: "gemini" is none of`}},
		{"every problem at once", []provider.TierConfig{
			{Kind: provider.KindAnthropicMessages, BaseURL: "ftp://x", TimeoutMS: -1, ReasoningEffort: "high"},
			{Name: "d", Kind: provider.KindDeterministic},
		}, []string{"tier 0", "name: required", "model: required", "api_key_env: required", `base_url: "ftp://x" is not an http(s) URL`,
			"timeout_ms: negative", "reasoning_effort: not for anthropic-messages", "tier 1", "exactly one of answer and text"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := provider.NewChain(c.tiers, provider.Options{Getenv: getenv})
			require.Error(t, err)
			for _, w := range c.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), openaiKey)
		})
	}
}

func TestChainRefusesABadRequest(t *testing.T) {
	t.Parallel()
	first := newFailing(t, status(500, `{}`))
	chain := newChain(t, chatTier("gpt", first.srv.URL), fallback)
	req := reqTools()
	req.Messages = append(req.Messages, provider.Message{Role: provider.RoleTool, ToolResult: &provider.ToolResult{CallID: "call_nobody_made"}})
	_, err := chain.Complete(context.Background(), req)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, provider.ErrorClient, pe.Kind)
	require.Contains(t, pe.Message, `tool result for "call_nobody_made", which no earlier tool call has`)
	require.Zero(t, first.calls.Load())
}
