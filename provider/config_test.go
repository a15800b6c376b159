package provider_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/provider"
)

// TestTiersIgnoreTheSDKEnvironment sets the variables the SDKs read on
// their own; no request may carry them: a tier sends what its config says.
func TestTiersIgnoreTheSDKEnvironment(t *testing.T) {
	for k, v := range map[string]string{
		"OPENAI_API_KEY": "sk-from-the-environment", "OPENAI_BASE_URL": "http://127.0.0.1:1",
		"OPENAI_ORG_ID": "org-leak", "OPENAI_PROJECT_ID": "proj-leak", "OPENAI_CUSTOM_HEADERS": "X-Leak: 1",
		"ANTHROPIC_API_KEY": "sk-ant-from-the-environment", "ANTHROPIC_AUTH_TOKEN": "token-leak",
		"ANTHROPIC_BASE_URL": "http://127.0.0.1:1",
	} {
		t.Setenv(k, v)
	}
	for _, kind := range []provider.Kind{provider.KindOpenAIChat, provider.KindOpenAIResponses, provider.KindAnthropicMessages} {
		t.Run(string(kind), func(t *testing.T) {
			dir := filepath.Join("testdata", string(kind), "text")
			srv, rec := serveTranscript(t, dir)
			m, err := provider.New(tierFor(kind, srv.URL), provider.Options{Getenv: getenv})
			require.NoError(t, err)
			_, err = m.Complete(context.Background(), reqSimple())
			require.NoError(t, err)
			checkRequest(t, dir, rec) // the config's key, at the config's URL
			for _, h := range []string{"OpenAI-Organization", "OpenAI-Project", "X-Leak", "X-Api-Key"} {
				require.Empty(t, rec.headers.Get(h), h)
			}
		})
	}
}

func TestTurnMessage(t *testing.T) {
	turn := provider.Turn{Text: "a", ToolCalls: []provider.ToolCall{{ID: "c", Name: "f"}}, Opaque: []provider.Opaque{thinkingItem}, Stop: provider.StopToolUse}
	require.Equal(t, provider.Message{Role: provider.RoleAssistant, Text: "a", ToolCalls: turn.ToolCalls, Opaque: turn.Opaque}, turn.Message())
	refused := provider.Turn{Refusal: "no", Stop: provider.StopRefusal}
	require.Equal(t, provider.Message{Role: provider.RoleAssistant, Text: "no"}, refused.Message())
}
