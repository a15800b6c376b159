package mcpgw

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// More _meta keys of the gateway's answers and of the calls it reads.
const (
	// MetaIdempotencyKey, in a client's call, is its own key for the call:
	// the same key in the same run is the same action.
	MetaIdempotencyKey = "io.actionledger/idempotency_key"
	// MetaState is the action's state when the gateway answered.
	MetaState = "io.actionledger/state"
	// MetaDigest is the action's digest, which an approval names.
	MetaDigest = "io.actionledger/digest"
	// MetaAttemptID names the attempt whose outcome the answer carries.
	MetaAttemptID = "io.actionledger/attempt_id"
	// MetaReplayed says the answer is one recorded earlier, not a new call.
	MetaReplayed = "io.actionledger/replayed"
	// MetaAnswerLost says the call took effect but its own answer was lost
	// with a crashed process: the result says so and carries no content
	// of the upstream's.
	MetaAnswerLost = "io.actionledger/answer_lost"
)

// Identity is who makes a call: the principal and tenant of the API token
// (over HTTP), or those the stdio gateway was started with.
type Identity struct {
	Tenant    string
	Principal string
}

// Options configure a Gateway.
type Options struct {
	// Config is the config file's mcp section; Dir the config file's
	// directory, against which lock_file is read.
	Config *contracts.ConfigMCP
	Dir    string
	Logger *slog.Logger
	Now    func() time.Time
	// StateKey is the HMAC key of request states; nil makes one for this
	// process, so that its states die with it.
	StateKey []byte
	// ApprovalURL is where a person approves an action (the API's action
	// URL until the console exists); nil leaves URLs out.
	ApprovalURL func(ledger.ActionID) string
	// Version names the gateway to upstreams and clients.
	Version string
	// MaxPendingApprovals caps a tenant's pending approvals at a call, as
	// serve's --max-pending-approvals; 0: no cap.
	MaxPendingApprovals int
	// Approvals, if set, lets a client's own confirmation grant an action
	// where a rule allows it (allow_self_confirmation); nil: only people
	// approve.
	Approvals SelfConfirmations
}

// SelfConfirmations is what the gateway asks of the approval service
// (*approval.Service): whether a rule lets a client's answer to a form
// elicitation grant an action, and the grant, recorded as
// self_confirmation.
type SelfConfirmations interface {
	AllowsSelfConfirmation(a *ledger.Action) bool
	SelfConfirm(ctx context.Context, tenant, caller string, id ledger.ActionID, digest ledger.Digest) (ledger.DecideApprovalResult, error)
}

// Gateway is the MCP gateway of one config: its upstreams, the tools whose
// definitions are confirmed, and, once bound to the engine, the front end
// that serves MCP clients (ServeStdio, HTTPHandler).
type Gateway struct {
	opts     Options
	cfg      *contracts.ConfigMCP
	log      *slog.Logger
	now      func() time.Time
	lockPath string
	lock     *Lock
	ups      map[string]*upstream
	tools    map[string]*tool // by client name
	engine   *engine.Engine
	stateKey []byte
	// toDeliver holds the attempts whose answers the stdio transport
	// records as delivered once written (deliveryConn), by id.
	toDeliver sync.Map
}

