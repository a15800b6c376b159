package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"
)

// Kind names a tier's wire format.
type Kind string

// Tier kinds.
const (
	KindOpenAIChat        Kind = "openai-chat"        // OpenAI Chat Completions, POST {base_url}/chat/completions
	KindOpenAIResponses   Kind = "openai-responses"   // OpenAI Responses, POST {base_url}/responses
	KindAnthropicMessages Kind = "anthropic-messages" // Anthropic Messages, POST {base_url}/v1/messages
	KindDeterministic     Kind = "deterministic"      // the declared answer; no network
)

// Default endpoints and limits.
const (
	DefaultOpenAIBaseURL    = "https://api.openai.com/v1"
	DefaultAnthropicBaseURL = "https://api.anthropic.com"
	// DefaultTimeout bounds one call of a remote tier whose timeout_ms is 0.
	DefaultTimeout = 2 * time.Minute
	// DefaultAnthropicMaxTokens is max_tokens for Anthropic Messages, which
	// requires one, when neither the request nor the tier sets it.
	DefaultAnthropicMaxTokens = 4096
)

// TierConfig is one tier of a chain, as the operator's config gives it.
type TierConfig struct {
	// Name identifies the tier in answers, failures and drops.
	Name string `json:"name"`
	Kind Kind   `json:"kind"`
	// BaseURL is the API root; empty takes DefaultOpenAIBaseURL or
	// DefaultAnthropicBaseURL.
	BaseURL string `json:"base_url,omitempty"`
	Model   string `json:"model,omitempty"`
	// APIKeyEnv is the NAME of the environment variable holding the key,
	// read when the tier is built.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// Stream asks for a streamed answer (server-sent events).
	Stream bool `json:"stream,omitempty"`
	// TimeoutMS bounds one call; 0 means DefaultTimeout. When it passes
	// the call fails with ErrorTimeout and the chain tries the next tier.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxOutputTokens caps an answer when the request does not.
	MaxOutputTokens int64 `json:"max_output_tokens,omitempty"`
	// ReasoningEffort (openai-chat, openai-responses) is sent as the
	// model's reasoning effort; on openai-responses it also asks for the
	// encrypted reasoning items, so a reasoning model's reasoning can be sent
	// back on the next step. Leave it empty for a model that does not reason:
	// the API refuses encrypted reasoning for those.
	ReasoningEffort string `json:"reasoning_effort,omitempty"`
	// ThinkingBudgetTokens (anthropic-messages) turns extended thinking on
	// with this budget (at least 1024, below the answer's max tokens).
	ThinkingBudgetTokens int64 `json:"thinking_budget_tokens,omitempty"`
	// Answer (deterministic) is the declared final answer, any JSON value;
	// the turn's text is its compact form.
	Answer json.RawMessage `json:"answer,omitempty"`
	// Text (deterministic) is the declared final answer as plain text.
	Text string `json:"text,omitempty"`
}

// Options are what building a tier needs from outside its config.
type Options struct {
	// Getenv reads the environment variable a tier names; nil means
	// os.Getenv.
	Getenv func(string) string
	// HTTPClient sends every request; nil means a client of its own with no
	// timeout (each call's context carries the tier's).
	HTTPClient *http.Client
	// Now is the clock Retry-After dates are read against; nil means
	// time.Now.
	Now func() time.Time
}

// Model is one tier: a wire format at one endpoint, or the deterministic
// answer.
type Model interface {
	// Complete asks the model for its next turn. It fails with an *Error,
	// or with the caller's context error when ctx ends first. A refusal is
	// a Turn, not an error.
	Complete(ctx context.Context, req Request) (Turn, error)
	// Kind is the tier's wire format.
	Kind() Kind
	// Name is the tier's name.
	Name() string
}

// New builds the tier cfg describes. A remote tier reads its key from the
// environment now: a missing key is an error that names the variable,
// never its value.
func New(cfg TierConfig, opts Options) (Model, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tier %q: %w", cfg.Name, err)
	}
	if cfg.Kind == KindDeterministic {
		return newDeterministic(cfg), nil
	}
	r, err := newRemote(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("tier %q: %w", cfg.Name, err)
	}
	switch cfg.Kind {
	case KindOpenAIChat:
		return newChat(r), nil
	case KindOpenAIResponses:
		return newResponses(r), nil
	default:
		return newAnthropic(r), nil
	}
}

