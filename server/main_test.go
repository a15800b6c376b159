package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/ledgertest"
	"github.com/actionledger/ledger/ledger/sqlite"
	"github.com/actionledger/ledger/recovery"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/server/servertest"
	"github.com/actionledger/ledger/simulator"
	"github.com/actionledger/ledger/storehealth"
)

// TestMain fails the package if a goroutine outlives the tests: servers,
// clients, engines and stores must all be closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// principals of the test tokens file: name → tenant, roles and, with the
// role agent, the agents it drives.
var principals = map[string]struct {
	tenant string
	roles  []string
	agents []string
}{
	"alice": {"acme", []string{"submitter"}, nil},
	"amy":   {"acme", []string{"submitter"}, nil},
	"bob":   {"acme", []string{"approver"}, nil},
	"carol": {"acme", []string{"auditor"}, nil},
	"root":  {"acme", []string{"admin"}, nil},
	"sam":   {"acme", []string{"submitter", "approver"}, nil},
	"eve":   {"globex", []string{"submitter"}, nil},
	"gina":  {"globex", []string{"approver", "auditor"}, nil},
	"andy":  {"acme", []string{"agent"}, []string{"payer"}},
	"alf":   {"acme", []string{"agent", "auditor"}, []string{"payer"}},
	// ada and gus drive clientAgent's runs (newProtocolEnv), in two tenants.
	"ada": {"acme", []string{"agent"}, []string{"my-agent"}},
	"gus": {"globex", []string{"agent"}, []string{"my-agent"}},
}

// options tune an env.
type options struct {
	sim         simulator.Config
	dev         bool     // no tokens file
	secretPaths []string // secret_paths of cards.write
	config      func(*server.Config)
	// hooks wires the store's commits and the engine's tool calls and
	// recovery decisions to the server's metrics, as serve does.
	hooks bool
	fault func(engine.FaultPoint) // the engine's FaultFunc
	// agents are registered beside practice-cards.
	agents []engine.Agent
	// tools are the engine's Config.Tools: tools it calls that no agent
	// need list (the http tools).
	tools []engine.Tool
	// client adds the client-driven agent my-agent (clientAgent) and its
	// tools, for the agent protocol's tests (newProtocolEnv).
	client bool
	// engineStore, if set, wraps the store the engine uses.
	engineStore func(ledger.Store) ledger.Store
	// writeFault, if set, is the store's write fault hook
	// (sqlite.Config.WriteFaultFunc): a full disk, for one.
	writeFault func(n int64, at ledger.WritePoint) error
}

// testRedactionKey is the one redaction key of an env, as a process has
// one: what the engine stores and what the server shows share markers.
var testRedactionKey = []byte("server-test-redaction-key-0123456789")

// env is the whole service on real SQLite files behind an httptest
// server: the ledger with a fake clock, the simulator's own effect store,
// the approval service, the engine with the practice-cards agent and the
// server. Runs are advanced with engine.Advance, deterministically.
type env struct {
	*ledgertest.Bundle
	effects   *simulator.EffectStore
	approvals *approval.Service
	engine    *engine.Engine
	redactor  *redact.Redactor
	srv       *server.Server
	validator *servertest.Validator
	ts        *httptest.Server // serves srv through validator
	client    *http.Client
	tokens    map[string]string // principal → bearer token
}