// New reads the lock file and makes the tools of its confirmed
// definitions whose upstream the config still lists. It connects to no
// upstream: each is connected at its first use.
func New(o Options) (*Gateway, error) {
	if o.Config == nil {
		return nil, errors.New("mcpgw: no mcp section in the config")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	g := &Gateway{opts: o, cfg: o.Config, log: o.Logger.With("component", "mcp"), now: o.Now,
		ups: map[string]*upstream{}, tools: map[string]*tool{}, stateKey: o.StateKey}
	if g.stateKey == nil {
		g.stateKey = make([]byte, 32)
		if _, err := rand.Read(g.stateKey); err != nil {
			return nil, fmt.Errorf("mcpgw: request state key: %w", err)
		}
	}
	g.lockPath = g.cfg.LockFile
	if g.lockPath == "" {
		g.lockPath = contracts.DefaultMCPLockFile
	}
	if !filepath.IsAbs(g.lockPath) {
		g.lockPath = filepath.Join(o.Dir, g.lockPath)
	}
	lock, err := ReadLock(g.lockPath)
	if err != nil {
		return nil, err
	}
	g.lock = lock
	impl := &mcp.Implementation{Name: "ledger-mcp-gateway", Version: o.Version}
	for _, u := range g.cfg.Upstreams {
		g.ups[u.Name] = newUpstream(u, impl, g.cfg.ResultCap(), g.log, g.now)
	}
	seen := map[string]string{}
	for _, name := range lock.Names() {
		lt := lock.Tools[name]
		up, ok := g.ups[lt.Upstream]
		if !ok {
			g.log.Warn("a confirmed tool's upstream is not in the config: the tool is not served", "tool", name)
			continue
		}
		t, err := g.newTool(up, lt)
		if err != nil {
			return nil, fmt.Errorf("mcpgw: tool %s: %w", name, err)
		}
		if other, dup := seen[t.desc.Name]; dup {
			return nil, fmt.Errorf("mcpgw: tools %s and %s would both be recorded as %s: rename one upstream", other, name, t.desc.Name)
		}
		seen[t.desc.Name] = name
		g.tools[name] = t
	}
	return g, nil
}

// newTool makes the tool of a confirmed definition, by its profile.
func (g *Gateway) newTool(up *upstream, lt LockedTool) (*tool, error) {
	var def mcp.Tool
	if err := json.Unmarshal(lt.Definition, &def); err != nil {
		return nil, fmt.Errorf("confirmed definition: %w", err)
	}
	profile, _ := up.cfg.Profile(lt.Tool)
	schema, err := argumentsSchema(def.InputSchema)
	if err != nil {
		return nil, err
	}
	version, err := ledger.DigestOf(struct {
		Definition ledger.Digest         `json:"definition"`
		Profile    contracts.ToolProfile `json:"profile"`
	}{lt.Digest, profile})
	if err != nil {
		return nil, err
	}
	desc := contracts.ToolDescriptor{SchemaVersion: contracts.CurrentVersion, Name: ledgerName(up.cfg.Name, lt.Tool),
		Version: "mcp-" + strings.TrimPrefix(string(version), "sha256:")[:24], Effect: profile.Effect, ArgumentsSchema: schema,
		Guarantees: profile.Guarantees, SecretPaths: profile.SecretPaths, TimeoutMS: profile.TimeoutMS,
		DedupRetentionMS: profile.DedupRetentionMS, QueryVisibilityMS: profile.QueryVisibilityMS, Description: clip(def.Description, 1000)}
	shown := def
	shown.Name = clientName(up.cfg.Name, lt.Tool)
	shown.Meta = nil
	shown.Annotations = annotationsOf(profile, def.Annotations)
	return &tool{up: up, name: lt.Tool, client: shown.Name, desc: desc, profile: profile, locked: lt, def: &shown,
		maxResult: g.cfg.ResultCap()}, nil
}

// annotationsOf are the annotations clients see: the profile's effect and
// guarantees, whatever the upstream hinted; its title is kept.
func annotationsOf(p contracts.ToolProfile, hinted *mcp.ToolAnnotations) *mcp.ToolAnnotations {
	read := p.Effect == contracts.EffectRead
	a := &mcp.ToolAnnotations{ReadOnlyHint: read, IdempotentHint: read || p.Guarantees.Dedup}
	if !read {
		a.DestructiveHint = ptr(true)
	}
	if hinted != nil {
		a.Title = hinted.Title
	}
	return a
}

func ptr[T any](v T) *T { return &v }

// argumentsSchema is an upstream's input schema as a tool descriptor's
// arguments schema: JSON Schema 2020-12 (the MCP default; a $schema naming
// another draft is dropped), an object.
func argumentsSchema(in any) (json.RawMessage, error) {
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("input schema: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New("input schema: not a JSON object")
	}
	if s, ok := m["$schema"]; ok && s != "https://json-schema.org/draft/2020-12/schema" {
		delete(m, "$schema")
	}
	if m["type"] == nil {
		m["type"] = "object"
	}
	if m["type"] != "object" {
		return nil, fmt.Errorf("input schema: type %v, not object", m["type"])
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return ledger.Canonicalize(out)
}

// ledgerName is the ledger's name of an upstream's tool:
// <upstream>.<tool> in lower case, words joined by underscores.
func ledgerName(upstream, tool string) string {
	var b strings.Builder
	prev := '_'
	for i, r := range tool {
		switch {
		case unicode.IsUpper(r):
			if i > 0 && prev != '_' && !unicode.IsUpper(prev) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			r = '_'
			if prev != '_' {
				b.WriteByte('_')
			}
		}
		prev = r
	}
	name := strings.Trim(b.String(), "_")
	if name == "" || name[0] >= '0' && name[0] <= '9' {
		name = "t_" + name
	}
	return upstream + "." + name
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// LockPath is the lock file the gateway reads.
func (g *Gateway) LockPath() string { return g.lockPath }

// Lock is the lock file as the gateway read it.
func (g *Gateway) Lock() *Lock { return g.lock }

// Agent is the engine agent of the gateway's runs, its tools the confirmed
// ones. Register it with the engine, then Bind.
func (g *Gateway) Agent() engine.Agent {
	a := engine.Agent{Name: g.cfg.AgentName(), Driver: engine.DriverGateway, Tenants: g.cfg.Tenants, ContinueOnToolError: true}
	for _, name := range g.lock.Names() {
		if t, ok := g.tools[name]; ok {
			a.Tools = append(a.Tools, t)
		}
	}
	if p := g.cfg.Policies; p != nil {
		a.Policy = budget.Policy{RepeatLimit: p.RepeatLimit, NoProgressWindow: p.NoProgressWindow, ConsecutiveErrors: p.ConsecutiveErrors}
	}
	return a
}

// Bind gives the gateway the engine its agent is registered with.
func (g *Gateway) Bind(e *engine.Engine) { g.engine = e }

// Upstreams are the configured upstreams' names, in file order.
func (g *Gateway) Upstreams() []string {
	out := make([]string, 0, len(g.cfg.Upstreams))
	for _, u := range g.cfg.Upstreams {
		out = append(out, u.Name)
	}
	return out
}

// ListUpstream lists an upstream's tools as it defines them now.
func (g *Gateway) ListUpstream(ctx context.Context, name string) ([]*mcp.Tool, error) {
	u, ok := g.ups[name]
	if !ok {
		return nil, fmt.Errorf("no upstream %q in the config", name)
	}
	return u.List(ctx)
}

// Warm connects every upstream in the background, so that tools/list hides
// a tool whose definition changed from the first listing on, and the first
// call does not wait for its upstream to start. An upstream that fails is
// tried again at its next use, after its backoff.
func (g *Gateway) Warm(ctx context.Context) {
	for _, u := range g.ups {
		go func() { _, _ = u.connect(context.WithoutCancel(ctx)) }()
	}
}

// Close ends the upstreams' sessions (and their commands).
func (g *Gateway) Close() error {
	var errs []error
	for _, u := range g.ups {
		errs = append(errs, u.Close())
	}
	return errors.Join(errs...)
}

// identify says who makes a request; false if nobody the gateway knows.
type identify func(*mcp.RequestExtra) (Identity, bool)

// server is the MCP server clients reach: every confirmed tool, listed to
// a caller whose tenant may use the gateway while its upstream definition
// is the confirmed one. recordDelivery says the handler records a
// delivery itself (over HTTP); over stdio the transport does, once the
// answer is written (deliveryTransport).
//
// settle, if set, waits until the deliveries of answers already written
// are recorded: a call that follows its answer at once must not find the
// action it repeats still undelivered and join it.
func (g *Gateway) server(who identify, recordDelivery bool, settle func()) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "ledger", Title: "ledger MCP gateway", Version: g.opts.Version},
		&mcp.ServerOptions{Instructions: "Every tool call here is recorded in the ledger before it runs; a write may wait for a person to approve its exact arguments."})
	for _, name := range g.lock.Names() {
		t, ok := g.tools[name]
		if !ok {
			continue
		}
		s.AddTool(t.def, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if settle != nil {
				settle()
			}
			return g.call(ctx, req, t, who, recordDelivery)
		})
	}
	s.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListToolsResult); ok && err == nil {
				id, known := who(req.GetExtra())
				lr.Tools = slices.DeleteFunc(lr.Tools, func(def *mcp.Tool) bool {
					t := g.tools[def.Name]
					return !known || !g.tenantAllowed(id.Tenant) || t == nil || t.changed() != ""
				})
			}
			return res, err
		}
	})
	return s
}

