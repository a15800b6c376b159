package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/httptool"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// payDescriptor is a client tool of the test agents.
func payDescriptor(name string) contracts.ToolDescriptor {
	return contracts.ToolDescriptor{SchemaVersion: "1.0", Name: name, Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"type":"object"}`), Guarantees: contracts.Guarantees{Query: true},
		TimeoutMS: 20000, SecretPaths: []string{"/to"}}
}

// clientAgents are practice-cards' neighbours: payer, a client agent of
// tenant acme with its own thresholds, and biller, one of tenant globex.
func clientAgents() options {
	lease := engine.Lease{HeartbeatTimeout: 10 * time.Second, MaxDuration: time.Minute}
	send, bill := payDescriptor("payments.send"), payDescriptor("invoices.send")
	return options{
		agents: []engine.Agent{
			{Name: "payer", Driver: engine.DriverClient, Tools: []engine.Tool{engine.ClientTool(send, lease)},
				Tenants: []string{"acme"}, Policy: budget.Policy{ConsecutiveErrors: 5}},
			{Name: "biller", Driver: engine.DriverClient, Tools: []engine.Tool{engine.ClientTool(bill, lease)},
				Tenants: []string{"globex"}},
		},
		config: func(c *server.Config) {
			c.ClientTools = map[string]engine.Lease{send.Name: lease, bill.Name: lease}
		},
	}
}

// submitAgent submits a run of agent as principal.
func (e *env) submitAgent(t testing.TB, principal, key, agent string) response {
	t.Helper()
	return e.submitRaw(t, principal, key, `{"agent":"`+agent+`","input":{}}`)
}

func TestCatalog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, clientAgents())

	t.Run("Tools", func(t *testing.T) {
		res := e.get(t, "alice", "/v1/tools")
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var list server.ToolList
		decode(t, res, &list)
		var names []string
		for _, tool := range list.Tools {
			names = append(names, tool.Name)
		}
		require.Equal(t, []string{"cards.count", "cards.write", "payments.send"}, names, "acme's, in name order; not globex's invoices.send")
		send := list.Tools[2]
		require.Equal(t, server.Tool{Name: "payments.send", Version: "1", Effect: contracts.EffectWrite, ArgumentsSchema: json.RawMessage(`{"type":"object"}`),
			Guarantees: contracts.Guarantees{Query: true}, TimeoutMS: 20000, SecretPaths: []string{"/to"},
			Executor: contracts.ExecutorClient, HeartbeatTimeoutMS: 10000, MaxDurationMS: 60000}, send)
		write := list.Tools[1]
		require.Equal(t, contracts.ExecutorBuiltin, write.Executor)
		require.Zero(t, write.HeartbeatTimeoutMS)
		require.True(t, write.Guarantees.Query)

		res = e.get(t, "eve", "/v1/tools")
		decode(t, res, &list)
		names = nil
		for _, tool := range list.Tools {
			names = append(names, tool.Name)
		}
		require.Equal(t, []string{"cards.count", "cards.write", "invoices.send"}, names, "globex sees its own")
	})

	t.Run("Agents", func(t *testing.T) {
		for _, who := range []string{"alice", "bob", "carol", "andy", "root"} {
			res := e.get(t, who, "/v1/agents")
			require.Equal(t, http.StatusOK, res.Status, who)
			var list server.AgentList
			decode(t, res, &list)
			require.Equal(t, []server.Agent{
				{Name: "payer", Driver: engine.DriverClient, Tools: []string{"payments.send"},
					Policies: server.AgentPolicies{RepeatLimit: 2, NoProgressWindow: 10, ConsecutiveErrors: 5}},
				{Name: "practice-cards", Driver: engine.DriverBuiltin, Tools: []string{"cards.write", "cards.count"},
					Policies: server.AgentPolicies{RepeatLimit: 2, NoProgressWindow: 10, ConsecutiveErrors: 3}},
			}, list.Agents, who)
		}
		res := e.get(t, "gina", "/v1/agents")
		var list server.AgentList
		decode(t, res, &list)
		require.Len(t, list.Agents, 2)
		require.Equal(t, "biller", list.Agents[0].Name, "another tenant does not see payer")
		require.Equal(t, "practice-cards", list.Agents[1].Name)
	})

	t.Run("ErrNoToken", func(t *testing.T) {
		requireProblem(t, e.get(t, "", "/v1/tools"), http.StatusUnauthorized, "unauthorized")
		requireProblem(t, e.get(t, "", "/v1/agents"), http.StatusUnauthorized, "unauthorized")
	})
}

// TestCatalogHTTPTools: the engine's http tools are listed to every
// tenant, with executor http, whether or not an agent lists them.
func TestCatalogHTTPTools(t *testing.T) {
	t.Parallel()
	d := payDescriptor("tickets.open")
	d.Guarantees = contracts.Guarantees{Dedup: true}
	tickets, err := httptool.New(d, contracts.HTTPEndpoints{URL: "http://127.0.0.1:9/open"}, httptool.Options{})
	require.NoError(t, err)
	o := clientAgents()
	o.tools = []engine.Tool{tickets}
	clients := o.config
	o.config = func(c *server.Config) {
		clients(c)
		c.HTTPTools = []string{"tickets.open"}
	}
	e := newEnv(t, o)
	for who, want := range map[string][]string{
		"alice": {"cards.count", "cards.write", "payments.send", "tickets.open"},
		"eve":   {"cards.count", "cards.write", "invoices.send", "tickets.open"},
	} {
		res := e.get(t, who, "/v1/tools")
		require.Equal(t, http.StatusOK, res.Status, string(res.Body))
		var list server.ToolList
		decode(t, res, &list)
		var names []string
		for _, tool := range list.Tools {
			names = append(names, tool.Name)
		}
		require.Equal(t, want, names, who)
		require.Equal(t, server.Tool{Name: "tickets.open", Version: "1", Effect: contracts.EffectWrite, ArgumentsSchema: json.RawMessage(`{"type":"object"}`),
			Guarantees: contracts.Guarantees{Dedup: true}, TimeoutMS: 20000, SecretPaths: []string{"/to"}, Executor: contracts.ExecutorHTTP},
			list.Tools[3])
	}
}

// TestAgentRole: a token with the role agent drives the runs of the agents
// it is bound to, in its tenant, and nothing else; it never decides.
func TestAgentRole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, clientAgents())
	cardsRun, pending := e.awaiting(t, "alice", "cards")

	res := e.submitAgent(t, "andy", "p1", "payer")
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var own server.SubmitResponse
	decode(t, res, &own)
	res = e.submitAgent(t, "alice", "p2", "payer")
	require.Equal(t, http.StatusCreated, res.Status, "a submitter may submit any of its tenant's agents")
	var alices server.SubmitResponse
	decode(t, res, &alices)

	t.Run("ErrAgentNotBound", func(t *testing.T) {
		p := requireProblem(t, e.submitRaw(t, "andy", "c1", submitBody(t)), http.StatusForbidden, server.CodeAgentNotBound)
		require.Contains(t, p.Detail, "payer")
		require.Equal(t, 3, e.runCount(t), "nothing stored")
	})

	t.Run("ErrOtherTenantsAgent", func(t *testing.T) {
		// Another tenant's agent is answered as one that does not exist.
		for _, who := range []string{"andy", "alice"} {
			p := requireProblem(t, e.submitAgent(t, who, "b1", "biller"), http.StatusBadRequest, "invalid")
			requireLocation(t, p, "/agent", `no agent "biller" is registered`)
			unknown := requireProblem(t, e.submitAgent(t, who, "b2", "nobody"), http.StatusBadRequest, "invalid")
			require.Equal(t, p.Detail, unknown.Detail)
		}
		requireProblem(t, e.submitAgent(t, "eve", "b3", "payer"), http.StatusBadRequest, "invalid")
		require.Equal(t, http.StatusCreated, e.submitAgent(t, "eve", "b4", "biller").Status)
	})

	t.Run("Reads", func(t *testing.T) {
		for _, id := range []ledger.RunID{own.ID, alices.ID} {
			res := e.get(t, "andy", "/v1/runs/"+string(id))
			require.Equal(t, http.StatusOK, res.Status, "a run of its agent, whoever submitted it")
		}
		requireProblem(t, e.get(t, "andy", "/v1/runs/"+string(cardsRun)), http.StatusNotFound, "not_found")
		requireProblem(t, e.get(t, "andy", "/v1/actions/"+string(pending.ID)), http.StatusNotFound, "not_found")

		var list server.RunList
		decode(t, e.get(t, "andy", "/v1/runs"), &list)
		var ids []ledger.RunID
		for _, r := range list.Runs {
			ids = append(ids, r.ID)
		}
		require.Equal(t, []ledger.RunID{own.ID, alices.ID}, ids, "the runs of its agent, not practice-cards'")

		// An agent token that also audits reads the whole tenant.
		decode(t, e.get(t, "alf", "/v1/runs"), &list)
		require.Len(t, list.Runs, 3)
		require.Equal(t, http.StatusOK, e.get(t, "alf", "/v1/runs/"+string(cardsRun)).Status)
	})

	t.Run("ErrNeverDecides", func(t *testing.T) {
		for _, path := range []string{"/approve", "/deny"} {
			p := requireProblem(t, e.post(t, "andy", "/v1/actions/"+string(pending.ID)+path, digestBody(pending.ActionDigest)),
				http.StatusForbidden, "forbidden")
			require.Contains(t, p.Detail, "approver")
		}
		requireProblem(t, e.post(t, "andy", "/v1/actions/"+string(pending.ID)+"/resolve", `{"outcome":"abandon"}`),
			http.StatusForbidden, "forbidden")
		requireProblem(t, e.get(t, "andy", "/v1/approvals"), http.StatusForbidden, "forbidden")
		require.Equal(t, ledger.ActionAwaitingApproval, e.pendingAction(t, cardsRun).State)
	})

	t.Run("Cancel", func(t *testing.T) {
		requireProblem(t, e.post(t, "andy", "/v1/runs/"+string(cardsRun)+"/cancel", `{}`), http.StatusNotFound, "not_found")
		res := e.post(t, "andy", "/v1/runs/"+string(alices.ID)+"/cancel", `{"reason":"the agent gave up"}`)
		require.Equal(t, http.StatusAccepted, res.Status, string(res.Body))
		c, err := e.Store.FindCancellation(context.Background(), alices.ID)
		require.NoError(t, err)
		require.Equal(t, "andy", c.RequestedBy)
	})
}

// TestAgentRolePages: the runs of an agent token's agents are found
// however many runs of other agents the tenant has around them.
func TestAgentRolePages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, clientAgents())
	ctx := context.Background()
	submit := func(agent string, i int) ledger.RunID {
		res, err := e.Store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: fmt.Sprintf("%s-%d", agent, i),
			Principal: "alice", Agent: agent, Input: json.RawMessage(`{}`)})
		require.NoError(t, err)
		return res.Run.ID
	}
	var want []ledger.RunID
	want = append(want, submit("payer", 0))
	for i := range server.MaxPageSize + 10 {
		submit("practice-cards", i)
	}
	want = append(want, submit("payer", 1), submit("payer", 2))

	var got []ledger.RunID
	cursor := ""
	for range 4 {
		path := "/v1/runs?limit=2"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var page server.RunList
		decode(t, e.get(t, "andy", path), &page)
		for _, r := range page.Runs {
			got = append(got, r.ID)
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	require.Equal(t, want, got)
}

func TestDevModeDrivesEveryAgent(t *testing.T) {
	t.Parallel()
	lease := engine.Lease{HeartbeatTimeout: 10 * time.Second, MaxDuration: time.Minute}
	e := newEnv(t, options{dev: true, agents: []engine.Agent{{Name: "anyone", Driver: engine.DriverClient,
		Tools: []engine.Tool{engine.ClientTool(payDescriptor("payments.send"), lease)}}}})
	res := e.submitAgent(t, "", "k", "anyone")
	require.Equal(t, http.StatusCreated, res.Status, string(res.Body))
	var sr server.SubmitResponse
	decode(t, res, &sr)
	require.Equal(t, http.StatusOK, e.get(t, "", "/v1/runs/"+string(sr.ID)).Status)
	id := server.DevIdentity()
	require.Contains(t, id.Roles, server.RoleAgent)
	require.Contains(t, id.Roles, server.RoleAdmin, "an admin drives every agent")
}
