package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

// Exit statuses of the CLI. The HTTP client commands map the server's
// answer to them, so a script can branch without parsing messages:
//
//	0  success
//	1  anything else: the server is unreachable, a 5xx, a malformed answer
//	2  usage or input error: a bad flag or argument, a 4xx the request caused (400, 413, 415)
//	3  the database was written by a newer ledger (migrate, serve)
//	4  authentication or authorization: 401 (missing or bad token), 403 (role, separation of duties)
//	5  not found: 404 (unknown id, or another tenant's)
//	6  conflict: 409 (stale digest, not pending, key in progress) or 422 (key reused with another body)
const (
	exitOther    = 1
	exitUsage    = 2
	exitAuth     = 4
	exitNotFound = 5
	exitConflict = 6
)

// Environment variables the client commands read when a flag is not given.
const (
	envServer = "LEDGER_SERVER"
	envToken  = "LEDGER_TOKEN"
)

const defaultServer = "http://127.0.0.1:8080"

// exitCoder is an error that chooses the process exit status.
type exitCoder interface{ ExitCode() int }

// exitStatus is the exit status main uses: the error's own when it has one
// (client and usage errors), else exitCode's mapping of ledger errors.
func exitStatus(err error) int {
	var ec exitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return exitCode(err)
}

// usageError is a bad flag, argument or input file: exit status 2. It also
// matches ledger.ErrInvalid, so exitCode agrees.
type usageError struct{ err error }

func (e *usageError) Error() string        { return e.err.Error() }
func (e *usageError) Unwrap() error        { return e.err }
func (e *usageError) ExitCode() int        { return exitUsage }
func (e *usageError) Is(target error) bool { return target == ledger.ErrInvalid }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// usageArgs wraps a cobra argument validator so its complaint is a usage
// error (exit status 2), like a bad flag.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return &usageError{err: err}
		}
		return nil
	}
}

// asUsage makes cobra's flag parsing errors usage errors on cmd and every
// subcommand added before it is called.
func asUsage(cmd *cobra.Command) *cobra.Command {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	return cmd
}

// APIError is a non-2xx answer of the server, carrying its problem
// document. Its message reads "409 conflict: <detail>".
type APIError struct {
	Status  int
	Problem server.Problem
	// Body is the problem document as the server sent it, when it sent
	// JSON; --json prints it instead of the message (see printProblem).
	Body []byte
	// RetryAfter is the Retry-After header, if the server sent one (409
	// request_in_progress: the same key is still being processed).
	RetryAfter string
}

func (e *APIError) Error() string {
	code := e.Problem.Code
	if code == "" {
		code = strings.ToLower(strings.ReplaceAll(http.StatusText(e.Status), " ", "_"))
	}
	detail := e.Problem.Detail
	if detail == "" {
		detail = e.Problem.Title
	}
	if detail == "" {
		detail = http.StatusText(e.Status)
	}
	msg := fmt.Sprintf("%d %s: %s", e.Status, code, detail)
	if ra := e.RetryAfter; ra != "" {
		if _, err := strconv.Atoi(ra); err == nil {
			ra += "s"
		}
		msg += " (retry after " + ra + ")"
	}
	for _, fe := range e.Problem.Errors {
		msg += fmt.Sprintf("\n  %s: %s", fe.Location, fe.Message)
	}
	return msg
}

// ExitCode maps the HTTP status to the CLI's exit statuses.
func (e *APIError) ExitCode() int {
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		return exitAuth
	case e.Status == http.StatusNotFound:
		return exitNotFound
	case e.Status == http.StatusConflict || e.Status == http.StatusUnprocessableEntity:
		return exitConflict
	case e.Status >= 400 && e.Status < 500:
		return exitUsage
	default:
		return exitOther
	}
}

// clientOptions are the flags every client command shares.
type clientOptions struct {
	server  string
	token   string
	timeout time.Duration
	asJSON  bool
}