// tenantAllowed reports whether tenant may use the gateway.
func (g *Gateway) tenantAllowed(tenant string) bool {
	return len(g.cfg.Tenants) == 0 || slices.Contains(g.cfg.Tenants, tenant)
}

// call is one tools/call: the action it is (a new one, or the one it
// joins), the wait for a person, the call through the engine, the answer.
func (g *Gateway) call(ctx context.Context, req *mcp.CallToolRequest, t *tool, who identify, recordDelivery bool) (*mcp.CallToolResult, error) {
	id, known := who(req.Extra)
	if !known {
		return nil, errors.New("unauthenticated: the gateway does not know who calls")
	}
	if !g.tenantAllowed(id.Tenant) {
		return toolError("tenant %s may not use this gateway", id.Tenant), nil
	}
	if why := t.changed(); why != "" {
		return toolError("%s is hidden: %s", t.client, why), nil
	}
	caller := engine.Caller{Tenant: id.Tenant, Principal: id.Principal}
	args := req.Params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	a, joined, err := g.action(ctx, req, t, caller, id, args)
	if err != nil {
		return g.refusal(err), nil
	}
	// An answer recorded before this call: the action it joined had its
	// outcome already.
	replayed := joined && a.State.Terminal()
	g.selfConfirm(ctx, req, id, t, a)
	if a, err = g.await(ctx, req, caller, a); err != nil {
		return nil, err // the client went away: the action stays as it is
	}
	switch a.State {
	case ledger.ActionApproved, ledger.ActionRunning, ledger.ActionUncertain:
		if a, err = g.runCall(ctx, t, caller, a); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err() // the client went away: no answer
			}
			return g.refusal(err), nil
		}
	}
	return g.answer(ctx, req, caller, id, a, replayed, recordDelivery)
}