func newEnv(t testing.TB, o options) *env {
	t.Helper()
	ctx := context.Background()
	var metrics atomic.Pointer[server.Metrics] // set once the server exists
	// The store's health is its hook, as serve wires it: the engine, and
	// through it the server, read it.
	var health *storehealth.Tracker
	lb := ledgertest.OpenStoreWith(t, func(c *sqlite.Config) {
		health = storehealth.New(storehealth.Config{Now: c.Now})
		c.Observe = health.Observe
		c.WriteFaultFunc = o.writeFault
		if o.hooks {
			c.OnCommit = func(s ledger.CommitStats) {
				if m := metrics.Load(); m != nil {
					m.ObserveCommit(s)
				}
			}
		}
	})
	effects, err := simulator.OpenEffectStore(ctx, filepath.Join(t.TempDir(), "effects.db"), lb.Clock.Now)
	require.NoError(t, err)
	t.Cleanup(func() { _ = effects.Close() })

	agent := simulator.PracticeCardsAgent(effects, o.sim)
	if o.secretPaths != nil {
		desc := simulator.CardsWriteDescriptor()
		desc.SecretPaths = o.secretPaths
		agent.Tools[0] = simulator.NewTool(desc, effects, o.sim.Tools[simulator.CardsWriteTool])
	}
	agents := append([]engine.Agent{agent}, o.agents...)
	if o.client {
		agents = append(agents, engine.Agent{Name: clientAgent, Driver: engine.DriverClient, Tools: clientTools()})
	}
	tools := map[string]contracts.ToolDescriptor{}
	for _, a := range agents {
		for _, tool := range a.Tools {
			tools[tool.Descriptor().Name] = tool.Descriptor()
		}
	}
	redactor, err := redact.NewRedactor(testRedactionKey)
	require.NoError(t, err)
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	require.NoError(t, err)
	svc := approval.NewService(lb.Store, policy, func(n string) (contracts.ToolDescriptor, bool) {
		d, ok := tools[n]
		return d, ok
	}, approval.Options{RelaxSeparationOfDuties: o.dev})
	ecfg := engine.Config{Store: lb.Store, Approvals: svc, Agents: agents, Tools: o.tools,
		Now: lb.Clock.Now, PollInterval: 10 * time.Millisecond, FaultFunc: o.fault, Redactor: redactor, Health: health}
	if o.engineStore != nil {
		ecfg.Store = o.engineStore(ecfg.Store)
	}
	if o.hooks {
		ecfg.OnToolCall = func(c engine.ToolCallStats) {
			if m := metrics.Load(); m != nil {
				m.ObserveToolCall(c)
			}
		}
		ecfg.OnDecision = func(d recovery.Decision) {
			if m := metrics.Load(); m != nil {
				m.ObserveDecision(d)
			}
		}
	}
	eng, err := engine.New(ecfg)
	require.NoError(t, err)
	t.Cleanup(eng.Stop)

	e := &env{Bundle: lb, effects: effects, approvals: svc, engine: eng, redactor: redactor, tokens: map[string]string{}}
	cfg := server.Config{Store: lb.Store, Engine: eng, Approvals: svc, Redaction: redactor}
	if !o.dev {
		cfg.Tokens = e.writeTokens(t)
	}
	if o.config != nil {
		o.config(&cfg)
	}
	e.srv, err = server.New(cfg)
	require.NoError(t, err)
	metrics.Store(e.srv.Metrics())
	// Every answer a test receives is checked against the document the
	// server serves: the API document is the truth.
	e.validator, err = servertest.Fetch(context.Background(), e.srv.Handler())
	require.NoError(t, err)
	e.ts = httptest.NewServer(e.validator.Handler(t, e.srv.Handler()))
	e.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		e.client.CloseIdleConnections()
		e.ts.Close()
	})
	return e
}

// clientAgent is the client-driven agent of newProtocolEnv: the engine
// takes no step of its runs, the test is its client.
const clientAgent = "my-agent"

// The tools of clientAgent, one for each way recovery can go after a
// lost call: a read; a write that can be queried, one that dedups, one
// that can be cancelled, and one that promises nothing (review).
const (
	toolRead   = "notes.read"
	toolQuery  = "payments.send"
	toolDedup  = "mail.send"
	toolCancel = "jobs.run"
	toolNone   = "files.delete"
)

// clientLease is every client tool's lease: 30 s from the last
// heartbeat, at most 2 minutes from the start.
var clientLease = engine.Lease{HeartbeatTimeout: 30 * time.Second, MaxDuration: 2 * time.Minute}

