package httptool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
)

// Tool error codes of Execute (engine.ToolError.Code), beside the codes a
// tool's own answers carry.
const (
	// CodeTransport: the request failed on its way or the answer did (a
	// refused or broken connection, a TLS failure): effect unknown, since
	// the tool may have acted before the failure.
	CodeTransport = "http_transport_error"
	// CodeStatus: the tool answered a 5xx, a redirect or another status
	// with no valid answer in its body: effect unknown.
	CodeStatus = "http_status"
	// CodeInvalidAnswer: the body is not a valid answer: effect unknown.
	CodeInvalidAnswer = "invalid_answer"
	// CodeAnswerTooLarge: the answer is over max_response_bytes and was not
	// read: effect unknown.
	CodeAnswerTooLarge = "answer_too_large"
	// CodeToolFailed is the code of a failed answer that gives none.
	CodeToolFailed = "tool_failed"
)

// Errors of Query and Cancel, and the causes Execute's tool errors name.
var (
	// ErrTransport: the request or its answer failed in transit.
	ErrTransport = errors.New("httptool: the request failed")
	// ErrStatus: an HTTP status that carries no answer (5xx, 3xx), or
	// another with no valid answer.
	ErrStatus = errors.New("httptool: no answer in the HTTP status")
	// ErrInvalidAnswer: the body is not a valid answer.
	ErrInvalidAnswer = errors.New("httptool: not a valid answer")
	// ErrTooLarge: the answer is over max_response_bytes.
	ErrTooLarge = errors.New("httptool: the answer is over max_response_bytes")
)

// Caps on what of a failed answer the ledger keeps.
const (
	maxCodeBytes    = 128
	maxMessageBytes = 4096
)

// Options tune a Tool.
type Options struct {
	// Getenv reads the variable bearer_token_env names; nil means
	// os.Getenv.
	Getenv func(string) string
	// Client makes the requests; nil means a client of the tool's own over
	// a clone of http.DefaultTransport. Redirects are never followed,
	// whatever the client says: a call is not sent twice, nor the bearer
	// token anywhere else.
	Client *http.Client
}

// Tool is a tool the ledger calls over HTTP. It implements engine.Tool,
// engine.Querier and engine.Canceller whatever its guarantees; what the
// engine may use is decided by the descriptor's guarantees, which New holds
// to the endpoints: Query fails with errors.ErrUnsupported without a
// query_url, Cancel without a cancel_url.
type Tool struct {
	desc   contracts.ToolDescriptor
	ep     contracts.HTTPEndpoints
	token  string
	client *http.Client
}

var (
	_ engine.Tool      = (*Tool)(nil)
	_ engine.Querier   = (*Tool)(nil)
	_ engine.Canceller = (*Tool)(nil)
)

// New returns the tool desc describes, reached at ep. It refuses endpoints
// that are not http(s) URLs of a host, guarantees the endpoints cannot keep
// (query without QueryURL, cancel without CancelURL), and a bearer_token_env
// whose variable is unset or empty, or holds a value no header can carry;
// its errors name the variable, never its value.
func New(desc contracts.ToolDescriptor, ep contracts.HTTPEndpoints, opts Options) (*Tool, error) {
	fail := func(format string, args ...any) (*Tool, error) {
		return nil, fmt.Errorf("http tool %s: "+format, append([]any{desc.Name}, args...)...)
	}
	for _, u := range []struct{ field, raw string }{{"url", ep.URL}, {"query_url", ep.QueryURL}, {"cancel_url", ep.CancelURL}} {
		if u.raw == "" && u.field != "url" {
			continue
		}
		if err := checkURL(u.raw); err != nil {
			return fail("%s: %w", u.field, err)
		}
	}
	if desc.Guarantees.Query && ep.QueryURL == "" {
		return fail("guarantees.query needs a query_url")
	}
	if desc.Guarantees.Cancel && ep.CancelURL == "" {
		return fail("guarantees.cancel needs a cancel_url")
	}
	t := &Tool{desc: desc, ep: ep}
	if t.ep.MaxResponseBytes <= 0 {
		t.ep.MaxResponseBytes = contracts.DefaultHTTPMaxResponseBytes
	}
	if ep.BearerTokenEnv != "" {
		getenv := opts.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		t.token = getenv(ep.BearerTokenEnv)
		if t.token == "" {
			return fail("bearer_token_env: the environment variable %s is not set, or empty", ep.BearerTokenEnv)
		}
		if strings.ContainsFunc(t.token, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return fail("bearer_token_env: the value of %s has spaces, control or non-ASCII characters, which no header can carry", ep.BearerTokenEnv)
		}
	}
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	if opts.Client != nil {
		c := *opts.Client
		client = &c
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	t.client = client
	return t, nil
}

// checkURL refuses what is not an http(s) URL of a host, or carries
// credentials.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("an http or https URL, not %q", u.Scheme)
	case u.Hostname() == "":
		return errors.New("the URL names no host")
	case u.User != nil:
		return errors.New("the URL carries credentials: use bearer_token_env")
	}
	return nil
}

// Descriptor implements engine.Tool.
func (t *Tool) Descriptor() contracts.ToolDescriptor {
	d := t.desc
	d.ArgumentsSchema = bytes.Clone(d.ArgumentsSchema)
	d.SecretPaths = append([]string(nil), d.SecretPaths...)
	return d
}

// Execute implements engine.Tool: POST url with the call (CallRequest),
// read the answer (CallAnswer). A succeeded answer is the result; a failed
// one a *engine.ToolError with its code, message and effect (unknown when
// it gives none). Any other end is a *engine.ToolError with effect unknown
// (CodeTransport, CodeStatus, CodeInvalidAnswer, CodeAnswerTooLarge), or,
// when the call's context ended, its error: context.DeadlineExceeded, which
// the engine records as a timeout, or context.Canceled. For a read tool
// every effect is not_happened.
func (t *Tool) Execute(ctx context.Context, c engine.Call) (engine.Result, error) {
	body, err := json.Marshal(CallRequest{Tool: t.desc.Name, ToolVersion: t.desc.Version, Arguments: c.Arguments, DedupKey: c.DedupKey,
		FencingToken: c.FencingToken, RunID: string(c.RunID), ActionID: string(c.ActionID), AttemptID: string(c.AttemptID), Attempt: c.Attempt})
	if err != nil {
		// Nothing was sent: the arguments are not JSON.
		return engine.Result{}, &engine.ToolError{Code: "invalid_arguments", Message: err.Error(), Effect: ledger.EffectNotHappened}
	}
	h := http.Header{HeaderIdempotencyKey: {c.DedupKey}}
	if c.FencingToken > 0 {
		h.Set(HeaderFencingToken, strconv.FormatInt(c.FencingToken, 10))
	}
	status, data, err := t.post(ctx, t.ep.URL, body, h)
	if err != nil {
		return engine.Result{}, t.callError(ctx, err)
	}
	var ans CallAnswer
	if err := decodeAnswer(status, data, &ans); err != nil {
		return engine.Result{}, t.callError(ctx, err)
	}
	if err := checkCallAnswer(&ans); err != nil {
		return engine.Result{}, t.callError(ctx, err)
	}
	effect := ledger.EffectFact(ans.Effect)
	if ans.Status == StatusFailed {
		te := &engine.ToolError{Code: CodeToolFailed, Message: "the tool reported a failure without an error", Effect: orUnknown(effect)}
		if ans.Error != nil {
			te.Code = truncate(ans.Error.Code, maxCodeBytes)
			if ans.Error.Message != "" {
				te.Message = truncate(ans.Error.Message, maxMessageBytes)
			}
		}
		te.Effect = t.readEffect(te.Effect)
		return engine.Result{}, te
	}
	if t.desc.Effect == contracts.EffectRead {
		effect = ledger.EffectNotHappened
	}
	return engine.Result{Output: ans.Output, Effect: effect}, nil
}

// callError is the engine's view of a call that got no valid answer: the
// context's error if it ended (a timeout, a cancel), else a tool error
// whose effect is unknown (not_happened for a read).
func (t *Tool) callError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("http tool %s: %w", t.desc.Name, cerr)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("http tool %s: %w", t.desc.Name, err)
	}
	code := CodeTransport
	switch {
	case errors.Is(err, ErrTooLarge):
		code = CodeAnswerTooLarge
	case errors.Is(err, ErrInvalidAnswer):
		code = CodeInvalidAnswer
	case errors.Is(err, ErrStatus):
		code = CodeStatus
	}
	return &engine.ToolError{Code: code, Message: t.scrub(err.Error()), Effect: t.readEffect(ledger.EffectUnknown)}
}

// readEffect is f, but not_happened for a read tool: a read takes no
// effect whatever happened to it.
func (t *Tool) readEffect(f ledger.EffectFact) ledger.EffectFact {
	if t.desc.Effect == contracts.EffectRead {
		return ledger.EffectNotHappened
	}
	return f
}

func orUnknown(f ledger.EffectFact) ledger.EffectFact {
	if f == "" {
		return ledger.EffectUnknown
	}
	return f
}

// checkCallAnswer holds a decoded answer to the contract.
func checkCallAnswer(a *CallAnswer) error {
	switch a.Status {
	case StatusSucceeded:
		if a.Error != nil {
			return fmt.Errorf("%w: an error with status succeeded", ErrInvalidAnswer)
		}
	case StatusFailed:
		if a.Error != nil && a.Error.Code == "" {
			return fmt.Errorf("%w: error.code is empty", ErrInvalidAnswer)
		}
	case "":
		return fmt.Errorf("%w: no status", ErrInvalidAnswer)
	default:
		return fmt.Errorf("%w: status %q is neither succeeded nor failed", ErrInvalidAnswer, truncate(a.Status, 64))
	}
	if a.Effect != "" && !ledger.EffectFact(a.Effect).Valid() {
		return fmt.Errorf("%w: effect %q is none of happened, not_happened, unknown", ErrInvalidAnswer, truncate(a.Effect, 64))
	}
	if string(a.Output) == "null" {
		a.Output = nil
	}
	return nil
}

// Query implements engine.Querier: POST query_url with the dedup key
// (KeyRequest), read QueryAnswer. An answer that is not one, and every
// failure to get one, is an error (recovery asks again, then a person);
// unknown is never read as not happened.
func (t *Tool) Query(ctx context.Context, dedupKey string) (engine.QueryResult, error) {
	if t.ep.QueryURL == "" {
		return engine.QueryResult{Effect: ledger.EffectUnknown}, fmt.Errorf("http tool %s has no query_url: %w", t.desc.Name, errors.ErrUnsupported)
	}
	var ans QueryAnswer
	if err := t.probe(ctx, t.ep.QueryURL, dedupKey, &ans); err != nil {
		return engine.QueryResult{Effect: ledger.EffectUnknown}, err
	}
	effect := ledger.EffectFact(ans.Effect)
	if !effect.Valid() {
		return engine.QueryResult{Effect: ledger.EffectUnknown}, fmt.Errorf("http tool %s: query: %w: effect %q is none of happened, not_happened, unknown",
			t.desc.Name, ErrInvalidAnswer, truncate(ans.Effect, 64))
	}
	if string(ans.Output) == "null" {
		ans.Output = nil
	}
	return engine.QueryResult{Effect: effect, Output: ans.Output}, nil
}

// Cancel implements engine.Canceller: POST cancel_url with the dedup key
// (KeyRequest), read CancelAnswer. An answer without confirmed, and every
// failure to get one, is an error.
func (t *Tool) Cancel(ctx context.Context, dedupKey string) (engine.CancelResult, error) {
	if t.ep.CancelURL == "" {
		return engine.CancelResult{}, fmt.Errorf("http tool %s has no cancel_url: %w", t.desc.Name, errors.ErrUnsupported)
	}
	var ans CancelAnswer
	if err := t.probe(ctx, t.ep.CancelURL, dedupKey, &ans); err != nil {
		return engine.CancelResult{}, err
	}
	if ans.Confirmed == nil {
		return engine.CancelResult{}, fmt.Errorf("http tool %s: cancel: %w: no confirmed", t.desc.Name, ErrInvalidAnswer)
	}
	if string(ans.Detail) == "null" {
		ans.Detail = nil
	}
	return engine.CancelResult{Confirmed: *ans.Confirmed, Detail: ans.Detail}, nil
}

// probe POSTs the dedup key to a query or cancel URL and decodes the
// answer into out.
func (t *Tool) probe(ctx context.Context, target, dedupKey string, out any) error {
	body, err := json.Marshal(KeyRequest{DedupKey: dedupKey})
	if err != nil {
		return fmt.Errorf("http tool %s: %w", t.desc.Name, err)
	}
	status, data, err := t.post(ctx, target, body, nil)
	if err == nil {
		err = decodeAnswer(status, data, out)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("http tool %s: %w", t.desc.Name, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return fmt.Errorf("http tool %s: %w", t.desc.Name, err)
	}
	return fmt.Errorf("http tool %s: %w", t.desc.Name, scrubbed{err: err, text: t.scrub(err.Error())})
}

// scrubbed is an error whose text had the bearer token removed; it still
// matches what it wraps (ErrStatus, ErrInvalidAnswer, …).
type scrubbed struct {
	err  error
	text string
}

func (s scrubbed) Error() string { return s.text }
func (s scrubbed) Unwrap() error { return s.err }

// post sends body to target within the call's deadline and the tool's
// timeout, and reads the answer up to the cap. Its errors wrap ErrTransport
// or ErrTooLarge, or the context's.
func (t *Tool) post(ctx context.Context, target string, body []byte, h http.Header) (int, []byte, error) {
	if d := t.desc.Timeout(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrTransport, err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "ledger-http-tool")
	if t.token != "" {
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, nil, transportError(ctx, "", transportCause(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, t.ep.MaxResponseBytes+1))
	if err != nil {
		return 0, nil, transportError(ctx, fmt.Sprintf("reading the answer (HTTP %d): ", resp.StatusCode), err)
	}
	if int64(len(data)) > t.ep.MaxResponseBytes {
		return 0, nil, fmt.Errorf("%w: more than %d bytes (HTTP %d); it was not read", ErrTooLarge, t.ep.MaxResponseBytes, resp.StatusCode)
	}
	// Before anything reads it: the token goes nowhere, even as part of
	// an error message cut short.
	if t.token != "" {
		data = bytes.ReplaceAll(data, []byte(t.token), []byte(redactedToken))
	}
	return resp.StatusCode, data, nil
}

// transportError is a failure of the request or of its answer: the
// context's error when ctx (the call's deadline, or the tool's timeout)
// ended, which is then the cause, else ErrTransport.
func transportError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%sno answer before the call's deadline or the tool's timeout: %w", what, cerr)
	}
	return fmt.Errorf("%w: %s%v", ErrTransport, what, err)
}

// transportCause is err without the URL net/http puts in front of it (a
// URL may hold a secret in its query).
func transportCause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// decodeAnswer reads an answer from a body of an HTTP status. A 5xx and a
// status outside 2xx and 4xx (a redirect) carry no answer whatever their
// body: a proxy or a framework may have written it. Otherwise the body
// must be exactly one JSON object of out's fields.
func decodeAnswer(status int, data []byte, out any) error {
	if status < 200 || status >= 500 || status >= 300 && status < 400 {
		return fmt.Errorf("%w: HTTP %d (%s)", ErrStatus, status, snippet(data))
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(out); err != nil {
		return fmt.Errorf("%w: HTTP %d: %v (%s)", ErrInvalidAnswer, status, err, snippet(data))
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: HTTP %d: data after the answer's object", ErrInvalidAnswer, status)
	}
	return nil
}

// snippet is the start of a body, for an error message.
func snippet(data []byte) string {
	if len(data) == 0 {
		return "empty body"
	}
	s := truncate(string(data), 200)
	if !utf8.ValidString(s) {
		return fmt.Sprintf("%d bytes, not UTF-8", len(data))
	}
	return "body: " + strconv.Quote(s)
}

// truncate cuts s to at most n bytes, at a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// redactedToken replaces the bearer token wherever a tool's answer echoes
// it.
const redactedToken = "[redacted:bearer_token]"

// scrub removes the bearer token from a text (post removes it from every
// answer; this is for the errors of the transport).
func (t *Tool) scrub(s string) string {
	if t.token == "" {
		return s
	}
	return strings.ReplaceAll(s, t.token, redactedToken)
}