// runCall makes the call through the engine. It is made, and its outcome
// recorded, even if the client goes away meanwhile: a client's cancel
// reaches the upstream only for a tool whose profile can cancel (its
// cancel tool, with the action's dedup key), and the in-flight call then
// ends with the upstream's own answer, recorded as any other. The
// client that cancelled gets no answer (its request is gone); a refusal
// is a tool error.
func (g *Gateway) runCall(ctx context.Context, t *tool, caller engine.Caller, a *ledger.Action) (*ledger.Action, error) {
	type result struct {
		a   *ledger.Action
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := g.engine.RunCall(context.WithoutCancel(ctx), caller, a.ID, runWait)
		done <- result{got, err}
	}()
	select {
	case r := <-done:
		return r.a, r.err
	case <-ctx.Done():
		if t.desc.Guarantees.Cancel && t.profile.Cancel != nil {
			go func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				res, err := t.Cancel(cctx, a.DedupKey)
				g.log.Info("client cancelled a call: cancel sent upstream", "action", a.ID, "confirmed", res.Confirmed, "err", err)
			}()
		} else {
			g.log.Info("client cancelled a call: the tool cannot cancel, the call goes on and its outcome is recorded", "action", a.ID)
		}
		return nil, ctx.Err()
	}
}

// runWait is how long a call waits for its run's lease while another call
// of the run is being made (calls of one run are made one at a time).
const runWait = 2 * time.Minute

// action is the action a call is: the one its request state names, or the
// one ProposeCall records or joins in the caller's run.
func (g *Gateway) action(ctx context.Context, req *mcp.CallToolRequest, t *tool, caller engine.Caller, id Identity, args json.RawMessage) (*ledger.Action, bool, error) {
	if sealed := req.Params.RequestState; sealed != "" {
		st, err := openState(g.stateKey, sealed, id.Tenant, id.Principal, g.now())
		if err != nil {
			return nil, false, err
		}
		a, err := g.engine.GatewayAction(ctx, caller, st.Action)
		if err != nil {
			return nil, false, errBadState
		}
		canon, cerr := ledger.Canonicalize(args)
		if a.ActionDigest != st.Digest || a.Tool != t.desc.Name || cerr != nil || string(canon) != string(a.Arguments) {
			return nil, false, errors.New("the request state names another call: call again without it")
		}
		return a, true, nil
	}
	run, err := g.run(ctx, req, caller, id)
	if err != nil {
		return nil, false, err
	}
	key, _ := req.Params.Meta[MetaIdempotencyKey].(string)
	res, err := g.engine.ProposeCall(ctx, engine.CallProposal{Caller: caller, Run: run.ID, StepKey: key, Tool: t.desc.Name,
		Arguments: args, MaxPendingApprovals: g.opts.MaxPendingApprovals})
	if err != nil {
		return nil, false, err
	}
	return res.Action, res.Duplicate, nil
}

