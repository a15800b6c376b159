package httptool_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/ledger"
)

const token = "s3cr3t-T0ken-value-9f8e7d"

func env(name string) string {
	if name == "TICKETS_TOKEN" {
		return token
	}
	return ""
}

// descriptor is a write tool with the given guarantees.
func descriptor(effect contracts.Effect, g contracts.Guarantees) contracts.ToolDescriptor {
	return contracts.ToolDescriptor{SchemaVersion: "1.0", Name: "tickets.open", Version: "3", Effect: effect,
		ArgumentsSchema: json.RawMessage(`{"type":"object"}`), Guarantees: g, TimeoutMS: 5000}
}

// seen is what the test server received.
type seen struct {
	mu       sync.Mutex
	requests []*http.Request
	bodies   [][]byte
}

func (s *seen) add(r *http.Request, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests, s.bodies = append(s.requests, r), append(s.bodies, body)
}

func (s *seen) last(t *testing.T) (*http.Request, []byte) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.NotEmpty(t, s.requests)
	return s.requests[len(s.requests)-1], s.bodies[len(s.bodies)-1]
}

// server answers every path with answer, recording each request.
func server(t *testing.T, answer http.HandlerFunc) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.add(r, body)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

func reply(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// newTool is the tool at srv's /call, /query and /cancel, with the bearer
// token of TICKETS_TOKEN.
func newTool(t *testing.T, srv *httptest.Server, d contracts.ToolDescriptor, tune ...func(*contracts.HTTPEndpoints)) *httptool.Tool {
	t.Helper()
	ep := contracts.HTTPEndpoints{URL: srv.URL + "/call", BearerTokenEnv: "TICKETS_TOKEN"}
	if d.Guarantees.Query {
		ep.QueryURL = srv.URL + "/query"
	}
	if d.Guarantees.Cancel {
		ep.CancelURL = srv.URL + "/cancel"
	}
	for _, f := range tune {
		f(&ep)
	}
	tool, err := httptool.New(d, ep, httptool.Options{Getenv: env})
	require.NoError(t, err)
	return tool
}

var call = engine.Call{RunID: "run_01", ActionID: "act_02", Attempt: 2, AttemptID: "att_03", DedupKey: "run_01/act_02",
	FencingToken: 7, Arguments: json.RawMessage(`{"title":"printer on fire"}`)}

// toolError is err as a *engine.ToolError, failing the test if it is not.
func toolError(t *testing.T, err error) *engine.ToolError {
	t.Helper()
	var te *engine.ToolError
	require.ErrorAs(t, err, &te)
	require.NotContains(t, te.Message, token)
	return te
}

func TestExecute(t *testing.T) {
	write := descriptor(contracts.EffectWrite, contracts.Guarantees{Dedup: true})

	t.Run("OK", func(t *testing.T) {
		srv, s := server(t, reply(200, `{"status": "succeeded", "effect": "happened", "output": {"ticket": 42}}`))
		res, err := newTool(t, srv, write).Execute(context.Background(), call)
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, res.Effect)
		require.JSONEq(t, `{"ticket": 42}`, string(res.Output))

		r, body := s.last(t)
		require.Equal(t, http.MethodPost, r.Method)
		require.Equal(t, "/call", r.URL.Path)
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		require.Equal(t, "Bearer "+token, r.Header.Get("Authorization"))
		require.Equal(t, "run_01/act_02", r.Header.Get(httptool.HeaderIdempotencyKey))
		require.Equal(t, "7", r.Header.Get(httptool.HeaderFencingToken))
		require.JSONEq(t, `{"tool": "tickets.open", "tool_version": "3", "arguments": {"title": "printer on fire"},
			"dedup_key": "run_01/act_02", "fencing_token": 7, "run_id": "run_01", "action_id": "act_02",
			"attempt_id": "att_03", "attempt": 2}`, string(body))
	})

	t.Run("EffectDefaultsToHappened", func(t *testing.T) {
		srv, _ := server(t, reply(201, `{"status": "succeeded"}`))
		res, err := newTool(t, srv, write).Execute(context.Background(), call)
		require.NoError(t, err)
		require.Empty(t, res.Effect, "the engine's default for a write that succeeded: happened")
		require.Nil(t, res.Output)
	})

	t.Run("NoFencingTokenNoHeader", func(t *testing.T) {
		srv, s := server(t, reply(200, `{"status": "succeeded", "effect": "happened", "output": null}`))
		c := call
		c.FencingToken = 0
		res, err := newTool(t, srv, write).Execute(context.Background(), c)
		require.NoError(t, err)
		require.Nil(t, res.Output)
		r, body := s.last(t)
		require.Empty(t, r.Header.Values(httptool.HeaderFencingToken))
		require.Contains(t, string(body), `"fencing_token":0`)
	})

	// Only an answer the tool wrote says a call did not take effect.
	t.Run("FailedNotHappened", func(t *testing.T) {
		srv, _ := server(t, reply(409, `{"status": "failed", "effect": "not_happened", "error": {"code": "fenced", "message": "stale token 7"}}`))
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, engine.ToolError{Code: "fenced", Message: "stale token 7", Effect: ledger.EffectNotHappened}, *te)
	})

	t.Run("FailedWithoutEffectIsUnknown", func(t *testing.T) {
		srv, _ := server(t, reply(200, `{"status": "failed"}`))
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeToolFailed, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect)
	})

	t.Run("FailedMessageCapped", func(t *testing.T) {
		srv, _ := server(t, reply(422, `{"status": "failed", "effect": "not_happened", "error": {"code": "invalid", "message": "`+strings.Repeat("é", 5000)+`"}}`))
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.LessOrEqual(t, len(te.Message), 4096+len("…"))
		require.True(t, strings.HasSuffix(te.Message, "é…"), "cut at a rune boundary")
	})

	// Whatever its body says, a 5xx carries no answer: a proxy in
	// between may have written it for a call the tool got.
	t.Run("ErrServerErrorIsUnknown", func(t *testing.T) {
		srv, _ := server(t, reply(500, `{"status": "failed", "effect": "not_happened"}`))
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeStatus, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect)
		require.Contains(t, te.Message, "HTTP 500")
	})

	t.Run("ErrRedirectNotFollowed", func(t *testing.T) {
		other, otherSeen := server(t, reply(200, `{"status": "succeeded", "effect": "happened"}`))
		srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/call", http.StatusTemporaryRedirect)
		})
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeStatus, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect)
		otherSeen.mu.Lock()
		defer otherSeen.mu.Unlock()
		require.Empty(t, otherSeen.requests, "the call went to the tool's url only, the token with it")
	})

	t.Run("ErrTimeout", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := newTool(t, srv, write).Execute(ctx, call)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the engine records a timeout, effect unknown")
		require.Less(t, time.Since(start), 3*time.Second, "the call's deadline is honoured")
	})

	t.Run("ErrDescriptorTimeout", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		})
		d := write
		d.TimeoutMS = 50
		_, err := newTool(t, srv, d).Execute(context.Background(), call)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})

	t.Run("ErrCancelled", func(t *testing.T) {
		srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		ctx, cancel := context.WithCancel(context.Background())
		tool := newTool(t, srv, write)
		done := make(chan error, 1)
		go func() { _, err := tool.Execute(ctx, call); done <- err }()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})

	t.Run("ErrAnswerTooLarge", func(t *testing.T) {
		big := `{"status": "succeeded", "effect": "happened", "output": "` + strings.Repeat("x", 2000) + `"}`
		srv, _ := server(t, reply(200, big))
		_, err := newTool(t, srv, write, func(ep *contracts.HTTPEndpoints) { ep.MaxResponseBytes = 1024 }).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeAnswerTooLarge, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect)
	})

	t.Run("ErrInvalidAnswer", func(t *testing.T) {
		for name, body := range map[string]string{
			"not JSON":             `<html>oops</html>`,
			"empty":                ``,
			"no status":            `{"effect": "not_happened"}`,
			"unknown status":       `{"status": "done", "effect": "happened"}`,
			"unknown effect":       `{"status": "failed", "effect": "maybe"}`,
			"unknown field":        `{"status": "failed", "effect": "not_happened", "retry": true}`,
			"error with success":   `{"status": "succeeded", "effect": "happened", "error": {"code": "x"}}`,
			"error without code":   `{"status": "failed", "effect": "not_happened", "error": {"message": "x"}}`,
			"two objects":          `{"status": "failed", "effect": "not_happened"} {}`,
			"array":                `[{"status": "failed", "effect": "not_happened"}]`,
			"truncated":            `{"status": "failed", "effect": "not_happ`,
			"wrong type of effect": `{"status": "failed", "effect": false}`,
		} {
			t.Run(name, func(t *testing.T) {
				srv, _ := server(t, reply(400, body))
				_, err := newTool(t, srv, write).Execute(context.Background(), call)
				te := toolError(t, err)
				require.Equal(t, httptool.CodeInvalidAnswer, te.Code, te.Message)
				require.Equal(t, ledger.EffectUnknown, te.Effect)
			})
		}
	})

	t.Run("ErrConnectionRefused", func(t *testing.T) {
		srv, _ := server(t, reply(200, `{}`))
		tool := newTool(t, srv, write)
		srv.Close()
		_, err := tool.Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeTransport, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect, "a refused connection is not known not to have acted in general")
		require.NotContains(t, te.Message, srv.URL+"/call", "no URL in the message: it may hold a secret")
	})

	t.Run("ErrConnectionDropped", func(t *testing.T) {
		srv, s := server(t, func(w http.ResponseWriter, _ *http.Request) { panic(http.ErrAbortHandler) })
		srv.Config.ErrorLog = discardLog()
		_, err := newTool(t, srv, write).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeTransport, te.Code)
		require.Equal(t, ledger.EffectUnknown, te.Effect)
		s.last(t) // the request reached the tool
	})

	// A tool that echoes the bearer token gets it back as a marker,
	// wherever it puts it.
	t.Run("SecretNotEchoed", func(t *testing.T) {
		for name, answer := range map[string]http.HandlerFunc{
			"error message": func(w http.ResponseWriter, r *http.Request) {
				reply(403, `{"status": "failed", "effect": "not_happened", "error": {"code": "auth", "message": "bad `+r.Header.Get("Authorization")+`"}}`)(w, r)
			},
			"error code": func(w http.ResponseWriter, r *http.Request) {
				reply(403, `{"status": "failed", "effect": "not_happened", "error": {"code": "`+token+`"}}`)(w, r)
			},
			"500 body": func(w http.ResponseWriter, r *http.Request) {
				reply(500, r.Header.Get("Authorization"))(w, r)
			},
			"invalid body": func(w http.ResponseWriter, r *http.Request) {
				reply(400, "token="+token[:10]+token[10:])(w, r)
			},
			"output": func(w http.ResponseWriter, r *http.Request) {
				reply(200, `{"status": "succeeded", "effect": "happened", "output": {"auth": "`+r.Header.Get("Authorization")+`"}}`)(w, r)
			},
		} {
			t.Run(name, func(t *testing.T) {
				srv, _ := server(t, answer)
				res, err := newTool(t, srv, write).Execute(context.Background(), call)
				require.NotContains(t, string(res.Output), token)
				if err != nil {
					te := toolError(t, err)
					require.NotContains(t, te.Code, token)
					require.NotContains(t, err.Error(), token)
				}
			})
		}
	})

	// A read takes no effect, whatever happened to the call.
	t.Run("ReadNeverHappens", func(t *testing.T) {
		read := descriptor(contracts.EffectRead, contracts.Guarantees{})
		srv, _ := server(t, reply(200, `{"status": "succeeded", "effect": "happened", "output": [1, 2]}`))
		res, err := newTool(t, srv, read).Execute(context.Background(), call)
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, res.Effect)

		srv, _ = server(t, reply(503, `busy`))
		_, err = newTool(t, srv, read).Execute(context.Background(), call)
		te := toolError(t, err)
		require.Equal(t, httptool.CodeStatus, te.Code)
		require.Equal(t, ledger.EffectNotHappened, te.Effect)
	})
}