// clientTools are clientAgent's tools (engine.ClientTool): the engine
// never calls them.
func clientTools() []engine.Tool {
	const idSchema = `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
		"additionalProperties": false, "required": ["id"], "properties": {"id": {"type": "string", "minLength": 1}}}`
	tool := func(name string, effect contracts.Effect, schema string, g contracts.Guarantees) engine.Tool {
		d := contracts.ToolDescriptor{SchemaVersion: contracts.DefaultVersion, Name: name, Version: "1", Effect: effect,
			ArgumentsSchema: json.RawMessage(schema), Guarantees: g, TimeoutMS: 60_000}
		if g.Dedup {
			d.DedupRetentionMS = 24 * 60 * 60 * 1000
		}
		return engine.ClientTool(d, clientLease)
	}
	return []engine.Tool{
		tool(toolRead, contracts.EffectRead, `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
			"additionalProperties": false, "required": ["q"], "properties": {"q": {"type": "string", "minLength": 1}}}`,
			contracts.Guarantees{Dedup: true}),
		tool(toolQuery, contracts.EffectWrite, `{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
			"additionalProperties": false, "required": ["to", "cents"],
			"properties": {"to": {"type": "string", "minLength": 1}, "cents": {"type": "integer", "minimum": 1}}}`,
			contracts.Guarantees{Query: true}),
		tool(toolDedup, contracts.EffectWrite, idSchema, contracts.Guarantees{Dedup: true}),
		tool(toolCancel, contracts.EffectWrite, idSchema, contracts.Guarantees{Cancel: true}),
		tool(toolNone, contracts.EffectWrite, idSchema, contracts.Guarantees{}),
	}
}

// newProtocolEnv is newEnv with clientAgent registered beside
// practice-cards.
func newProtocolEnv(t testing.TB, o options) *env {
	t.Helper()
	o.client = true
	return newEnv(t, o)
}

// writeTokens makes a token per principal, writes the tokens file and
// loads it the way serve does.
func (e *env) writeTokens(t testing.TB) *server.Tokens {
	t.Helper()
	var f server.TokensFile
	for name, p := range principals {
		tok, line, err := server.NewTokenLine(name, p.tenant, p.roles, p.agents...)
		require.NoError(t, err)
		e.tokens[name] = tok
		f.Tokens = append(f.Tokens, line)
	}
	return loadTokensFile(t, f)
}

// loadTokensFile writes f as a tokens file and loads it as serve does.
func loadTokensFile(t testing.TB, f server.TokensFile) *server.Tokens {
	t.Helper()
	data, err := json.Marshal(f)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	tokens, err := server.LoadTokens(path)
	require.NoError(t, err)
	return tokens
}

// response is an answer, read whole.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// request is one call to the API.
type request struct {
	principal string // "" sends no Authorization header
	method    string
	path      string
	body      string
	header    map[string][]string // replaces defaults; an empty slice removes a header
}