// run is the run a call belongs to: the one whose handle it carries in
// _meta, else its session's, else its principal's and client's.
func (g *Gateway) run(ctx context.Context, req *mcp.CallToolRequest, caller engine.Caller, id Identity) (*ledger.Run, error) {
	if handle, ok := req.Params.Meta[MetaRun].(string); ok && handle != "" {
		return g.engine.GatewayRun(ctx, caller, ledger.RunID(handle))
	}
	client := "unknown"
	if ip := req.Session.InitializeParams(); ip != nil && ip.ClientInfo != nil {
		client = ip.ClientInfo.Name
	}
	by, scope := "client", client
	if sid := req.Session.ID(); sid != "" {
		by, scope = "session", sid
	}
	h := sha256.Sum256([]byte(id.Tenant + "\x00" + id.Principal + "\x00" + by + "\x00" + scope))
	input, _ := json.Marshal(map[string]any{"mcp": map[string]string{"client": clip(client, 200), "by": by}})
	return g.engine.OpenRun(ctx, engine.OpenRunParams{Agent: g.cfg.AgentName(), Tenant: id.Tenant, Principal: id.Principal,
		Key: "mcp:" + by + ":" + hex.EncodeToString(h[:16]), Input: input})
}

// selfConfirm asks the client to confirm an action that waits for approval,
// by a form elicitation, where a rule lets its answer grant it
// (allow_self_confirmation) and the client takes form elicitations within
// its session (2025-11-25 and older). An answer that accepts and confirms
// grants the approval as self_confirmation; any other leaves the action to
// a person. Nothing else asks a client: its code is not a person.
func (g *Gateway) selfConfirm(ctx context.Context, req *mcp.CallToolRequest, id Identity, t *tool, a *ledger.Action) {
	if g.opts.Approvals == nil || a.State != ledger.ActionAwaitingApproval || !formElicitation(req) || !g.opts.Approvals.AllowsSelfConfirmation(a) {
		return
	}
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "form",
		Message: fmt.Sprintf("Run %s with these exact arguments (action %s, digest %s)?\n%s", t.client, a.ID, a.ActionDigest, clip(string(a.Arguments), 2000)),
		RequestedSchema: map[string]any{"type": "object", "required": []string{"confirm"},
			"properties": map[string]any{"confirm": map[string]any{"type": "boolean", "title": "Run it", "description": "true runs the call once; it is recorded as your client's own confirmation"}}}})
	if err != nil {
		g.log.Info("form elicitation for a self-confirmation failed: the action waits for a person", "action", a.ID, "err", err)
		return
	}
	if confirm, _ := res.Content["confirm"].(bool); res.Action != "accept" || !confirm {
		return
	}
	if _, err := g.opts.Approvals.SelfConfirm(ctx, id.Tenant, id.Principal, a.ID, a.ActionDigest); err != nil {
		g.log.Warn("self-confirmation refused", "action", a.ID, "err", err)
	}
}

// formElicitation reports whether the client takes form elicitations in
// its session: a 2025-11-25 (or older) client that declared elicitation,
// form mode or, as older revisions did, no mode at all.
func formElicitation(req *mcp.CallToolRequest) bool {
	ip := req.Session.InitializeParams()
	if ip == nil || ip.ProtocolVersion >= statelessRevision || ip.Capabilities == nil || ip.Capabilities.Elicitation == nil {
		return false
	}
	el := ip.Capabilities.Elicitation
	return el.Form != nil || el.URL == nil
}