func TestQuery(t *testing.T) {
	g := contracts.Guarantees{Query: true, Cancel: true}
	d := descriptor(contracts.EffectWrite, g)

	t.Run("OK", func(t *testing.T) {
		srv, s := server(t, reply(200, `{"effect": "happened", "output": {"ticket": 42}}`))
		res, err := newTool(t, srv, d).Query(context.Background(), "run_01/act_02")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectHappened, res.Effect)
		require.JSONEq(t, `{"ticket": 42}`, string(res.Output))
		r, body := s.last(t)
		require.Equal(t, "/query", r.URL.Path)
		require.Equal(t, "Bearer "+token, r.Header.Get("Authorization"))
		require.JSONEq(t, `{"dedup_key": "run_01/act_02"}`, string(body))
	})

	t.Run("NotHappenedFrom404", func(t *testing.T) {
		srv, _ := server(t, reply(404, `{"effect": "not_happened"}`))
		res, err := newTool(t, srv, d).Query(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, ledger.EffectNotHappened, res.Effect)
	})

	t.Run("ErrNoAnswer", func(t *testing.T) {
		for name, tc := range map[string]struct {
			status int
			body   string
			want   error
		}{
			"500":            {500, `{"effect": "not_happened"}`, httptool.ErrStatus},
			"no effect":      {200, `{"output": 1}`, httptool.ErrInvalidAnswer},
			"unknown effect": {200, `{"effect": "gone"}`, httptool.ErrInvalidAnswer},
			"not JSON":       {200, `yes`, httptool.ErrInvalidAnswer},
		} {
			t.Run(name, func(t *testing.T) {
				srv, _ := server(t, reply(tc.status, tc.body))
				res, err := newTool(t, srv, d).Query(context.Background(), "k")
				require.ErrorIs(t, err, tc.want)
				require.Equal(t, ledger.EffectUnknown, res.Effect, "unknown is never read as not happened")
				require.NotContains(t, err.Error(), token)
			})
		}
	})

	t.Run("ErrUnsupported", func(t *testing.T) {
		srv, _ := server(t, reply(200, `{"effect": "happened"}`))
		tool := newTool(t, srv, descriptor(contracts.EffectWrite, contracts.Guarantees{}))
		_, err := tool.Query(context.Background(), "k")
		require.ErrorIs(t, err, errors.ErrUnsupported)
		_, err = tool.Cancel(context.Background(), "k")
		require.ErrorIs(t, err, errors.ErrUnsupported)
	})
}