// addClientFlags registers the shared flags on cmd.
func addClientFlags(cmd *cobra.Command, o *clientOptions) {
	f := cmd.Flags()
	f.StringVar(&o.server, "server", "", "base URL of the ledger server (env "+envServer+", default "+defaultServer+")")
	f.StringVar(&o.token, "token", "", "bearer token (env "+envToken+"; not needed in dev mode)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "give up on a request after this long")
	f.BoolVar(&o.asJSON, "json", false, "print the server's JSON instead of a table")
}

// client is a small HTTP client of API v1.
type client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// newClient builds the client from the flags, falling back to the
// environment. A flag given explicitly wins over the environment.
func (o *clientOptions) newClient() (*client, error) {
	raw := o.server
	if raw == "" {
		raw = os.Getenv(envServer)
	}
	if raw == "" {
		raw = defaultServer
	}
	base, err := url.Parse(raw)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, usagef("--server %q: want a URL like %s", raw, defaultServer)
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	token := o.token
	if token == "" {
		token = os.Getenv(envToken)
	}
	if o.timeout <= 0 {
		return nil, usagef("--timeout must be positive")
	}
	return &client{base: base, token: token, http: &http.Client{Timeout: o.timeout}}, nil
}

// request is one call of the API.
type request struct {
	method string
	path   string // already escaped, e.g. "/v1/runs/" + url.PathEscape(id)
	query  url.Values
	header http.Header
	body   any // encoded as JSON when not nil
}

// response is a 2xx answer with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// maxResponseBytes bounds what the client reads of one answer.
const maxResponseBytes = 64 << 20

// do sends req and returns the 2xx answer, or an *APIError for any other
// status. Transport failures become an error that names the server and
// says what to check; the token never appears in any message.
func (c *client) do(ctx context.Context, req request) (*response, error) {
	target := c.base.Scheme + "://" + c.base.Host + c.base.EscapedPath() + req.path
	if q := req.query.Encode(); q != "" {
		target += "?" + q
	}
	var body io.Reader
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, target, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range req.header {
		for _, v := range vs {
			hr.Header.Add(k, v)
		}
	}
	hr.Header.Set("Accept", "application/json, application/problem+json")
	if req.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	hres, err := c.http.Do(hr)
	if err != nil {
		return nil, c.transportError(req, err)
	}
	defer hres.Body.Close()
	data, err := io.ReadAll(io.LimitReader(hres.Body, maxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", req.method, c.base.Redacted(), err)
	}
	if hres.StatusCode < 200 || hres.StatusCode > 299 {
		return nil, problemError(hres, data)
	}
	return &response{status: hres.StatusCode, header: hres.Header, body: data}, nil
}

// transportError explains a request that got no answer.
func (c *client) transportError(req request, err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err // its message repeats the URL
	}
	var nerr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s %s: %w", req.method, req.path, err)
	case errors.As(err, &nerr) && nerr.Timeout():
		return fmt.Errorf("%s %s: no answer from %s within %s (raise --timeout?): %w",
			req.method, req.path, c.base.Redacted(), c.http.Timeout, err)
	default:
		return fmt.Errorf("cannot reach the ledger server at %s (is `ledger serve` running? set --server or %s): %w",
			c.base.Redacted(), envServer, err)
	}
}

// problemError builds the *APIError of a non-2xx answer; a body that is
// not a problem document still yields the status.
func problemError(res *http.Response, data []byte) error {
	e := &APIError{Status: res.StatusCode, RetryAfter: res.Header.Get("Retry-After")}
	mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	if mt == "application/problem+json" || mt == "application/json" {
		if json.Unmarshal(data, &e.Problem) == nil { // a garbled body still has its status
			e.Body = data
		}
	}
	if e.Problem.Detail == "" && e.Problem.Title == "" && mt == "text/plain" {
		e.Problem.Detail = strings.TrimSpace(string(data))
	}
	return e
}