// await waits, at most approval_wait, while the action waits for a
// person, telling a client that asked for progress every few seconds. A
// client that goes away ends the wait, never the action.
func (g *Gateway) await(ctx context.Context, req *mcp.CallToolRequest, caller engine.Caller, a *ledger.Action) (*ledger.Action, error) {
	wait := g.cfg.ApprovalWaitDuration()
	deadline := g.now().Add(wait)
	nextProgress := g.now()
	token := req.Params.GetProgressToken()
	for n := 0; a.State == ledger.ActionProposed || a.State == ledger.ActionAwaitingApproval; n++ {
		now := g.now()
		if !now.Before(deadline) {
			return a, nil
		}
		if token != nil && !now.Before(nextProgress) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
				Progress: now.Sub(deadline.Add(-wait)).Seconds(), Total: wait.Seconds(),
				Message: fmt.Sprintf("action %s waits for a person to approve digest %s", a.ID, a.ActionDigest)})
			nextProgress = now.Add(5 * time.Second)
		}
		t := time.NewTimer(min(100*time.Millisecond+time.Duration(n)*10*time.Millisecond, 500*time.Millisecond, deadline.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		next, err := g.engine.GatewayAction(ctx, caller, a.ID)
		if err != nil {
			return nil, err
		}
		a = next
	}
	return a, nil
}

// answer is the MCP result of an action as it stands: the recorded outcome
// of its last attempt for a settled call, an input-required result or a
// tool error naming the approval for one that waits for a person, and a
// tool error saying why for every other state.
func (g *Gateway) answer(ctx context.Context, req *mcp.CallToolRequest, caller engine.Caller, id Identity, a *ledger.Action, replayed, recordDelivery bool) (*mcp.CallToolResult, error) {
	meta := mcp.Meta{MetaRun: string(a.RunID), MetaAction: string(a.ID), MetaState: string(a.State), MetaDigest: string(a.ActionDigest)}
	if replayed {
		meta[MetaReplayed] = true
	}
	var res *mcp.CallToolResult
	switch a.State {
	case ledger.ActionSucceeded, ledger.ActionFailed:
		att, err := g.engine.LastAttempt(ctx, a.ID)
		if err != nil {
			return nil, err
		}
		if att == nil {
			res = toolError("action %s is %s without an attempt", a.ID, a.State)
			break
		}
		res = resultOf(a, att)
		meta[MetaAttemptID] = string(att.ID)
		// A write's delivery is recorded: a repeated call joins a write
		// whose outcome never reached the client. A read is read again.
		if a.Effect == ledger.EffectWrite {
			if recordDelivery {
				g.delivered(ctx, att.ID, req)
			} else {
				g.toDeliver.Store(att.ID, true)
			}
		}
	case ledger.ActionProposed, ledger.ActionAwaitingApproval:
		res = g.needsApproval(req, id, a)
	case ledger.ActionDenied:
		res = toolError("action %s was denied: the call was not made", a.ID)
	case ledger.ActionExpired:
		res = toolError("action %s was not approved in time (its approval expired): the call was not made; call again to ask again", a.ID)
	case ledger.ActionCancelled, ledger.ActionAbandoned, ledger.ActionSuperseded:
		res = toolError("action %s is %s: the call was not made, or its effect was settled by a person", a.ID, a.State)
	case ledger.ActionNeedsReview, ledger.ActionUncertain, ledger.ActionRunning:
		res = toolError("action %s is %s: whether the call took effect is not known yet, and a person or recovery settles it; call again later with the same arguments to get its outcome", a.ID, a.State)
	default:
		res = g.stateError(ctx, caller, a)
	}
	for k, v := range res.Meta {
		meta[k] = v
	}
	res.Meta = meta
	return res, nil
}

// stateError says why an approved action was not called: its run ended,
// is stopping, or waits for a person.
func (g *Gateway) stateError(ctx context.Context, caller engine.Caller, a *ledger.Action) *mcp.CallToolResult {
	run, err := g.engine.GatewayRun(ctx, caller, a.RunID)
	if err != nil {
		return toolError("action %s is %s", a.ID, a.State)
	}
	if run.State.Terminal() {
		return toolError("run %s has ended (%s): action %s was not called; a new call starts a new run", run.ID, run.StopReason, a.ID)
	}
	return toolError("run %s is %s: action %s waits until it goes on", run.ID, run.State, a.ID)
}