func TestCancel(t *testing.T) {
	d := descriptor(contracts.EffectWrite, contracts.Guarantees{Cancel: true})

	t.Run("OK", func(t *testing.T) {
		srv, s := server(t, reply(200, `{"confirmed": true, "detail": {"tombstone": 1}}`))
		res, err := newTool(t, srv, d).Cancel(context.Background(), "run_01/act_02")
		require.NoError(t, err)
		require.True(t, res.Confirmed)
		require.JSONEq(t, `{"tombstone": 1}`, string(res.Detail))
		r, body := s.last(t)
		require.Equal(t, "/cancel", r.URL.Path)
		require.JSONEq(t, `{"dedup_key": "run_01/act_02"}`, string(body))
	})

	t.Run("NotConfirmed", func(t *testing.T) {
		srv, _ := server(t, reply(409, `{"confirmed": false}`))
		res, err := newTool(t, srv, d).Cancel(context.Background(), "k")
		require.NoError(t, err)
		require.False(t, res.Confirmed)
	})

	t.Run("ErrNoConfirmed", func(t *testing.T) {
		srv, _ := server(t, reply(200, `{"detail": "done"}`))
		_, err := newTool(t, srv, d).Cancel(context.Background(), "k")
		require.ErrorIs(t, err, httptool.ErrInvalidAnswer)
	})
}

