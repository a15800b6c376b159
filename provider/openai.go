package provider

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

// openaiOptions are the request options both OpenAI adapters share. The
// services are built from these alone, never from openai.NewClient, so no
// OPENAI_* variable of the environment (a second key, an organization,
// custom headers) reaches a request the config did not describe.
func openaiOptions(r *remote) []option.RequestOption {
	base := r.baseURL
	if base == "" {
		base = DefaultOpenAIBaseURL
	}
	return []option.RequestOption{
		option.WithBaseURL(base),
		option.WithAPIKey(string(r.key)),
		option.WithHTTPClient(r.client),
		// The ledger's budgets count every try: the SDK makes one.
		option.WithMaxRetries(0),
	}
}

// openaiFailure reads what an OpenAI SDK error says.
func openaiFailure(err error, res *http.Response) failure {
	f := failure{err: err, res: res}
	var apiErr *openai.Error
	var streamErr *ssestream.StreamError
	switch {
	case errors.As(err, &apiErr):
		f.status = apiErr.StatusCode
		f.message = apiErr.Message
		if apiErr.Response != nil {
			f.res = apiErr.Response
		}
		f.err = nil // its text holds the provider's body: Message is the scrubbed part of it
	case errors.As(err, &streamErr):
		// An error event inside a 200 stream: {"error": {...}}.
		var ev struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(streamErr.Event.Data, &ev)
		code, _ := ev.Error.Code.(string)
		f.kind = streamErrorKind(ev.Error.Type + " " + code)
		f.message = ev.Error.Message
		f.err = nil // its text holds the event's body
	}
	return f
}

// streamErrorKind classifies an error a provider reports inside a stream or
// a failed response, by its type or code: a rate limit, the request's
// fault, or else the server's.
func streamErrorKind(typeOrCode string) ErrorKind {
	switch s := strings.ToLower(typeOrCode); {
	case strings.Contains(s, "rate_limit"):
		return ErrorRateLimited
	case strings.Contains(s, "invalid"), strings.Contains(s, "not_found"),
		strings.Contains(s, "authentication"), strings.Contains(s, "permission"):
		return ErrorClient
	}
	return ErrorServer
}