func (e *env) send(t testing.TB, r request) response {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, e.ts.URL+r.path, body)
	require.NoError(t, err)
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.principal != "" {
		tok, ok := e.tokens[r.principal]
		require.True(t, ok, "no token for %s", r.principal)
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for k, vs := range r.header {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	return e.roundTrip(t, req)
}

func (e *env) roundTrip(t testing.TB, req *http.Request) response {
	t.Helper()
	res, err := e.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{Status: res.StatusCode, Header: res.Header, Body: b}
}

// direct serves req with the handler, without a network in between (for
// what a client library would not send, or a remote address), and checks
// the answer against the document as the network path does.
func (e *env) direct(t testing.TB, req *http.Request) response {
	t.Helper()
	rec := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, req)
	res := response{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	require.NoError(t, e.validator.Check(req, res.Status, res.Header, res.Body))
	return res
}

func (e *env) get(t testing.TB, principal, path string) response {
	t.Helper()
	return e.send(t, request{principal: principal, method: http.MethodGet, path: path})
}

func (e *env) post(t testing.TB, principal, path, body string) response {
	t.Helper()
	return e.send(t, request{principal: principal, method: http.MethodPost, path: path, body: body})
}

// submitBody is the practice-cards submission of the sample document.
func submitBody(t testing.TB) string {
	t.Helper()
	title, md := simulator.SampleDocument()
	b, err := json.Marshal(map[string]any{"agent": "practice-cards", "input": map[string]string{"title": title, "markdown": md}})
	require.NoError(t, err)
	return string(b)
}

func (e *env) submitRaw(t testing.TB, principal, key, body string) response {
	t.Helper()
	return e.send(t, request{principal: principal, method: http.MethodPost, path: "/v1/runs", body: body,
		header: map[string][]string{"Idempotency-Key": {key}}})
}

// submit submits the sample run and returns its id.
func (e *env) submit(t testing.TB, principal, key string) ledger.RunID {
	t.Helper()
	res := e.submitRaw(t, principal, key, submitBody(t))
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var sr server.SubmitResponse
	decode(t, res, &sr)
	return sr.ID
}

// advance drives a run as far as the engine can take it.
func (e *env) advance(t testing.TB, id ledger.RunID) *ledger.Run {
	t.Helper()
	require.NoError(t, e.engine.Advance(context.Background(), id))
	return e.run(t, id)
}

func (e *env) run(t testing.TB, id ledger.RunID) *ledger.Run {
	t.Helper()
	run, err := e.Store.FindRunByID(context.Background(), id)
	require.NoError(t, err)
	return run
}

// awaiting submits the sample run as principal and advances it to its
// pending cards.write action.
func (e *env) awaiting(t testing.TB, principal, key string) (ledger.RunID, *ledger.Action) {
	t.Helper()
	id := e.submit(t, principal, key)
	run := e.advance(t, id)
	require.Equal(t, ledger.RunAwaitingApproval, run.State)
	return id, e.pendingAction(t, id)
}

// pendingAction is the run's one action waiting for approval.
func (e *env) pendingAction(t testing.TB, id ledger.RunID) *ledger.Action {
	t.Helper()
	pending := ledger.ApprovalPending
	aprs, err := e.Store.FindApprovals(context.Background(), ledger.ApprovalFilter{RunID: &id, State: &pending})
	require.NoError(t, err)
	require.Len(t, aprs, 1)
	a, err := e.Store.FindActionByID(context.Background(), aprs[0].ActionID)
	require.NoError(t, err)
	require.Equal(t, aprs[0].ActionDigest, a.ActionDigest)
	return a
}

// effectCount counts effects in the simulator's own store, never the
// ledger's.
func (e *env) effectCount(t testing.TB) int {
	t.Helper()
	es, err := e.effects.Effects(context.Background())
	require.NoError(t, err)
	return len(es)
}

func (e *env) runCount(t testing.TB) int {
	t.Helper()
	runs, err := e.Store.FindRuns(context.Background(), ledger.RunFilter{})
	require.NoError(t, err)
	return len(runs)
}

func decode(t testing.TB, r response, v any) {
	t.Helper()
	require.Equal(t, "application/json", r.Header.Get("Content-Type"), string(r.Body))
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), string(r.Body))
}

// requireProblem checks that r is a problem+json answer with status and
// code, and returns it.
func requireProblem(t testing.TB, r response, status int, code string) server.Problem {
	t.Helper()
	require.Equal(t, status, r.Status, string(r.Body))
	require.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	var p server.Problem
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&p), string(r.Body))
	require.Equal(t, status, p.Status)
	require.Equal(t, code, p.Code, p.Detail)
	require.Equal(t, "https://actionledger.dev/problems/"+code, p.Type)
	require.NotEmpty(t, p.Title)
	require.Equal(t, status, server.StatusOf(code), "the one table")
	return p
}

// requireLocation checks that a problem names a field.
func requireLocation(t testing.TB, p server.Problem, location, msgPart string) {
	t.Helper()
	for _, fe := range p.Errors {
		if fe.Location == location && strings.Contains(fe.Message, msgPart) {
			return
		}
	}
	t.Fatalf("no error at %q containing %q in %+v", location, msgPart, p.Errors)
}

func ptr[T any](v T) *T { return &v }

func digestBody(d ledger.Digest) string {
	return `{"action_digest":"` + string(d) + `","reason":"looks right"}`
}