// resultOf is the MCP result of a settled attempt: its recorded output
// (content and structured content), or its error as a tool error.
func resultOf(a *ledger.Action, att *ledger.Attempt) *mcp.CallToolResult {
	if a.State == ledger.ActionSucceeded && len(att.Result) == 0 {
		// Recovery established the effect (the upstream's query found it)
		// after the call's own answer was lost with a crashed process.
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
			"the call took effect: action %s's effect was established after a crash lost the upstream's own answer, which was not recorded; do not repeat the call", a.ID)}},
			Meta: mcp.Meta{MetaAnswerLost: true}}
	}
	if a.State == ledger.ActionSucceeded {
		var res mcp.CallToolResult
		if err := json.Unmarshal(att.Result, &res); err == nil {
			return &res
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(att.Result)}}}
	}
	msg := "the call failed"
	if att.Error != nil {
		msg = att.Error.Code + ": " + att.Error.Message
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// needsApproval is the answer of a call still waiting for a person after
// approval_wait: for a client of the 2026-07-28 revision, an input-required
// result with a URL elicitation to the approval and the request state that
// joins the action; for any other, a tool error naming the action, its
// digest and how to approve it.
func (g *Gateway) needsApproval(req *mcp.CallToolRequest, id Identity, a *ledger.Action) *mcp.CallToolResult {
	how := fmt.Sprintf("`ledger approve %s --digest %s`", a.ID, a.ActionDigest)
	url := ""
	if g.opts.ApprovalURL != nil {
		url = g.opts.ApprovalURL(a.ID)
		how += " or POST " + url + "/approve"
	}
	msg := fmt.Sprintf("action %s waits for a person to approve its exact arguments (digest %s): %s. Call again with the same arguments to join it; it runs once approved, at most once.",
		a.ID, a.ActionDigest, how)
	if url != "" && inputRequired(req) {
		st := requestState{Action: a.ID, Digest: a.ActionDigest, Tenant: id.Tenant, Principal: id.Principal,
			Expires: g.now().Add(24 * time.Hour).Unix()}
		return &mcp.CallToolResult{
			InputRequests: mcp.InputRequestMap{"approval": &mcp.ElicitParams{Mode: "url", URL: url, Message: msg}},
			RequestState:  st.seal(g.stateKey),
		}
	}
	return toolError("%s", msg)
}

// inputRequired reports whether the client speaks the 2026-07-28
// revision, whose input-required results carry a request state, and takes
// URL elicitations.
func inputRequired(req *mcp.CallToolRequest) bool {
	ip := req.Session.InitializeParams()
	if ip == nil || ip.ProtocolVersion < statelessRevision || ip.Capabilities == nil {
		return false
	}
	el := ip.Capabilities.Elicitation
	return el != nil && el.URL != nil
}

// refusal is the tool error of a call the ledger refused: the protocol's
// code and message, the schema's issues.
func (g *Gateway) refusal(err error) *mcp.CallToolResult {
	var pe *engine.ProtocolError
	if errors.As(err, &pe) {
		msg := pe.Code + ": " + pe.Message
		for _, is := range pe.Issues {
			msg += "; " + is.Message
			if is.Location != "" {
				msg += " at " + is.Location
			}
		}
		return toolError("%s", msg)
	}
	if c := ledger.Code(err); c != "" {
		return toolError("%s: %s", c, err.Error())
	}
	g.log.Error("mcp call", "err", err)
	return toolError("the ledger could not record the call: %s", err.Error())
}

// delivered records that the outcome of att reached the caller.
func (g *Gateway) delivered(ctx context.Context, att ledger.AttemptID, req *mcp.CallToolRequest) {
	client := ""
	if req != nil && req.Session != nil {
		if ip := req.Session.InitializeParams(); ip != nil && ip.ClientInfo != nil {
			client = ip.ClientInfo.Name
		}
	}
	detail, _ := json.Marshal(map[string]string{"to": "mcp", "client": clip(client, 200)})
	if err := g.engine.Delivered(context.WithoutCancel(ctx), att, detail); err != nil {
		g.log.Warn("record a delivery", "attempt", att, "err", err)
	}
}

func toolError(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}