// validate checks the fields a tier of cfg's kind uses.
func (cfg TierConfig) validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if cfg.Name == "" {
		bad("name: required")
	}
	switch cfg.Kind {
	case KindDeterministic:
		if len(cfg.Answer) > 0 && !json.Valid(cfg.Answer) {
			bad("answer: not JSON")
		}
		if (len(cfg.Answer) > 0) == (cfg.Text != "") {
			bad("a deterministic tier declares exactly one of answer and text")
		}
		return errors.Join(errs...)
	case KindOpenAIChat, KindOpenAIResponses, KindAnthropicMessages:
	case "":
		return errors.New("kind: required")
	default:
		return fmt.Errorf("kind: %q is none of openai-chat, openai-responses, anthropic-messages, deterministic", cfg.Kind)
	}
	if cfg.Model == "" {
		bad("model: required")
	}
	if cfg.APIKeyEnv == "" {
		bad("api_key_env: required (the name of the environment variable holding the key)")
	}
	if cfg.BaseURL != "" {
		if u, err := url.Parse(cfg.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("base_url: %q is not an http(s) URL", cfg.BaseURL)
		}
	}
	if cfg.TimeoutMS < 0 {
		bad("timeout_ms: negative")
	}
	if cfg.MaxOutputTokens < 0 {
		bad("max_output_tokens: negative")
	}
	if cfg.ReasoningEffort != "" && cfg.Kind == KindAnthropicMessages {
		bad("reasoning_effort: not for anthropic-messages (use thinking_budget_tokens)")
	}
	if cfg.ThinkingBudgetTokens != 0 {
		if cfg.Kind != KindAnthropicMessages {
			bad("thinking_budget_tokens: only for anthropic-messages")
		} else if cfg.ThinkingBudgetTokens < 1024 {
			bad("thinking_budget_tokens: at least 1024")
		}
	}
	if len(cfg.Answer) > 0 || cfg.Text != "" {
		bad("answer and text: only for a deterministic tier")
	}
	return errors.Join(errs...)
}

// remote is what the three network adapters share.
type remote struct {
	name    string
	kind    Kind
	model   string
	baseURL string
	stream  bool
	timeout time.Duration
	maxOut  int64
	effort  string
	budget  int64
	key     secret
	client  *http.Client
	now     func() time.Time
}

func newRemote(cfg TierConfig, opts Options) (*remote, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	key := getenv(cfg.APIKeyEnv)
	if key == "" {
		return nil, fmt.Errorf("api_key_env: environment variable %s is not set or empty", cfg.APIKeyEnv)
	}
	r := &remote{
		name: cfg.Name, kind: cfg.Kind, model: cfg.Model, baseURL: cfg.BaseURL,
		stream: cfg.Stream, timeout: DefaultTimeout, maxOut: cfg.MaxOutputTokens,
		effort: cfg.ReasoningEffort, budget: cfg.ThinkingBudgetTokens,
		key: secret(key), client: opts.HTTPClient, now: opts.Now,
	}
	if cfg.TimeoutMS > 0 {
		r.timeout = time.Duration(cfg.TimeoutMS) * time.Millisecond
	}
	if r.client == nil {
		r.client = &http.Client{}
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r, nil
}

// Kind is the tier's wire format.
func (r *remote) Kind() Kind { return r.kind }

// Name is the tier's name.
func (r *remote) Name() string { return r.name }

// maxTokens is the output cap for req: the request's, else the tier's.
func (r *remote) maxTokens(req Request) int64 {
	if req.MaxOutputTokens > 0 {
		return req.MaxOutputTokens
	}
	return r.maxOut
}

// begin checks req and bounds the call by the tier's timeout.
func (r *remote) begin(ctx context.Context, req Request) (context.Context, context.CancelFunc, error) {
	if err := req.validate(); err != nil {
		return nil, nil, r.invalid(ErrorClient, err)
	}
	tctx, cancel := context.WithTimeout(ctx, r.timeout)
	return tctx, cancel, nil
}