// getJSON GETs path and decodes the answer into out; it returns the raw
// body too, for --json.
func (c *client) getJSON(ctx context.Context, path string, query url.Values, out any) ([]byte, error) {
	res, err := c.do(ctx, request{method: http.MethodGet, path: path, query: query})
	if err != nil {
		return nil, err
	}
	if err := decodeBody(res.body, out); err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return res.body, nil
}

// decodeBody decodes a server answer; unknown fields are fine (the server
// may add some), a malformed body is not.
func decodeBody(data []byte, out any) error {
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("malformed answer from the server: %w", err)
	}
	return nil
}

// printJSON writes the server's JSON indented, keeping every field it sent.
func printJSON(w io.Writer, raw []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(bytes.TrimSpace(raw))
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// idPath is a path with one escaped id segment: idPath("/v1/runs/%s", id).
func idPath(format string, id string) string { return fmt.Sprintf(format, url.PathEscape(id)) }

// timeFormat is how tables show times: UTC, seconds, fixed width.
const timeFormat = "2006-01-02T15:04:05Z"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeFormat)
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return fmtTime(*t)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reportedError is an error already shown to the user (the problem
// document printed under --json): main exits with its status without
// printing it again.
type reportedError struct{ err error }

func (e *reportedError) Error() string { return e.err.Error() }
func (e *reportedError) Unwrap() error { return e.err }

// printProblem shows a refused request of a command run with --json as the
// server's problem document (application/problem+json, as received,
// indented) on stderr, and returns the error marked as reported. Stdout
// keeps only answers, so `x=$(ledger … --json)` never captures an error as
// if it were one; the exit status still says which it was. An error that
// carries no problem document (the server unreachable, a usage error, a
// body that is not JSON) is returned as it is, for main to print as a line.
func printProblem(cmd *cobra.Command, stderr io.Writer, err error) error {
	var apiErr *APIError
	if cmd == nil || !errors.As(err, &apiErr) || len(apiErr.Body) == 0 {
		return err
	}
	if f := cmd.Flags().Lookup("json"); f == nil || f.Value.String() != "true" {
		return err
	}
	if perr := printJSON(stderr, apiErr.Body); perr != nil {
		return err
	}
	return &reportedError{err: err}
}

// addFieldFlag registers --field, which prints one field of the server's
// JSON answer, for a shell to capture: RUN=$(ledger submit … --field id).
func addFieldFlag(cmd *cobra.Command, field *string) {
	cmd.Flags().StringVar(field, "field", "", "print only this field of the server's JSON (one line per item of a list), e.g. id")
}

// checkOutputFlags refuses --json with --field: one asks for the whole
// answer, the other for one value of it.
func checkOutputFlags(o clientOptions, field string) error {
	if o.asJSON && field != "" {
		return usagef("give --json or --field, not both")
	}
	return nil
}

// printField prints field of the JSON object raw, or of each object of its
// array listKey (one line each): a string as it is, anything else as
// compact JSON. A field the answer does not have is a usage error that
// names the fields it has.
func printField(w io.Writer, raw []byte, listKey, field string) error {
	var items []map[string]json.RawMessage
	if listKey == "" {
		var obj map[string]json.RawMessage
		if err := decodeBody(raw, &obj); err != nil {
			return err
		}
		items = append(items, obj)
	} else {
		var list map[string][]map[string]json.RawMessage
		if err := decodeBody(raw, &list); err != nil {
			return err
		}
		items = list[listKey]
	}
	var out bytes.Buffer
	for _, item := range items {
		v, ok := item[field]
		if !ok {
			names := make([]string, 0, len(item))
			for k := range item {
				names = append(names, k)
			}
			slices.Sort(names)
			return usagef("--field %q: the answer has no such field; it has %s", field, strings.Join(names, ", "))
		}
		var s string
		if json.Unmarshal(v, &s) != nil {
			var buf bytes.Buffer
			if err := json.Compact(&buf, v); err != nil {
				return fmt.Errorf("malformed answer from the server: %w", err)
			}
			s = buf.String()
		}
		out.WriteString(s)
		out.WriteByte('\n')
	}
	_, err := w.Write(out.Bytes())
	return err
}
