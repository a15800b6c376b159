package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/stretchr/testify/require"
)

// apiEnv is a real server on a temp database, in process: the service as
// serve wires it, server.New, and an httptest server. The engine's pool is
// not started; tests advance runs with advance, so every state is reached
// deterministically.
type apiEnv struct {
	url    string
	dir    string
	svc    *service
	tokens map[string]string // principal → bearer token
}

// The principals of apiEnv: alice submits and bob approves in tenant acme;
// carol approves in tenant globex and must see nothing of acme.
var testPrincipals = []struct {
	name, tenant string
	roles        []string
}{
	{"alice", "acme", []string{"submitter"}},
	{"bob", "acme", []string{"approver"}},
	{"carol", "globex", []string{"approver", "submitter"}},
}

type envOptions struct {
	devMode   bool
	simulator simulator.Config
}

func newAPIEnv(t *testing.T, opts envOptions) *apiEnv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	svc, err := openService(ctx, serviceConfig{DBPath: filepath.Join(dir, "ledger.db"), DevMode: opts.devMode,
		Simulator: opts.simulator, Logger: discardLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, svc.Close()) })
	env := &apiEnv{dir: dir, svc: svc, tokens: map[string]string{}}
	var tokens *server.Tokens
	if !opts.devMode {
		var file server.TokensFile
		for _, p := range testPrincipals {
			tok, entry, err := server.NewTokenLine(p.name, p.tenant, p.roles)
			require.NoError(t, err)
			env.tokens[p.name] = tok
			file.Tokens = append(file.Tokens, entry)
		}
		data, err := json.Marshal(file)
		require.NoError(t, err)
		tokens, err = server.ParseTokens(data)
		require.NoError(t, err)
	}
	srv, err := server.New(server.Config{Store: svc.store, Engine: svc.engine, Approvals: svc.approvals,
		Tokens: tokens, Logger: discardLogger()})
	require.NoError(t, err)
	// Every answer the CLI receives is checked against the document the
	// server serves.
	hs := servertest.NewServer(t, srv.Handler())
	env.url = hs.URL
	return env
}

// cli runs the CLI as principal against the env's server ("" sends no token).
func (e *apiEnv) cli(t *testing.T, principal string, args ...string) (string, string, error) {
	t.Helper()
	args = append(args, "--server", e.url)
	if principal != "" {
		args = append(args, "--token", e.tokens[principal])
	}
	return runCLI(t, nil, args...)
}

// runCLI runs the CLI with stdin (nil for none) and returns stdout and stderr.
func runCLI(t *testing.T, stdin *strings.Reader, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd(&out, &errOut)
	if stdin != nil {
		root.SetIn(stdin)
	}
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// submit submits the sample document as principal and returns the run id.
func (e *apiEnv) submit(t *testing.T, principal, key string) ledger.RunID {
	t.Helper()
	out, _, err := e.cli(t, principal, "submit", "--title", "Sample", "--markdown-file", e.sample(t), "--key", key, "--json")
	require.NoError(t, err)
	var sr server.SubmitResponse
	require.NoError(t, json.Unmarshal([]byte(out), &sr))
	return sr.ID
}

// sample writes the simulator's sample document and returns its path.
func (e *apiEnv) sample(t *testing.T) string {
	t.Helper()
	path := filepath.Join(e.dir, "sample.md")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	_, md := simulator.SampleDocument()
	require.NoError(t, os.WriteFile(path, []byte(md), 0o644))
	return path
}

// advance moves the run as far as the engine can without a person.
func (e *apiEnv) advance(t *testing.T, id ledger.RunID) {
	t.Helper()
	require.NoError(t, e.svc.engine.Advance(context.Background(), id))
}

// awaiting submits a run as alice, advances it to its pending approval and
// returns the run and its write action.
func (e *apiEnv) awaiting(t *testing.T, key string) (ledger.RunID, *ledger.Action) {
	t.Helper()
	id := e.submit(t, "alice", key)
	e.advance(t, id)
	actions, err := e.svc.store.FindActions(context.Background(), ledger.ActionFilter{RunID: &id})
	require.NoError(t, err)
	for _, a := range actions {
		if a.State == ledger.ActionAwaitingApproval {
			return id, a
		}
	}
	t.Fatalf("run %s has no action awaiting approval", id)
	return "", nil
}

// requireExit asserts err's exit status.
func requireExit(t *testing.T, err error, code int) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, exitStatus(err), "error: %v", err)
}