func TestNew(t *testing.T) {
	write := descriptor(contracts.EffectWrite, contracts.Guarantees{Dedup: true})
	for name, tc := range map[string]struct {
		d      contracts.ToolDescriptor
		ep     contracts.HTTPEndpoints
		getenv func(string) string
		part   string
	}{
		"no url":            {write, contracts.HTTPEndpoints{}, env, `url: an http or https URL, not ""`},
		"ftp":               {write, contracts.HTTPEndpoints{URL: "ftp://x.example/y"}, env, `an http or https URL, not "ftp"`},
		"no host":           {write, contracts.HTTPEndpoints{URL: "http:///y"}, env, "names no host"},
		"credentials":       {write, contracts.HTTPEndpoints{URL: "https://u:p@x.example/y"}, env, "carries credentials"},
		"bad query url":     {write, contracts.HTTPEndpoints{URL: "https://x.example/y", QueryURL: "mailto:a@b"}, env, "query_url"},
		"query without url": {descriptor(contracts.EffectWrite, contracts.Guarantees{Query: true}), contracts.HTTPEndpoints{URL: "https://x.example/y"}, env, "needs a query_url"},
		"cancel without url": {descriptor(contracts.EffectWrite, contracts.Guarantees{Cancel: true}), contracts.HTTPEndpoints{URL: "https://x.example/y"}, env,
			"needs a cancel_url"},
		"token unset": {write, contracts.HTTPEndpoints{URL: "https://x.example/y", BearerTokenEnv: "NOT_SET"}, env, "NOT_SET is not set"},
		"token with newline": {write, contracts.HTTPEndpoints{URL: "https://x.example/y", BearerTokenEnv: "TICKETS_TOKEN"},
			func(string) string { return token + "\r\nX-Evil: 1" }, "no header can carry"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := httptool.New(tc.d, tc.ep, httptool.Options{Getenv: tc.getenv})
			require.ErrorContains(t, err, tc.part)
			require.ErrorContains(t, err, "tickets.open")
			require.NotContains(t, err.Error(), token)
		})
	}
}

// discardLog silences a test server's log of the handlers that abort on
// purpose.
func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }
