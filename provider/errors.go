package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrorKind says what went wrong in a call to a model, and so whether
// another tier may be tried.
type ErrorKind string

// Error kinds. Retryable is true for the first four.
const (
	ErrorTransport       ErrorKind = "transport"        // no answer: connection refused, reset, dropped mid-answer
	ErrorTimeout         ErrorKind = "timeout"          // the tier's timeout passed, or HTTP 408
	ErrorRateLimited     ErrorKind = "rate_limited"     // HTTP 429, or a rate-limit error inside a stream
	ErrorServer          ErrorKind = "server"           // HTTP 5xx (529 overloaded too), or a server error inside a stream
	ErrorClient          ErrorKind = "client"           // HTTP 4xx but 408 and 429, or a request this package refused
	ErrorInvalidResponse ErrorKind = "invalid_response" // an answer this package cannot read
)

// Error is every failure of a model call. Message is the provider's
// explanation with the API key and masked echoes of keys removed; neither
// Error nor Message ever holds the key.
type Error struct {
	Kind ErrorKind
	// Status is the HTTP status, 0 when there was none (a transport
	// failure, a timeout, an error event inside a stream).
	Status int
	// RetryAfter is how long the provider asked to wait (Retry-After in
	// seconds or as an HTTP date, or retry-after-ms); 0 when it did not say.
	RetryAfter time.Duration
	// Tier is the name of the tier that failed; empty when the chain
	// refused the request before asking any.
	Tier    string
	Message string
	// Err is the cause as net/http, the context or a decoder gave it, for
	// errors.Is/As; nil when the provider answered with an error, whose
	// Status and Message say it all (the SDK's error holds the raw body,
	// which may echo the key).
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("provider")
	if e.Tier != "" {
		b.WriteString(" " + e.Tier)
	}
	b.WriteString(": " + string(e.Kind))
	if e.Status != 0 {
		fmt.Fprintf(&b, " (HTTP %d)", e.Status)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether err is a failure another tier may answer
// instead: a transport error, a timeout, 429 or 5xx. A refusal is not an
// error at all; a 4xx other than 408 and 429 would fail the same way
// anywhere; the caller's own cancellation is not a provider's failure.
func Retryable(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Kind {
	case ErrorTransport, ErrorTimeout, ErrorRateLimited, ErrorServer:
		return true
	}
	return false
}

// kindOfStatus maps an HTTP error status to its kind.
func kindOfStatus(status int) ErrorKind {
	switch {
	case status == http.StatusRequestTimeout:
		return ErrorTimeout
	case status == http.StatusTooManyRequests:
		return ErrorRateLimited
	case status >= 500:
		return ErrorServer
	case status >= 400:
		return ErrorClient
	}
	return ErrorInvalidResponse
}

// isTransport reports whether err is a failure to reach the provider or to
// read its whole answer.
func isTransport(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// retryAfter reads how long a response asks the caller to wait:
// retry-after-ms (milliseconds), else Retry-After in seconds or as an HTTP
// date. It returns 0 when neither says anything usable.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("retry-after"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// secret is an API key: it prints as [redacted] whatever the verb.
type secret string

func (secret) String() string               { return "[redacted]" }
func (secret) GoString() string             { return "[redacted]" }
func (s secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }

// maskedKey matches a masked echo of a key: the visible ends around
// three or more stars, as in OpenAI's "Incorrect API key provided:
// sk-abc***wxyz".
var maskedKey = regexp.MustCompile(`[A-Za-z0-9_-]*\*{3,}[A-Za-z0-9_-]*`)

// scrub removes the key, and any masked echo of a key, from text.
func (s secret) scrub(text string) string {
	if s != "" {
		text = strings.ReplaceAll(text, string(s), "[redacted]")
	}
	return maskedKey.ReplaceAllString(text, "[redacted]")
}

// failure is what an adapter knows when a call fails.
type failure struct {
	err     error          // what the SDK returned
	res     *http.Response // the HTTP response, when one arrived
	status  int            // an API error's status, when the SDK parsed one
	message string         // an API error's message
	// kind, when set, is the kind an error inside a stream or a failed
	// response already says.
	kind ErrorKind
}

// classify turns a failed call into the error Complete returns: the
// caller's own context error when ctx ended, else an *Error.
func (r *remote) classify(ctx, tctx context.Context, f failure) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("provider %s: %w", r.name, err)
	}
	e := &Error{Tier: r.name, Err: f.err}
	var h http.Header
	if f.res != nil {
		h = f.res.Header
	}
	status := f.status
	if status == 0 && f.res != nil && f.res.StatusCode >= 400 {
		status = f.res.StatusCode
	}
	switch {
	case errors.Is(tctx.Err(), context.DeadlineExceeded):
		e.Kind = ErrorTimeout
		e.Message = fmt.Sprintf("no answer within %s", r.timeout)
	case f.kind != "":
		e.Kind, e.Message = f.kind, f.message
	case status >= 400:
		e.Kind, e.Status, e.Message = kindOfStatus(status), status, f.message
		if e.Message == "" {
			e.Message = http.StatusText(status)
		}
	case isTransport(f.err):
		e.Kind = ErrorTransport
	default:
		e.Kind = ErrorInvalidResponse
	}
	if e.Message == "" && f.err != nil {
		e.Message = f.err.Error()
	}
	e.Message = r.key.scrub(e.Message)
	e.RetryAfter = retryAfter(h, r.now())
	return e
}

// invalid is the error for a request this package refuses, or an answer it
// cannot read.
func (r *remote) invalid(kind ErrorKind, err error) error {
	return &Error{Tier: r.name, Kind: kind, Message: r.key.scrub(err.Error()), Err: err}
}