func TestClient(t *testing.T) {
	t.Run("ErrBadToken", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		_, _, err := runCLI(t, nil, "runs", "list", "--server", env.url, "--token", "lgr_not-a-real-token")
		requireExit(t, err, 4)
		require.Contains(t, err.Error(), "401 unauthorized: unknown token")
		require.NotContains(t, err.Error(), "lgr_not-a-real-token", "the token is never printed")

		_, _, err = env.cli(t, "", "runs", "list")
		requireExit(t, err, 4)
	})

	t.Run("Environment", func(t *testing.T) {
		env := newAPIEnv(t, envOptions{})
		t.Setenv(envServer, env.url)
		t.Setenv(envToken, env.tokens["alice"])
		out, _, err := runCLI(t, nil, "runs", "list")
		require.NoError(t, err)
		require.Equal(t, "no runs\n", out)

		// A flag wins over the environment.
		_, _, err = runCLI(t, nil, "runs", "list", "--token", "lgr_wrong")
		requireExit(t, err, 4)
	})

	t.Run("ErrServerDown", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		_, _, err = runCLI(t, nil, "runs", "list", "--server", "http://"+addr, "--token", "lgr_secret")
		requireExit(t, err, 1)
		require.Contains(t, err.Error(), "cannot reach the ledger server at http://"+addr)
		require.Contains(t, err.Error(), "is `ledger serve` running?")
		require.NotContains(t, err.Error(), "lgr_secret")
	})

	t.Run("ErrTimeout", func(t *testing.T) {
		release := make(chan struct{})
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		defer hs.Close()
		defer close(release)
		start := time.Now()
		_, _, err := runCLI(t, nil, "runs", "list", "--server", hs.URL, "--timeout", "100ms")
		requireExit(t, err, 1)
		require.Contains(t, err.Error(), "no answer from "+hs.URL+" within 100ms")
		require.Less(t, time.Since(start), 10*time.Second)
	})

	t.Run("ErrBadServerURL", func(t *testing.T) {
		_, _, err := runCLI(t, nil, "runs", "list", "--server", "127.0.0.1:8080")
		requireExit(t, err, 2)
		require.Contains(t, err.Error(), "want a URL like http://127.0.0.1:8080")
	})

	t.Run("ErrInProgress", func(t *testing.T) {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"type":"x","title":"Request in progress","status":409,"code":"request_in_progress","detail":"still processing"}`))
		}))
		defer hs.Close()
		_, _, err := runCLI(t, nil, "cancel", "run_x", "--server", hs.URL)
		requireExit(t, err, 6)
		require.Equal(t, "409 request_in_progress: still processing (retry after 1s)", err.Error())
	})

	t.Run("ErrNotProblemJSON", func(t *testing.T) {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "upstream exploded", http.StatusBadGateway)
		}))
		defer hs.Close()
		_, _, err := runCLI(t, nil, "runs", "list", "--server", hs.URL)
		requireExit(t, err, 1)
		require.Equal(t, "502 bad_gateway: upstream exploded", err.Error())
	})
}

func TestAPIErrorExitCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		code   string
		want   int
	}{
		{400, "invalid", 2},
		{413, "payload_too_large", 2},
		{415, "unsupported_media_type", 2},
		{401, "unauthorized", 4},
		{403, "forbidden", 4},
		{404, "not_found", 5},
		{409, "conflict", 6},
		{422, "idempotency_key_reused", 6},
		{500, "internal", 1},
		{503, "not_ready", 1},
	} {
		err := &APIError{Status: tc.status, Problem: server.Problem{Code: tc.code, Detail: "d"}}
		require.Equal(t, tc.want, exitStatus(err), "%d", tc.status)
		require.Equal(t, tc.status, server.StatusOf(tc.code), "server maps %s to %d", tc.code, tc.status)
	}
	err := &APIError{Status: 409, Problem: server.Problem{Code: "conflict", Detail: "digest mismatch",
		Errors: []server.FieldError{{Location: "/action_digest", Message: "stale"}}}}
	require.Equal(t, "409 conflict: digest mismatch\n  /action_digest: stale", err.Error())
	require.Equal(t, 2, exitStatus(usagef("bad")))
	require.Equal(t, 2, exitCode(usagef("bad")), "usage errors are ledger.ErrInvalid too")
}

// TestJSONErrors: with --json, a refused request prints the server's
// problem document, indented, on stderr (stdout stays for answers), keeps
// its exit status, and is not printed a second time as a line.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	env := newAPIEnv(t, envOptions{})
	runJSON := func(t *testing.T, args ...string) (string, string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := Run(context.Background(), append(args, "--server", env.url, "--json"), &out, &errOut)
		return out.String(), errOut.String(), err
	}
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		code   string
		exit   int
	}{
		{"NotFound", []string{"runs", "show", "run_01JAAAAAAAAAAAAAAAAAAAAAAA", "--token", env.tokens["alice"]}, 404, "not_found", exitNotFound},
		{"Unauthorized", []string{"runs", "list", "--token", "lgr_wrong"}, 401, "unauthorized", exitAuth},
		{"ApproveUnknownAction", []string{"approve", "act_01JAAAAAAAAAAAAAAAAAAAAAAA", "--digest", "sha256:" + strings.Repeat("0", 64), "--token", env.tokens["bob"]}, 404, "not_found", exitNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runJSON(t, tc.args...)
			requireExit(t, err, tc.exit)
			require.Empty(t, out)
			var p server.Problem
			require.NoError(t, json.Unmarshal([]byte(errOut), &p), "stderr is the problem document:\n%s", errOut)
			require.Equal(t, tc.status, p.Status)
			require.Equal(t, tc.code, p.Code)
			require.True(t, strings.HasPrefix(errOut, "{\n  \""), "indented")
			require.NotContains(t, errOut, "lgr_wrong")
			var shown *reportedError
			require.ErrorAs(t, err, &shown, "main must not print it again")
		})
	}
	t.Run("StaleDigest", func(t *testing.T) {
		_, action := env.awaiting(t, "k1")
		_, errOut, err := runJSON(t, "approve", string(action.ID), "--digest", "sha256:"+strings.Repeat("0", 64), "--token", env.tokens["bob"])
		requireExit(t, err, exitConflict)
		var p server.Problem
		require.NoError(t, json.Unmarshal([]byte(errOut), &p), errOut)
		require.Equal(t, 409, p.Status)
	})
	t.Run("WithoutJSONOneLine", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"runs", "list", "--server", env.url, "--token", "lgr_wrong"}, &out, &errOut)
		requireExit(t, err, exitAuth)
		require.Empty(t, errOut.String(), "main prints the line")
		require.Equal(t, "401 unauthorized: unknown token", err.Error())
		var shown *reportedError
		require.False(t, errors.As(err, &shown))
	})
	t.Run("NotFromServer", func(t *testing.T) {
		// No problem document to print: the error stays a line for main.
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"runs", "list", "--server", "http://127.0.0.1:1", "--json"}, &out, &errOut)
		requireExit(t, err, exitOther)
		require.Empty(t, errOut.String())
	})
}
