package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/oklog/ulid/v2"
)

// HeaderRequestID carries a request's id: the client's, if it sent a sane
// one, or one the server made. Every answer carries it, every log line of
// the request names it (request_id), and a problem document shows it as
// its instance (ProblemInstance).
const HeaderRequestID = "X-Request-ID"

// MaxRequestIDLength bounds a client's request id; a longer one is
// replaced.
const MaxRequestIDLength = 128

// RequestIDPrefix starts every request id the server makes ("req_" and a
// ULID).
const RequestIDPrefix = "req_"

// ProblemInstancePrefix makes a problem's instance of its request id:
// "urn:request:<id>". Every character a request id may hold is allowed in
// a URN, so the instance is a valid URI whatever the client sent.
const ProblemInstancePrefix = "urn:request:"

// saneRequestID reports whether a client's X-Request-ID may be kept: 1 to
// MaxRequestIDLength characters of letters, digits and - . _ ~ : @ + = /,
// which covers UUIDs, ULIDs, hex and base64 ids. Anything else (spaces,
// quotes, control or non-ASCII characters) could forge log lines or break
// the problem's URI, and is replaced by an id of the server's.
func saneRequestID(id string) bool {
	if id == "" || len(id) > MaxRequestIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == ':', c == '@', c == '+', c == '=', c == '/':
		default:
			return false
		}
	}
	return true
}

// requestID returns the id of a request with the given X-Request-ID
// values: the one client value if it is sane, else a new one.
func requestID(vals []string, now func() time.Time) string {
	if len(vals) == 1 && saneRequestID(vals[0]) {
		return vals[0]
	}
	// DefaultEntropy is monotonic, safe for concurrent use and never
	// fails.
	return RequestIDPrefix + ulid.MustNew(ulid.Timestamp(now()), ulid.DefaultEntropy()).String()
}

// requestIDKey is the private context key of a request's id.
type requestIDKey struct{}

func withRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// requestIDFrom returns the request id in ctx, if any.
func requestIDFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(requestIDKey{}).(string)
	return id, ok
}

// requestIDHandler adds request_id to every record logged with a request's
// context, so the server's log lines about a request all name it.
type requestIDHandler struct{ slog.Handler }

// Handle implements slog.Handler.
func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := requestIDFrom(ctx); ok {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}
