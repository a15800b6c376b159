package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// mcpCrashCell is one cell's directory: the gateway's config (its one
// upstream, the simulator's MCP server, with the guarantees under test in
// both the tool's profile and the simulator's own config), the ledger
// database, and the upstream's effect store.
type mcpCrashCell struct {
	bin, dir, config, db, effects string
}

// newMCPCrashCell writes the cell's configs and confirms the write tool.
func newMCPCrashCell(t *testing.T, g contracts.Guarantees) *mcpCrashCell {
	t.Helper()
	bin := ledgerBinary(t)
	dir := t.TempDir()
	c := &mcpCrashCell{bin: bin, dir: dir, config: filepath.Join(dir, "ledger.yaml"), db: filepath.Join(dir, "ledger.db"),
		effects: filepath.Join(dir, "upstream.effects.db")}
	sim, err := json.Marshal(map[string]any{"tools": map[string]any{"cards.write": map[string]any{
		"guarantees": map[string]bool{"query": g.Query, "dedup": g.Dedup, "cancel": g.Cancel}}}})
	require.NoError(t, err)
	simPath := filepath.Join(dir, "simulator.json")
	require.NoError(t, os.WriteFile(simPath, sim, 0o644))
	probes := ""
	if g.Query {
		probes += "\n          query: {tool: cards_status}"
	}
	if g.Cancel {
		probes += "\n          cancel: {tool: cards_cancel}"
	}
	cfg := fmt.Sprintf(`schema_version: "1.0"
mcp:
  approval_wait: 500ms
  upstreams:
    - name: cards
      command: [%q, simulator, mcp-upstream, --store, %q, --config, %q]
      tools:
        cards_write:
          effect: write
          guarantees: {query: %t, dedup: %t, cancel: %t}%s
`, bin, c.effects, simPath, g.Query, g.Dedup, g.Cancel, probes)
	require.NoError(t, os.WriteFile(c.config, []byte(cfg), 0o644))
	out, errOut, err := runCLI(t, nil, "mcp", "tools", "confirm", "--config", c.config, "cards__cards_write")
	require.NoError(t, err, errOut)
	require.Contains(t, out, "1 tools confirmed")
	return c
}

// mcpGatewayProcess is a `ledger mcp` process and the SDK client's session
// with it over stdio.
type mcpGatewayProcess struct {
	cmd  *exec.Cmd
	cs   *mcp.ClientSession
	logs *syncBuffer
}

// gateway starts `ledger mcp` (with env added to its environment) as the
// stdio server of a client named crash-client: every session of that name
// and principal is in the same run.
func (c *mcpCrashCell) gateway(t *testing.T, ctx context.Context, apiURL string, env ...string) *mcpGatewayProcess {
	t.Helper()
	p := &mcpGatewayProcess{logs: &syncBuffer{}}
	p.cmd = exec.Command(c.bin, "mcp", "--config", c.config, "--db", c.db, "--api-url", apiURL, "--principal", "agent-1")
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stderr = p.logs
	var err error
	p.cs, err = mcp.NewClient(&mcp.Implementation{Name: "crash-client", Version: "1"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: p.cmd, TerminateDuration: 2 * time.Second}, nil)
	require.NoError(t, err, "ledger mcp: %s", p.logs.String())
	t.Cleanup(func() { _ = p.cs.Close() })
	return p
}

// killedBySIGKILL closes the session (which waits for the process) and
// reports whether the process had died of SIGKILL.
func (p *mcpGatewayProcess) killedBySIGKILL() bool {
	_ = p.cs.Close()
	if p.cmd.ProcessState == nil {
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// getServeJSON reads url into v, requiring 200.
func getServeJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, url)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// mcpCrashExpectation is what a cell ends in once the client called again
// through the restarted gateway.
type mcpCrashExpectation struct {
	state    ledger.ActionState // the action's, and the answer's _meta state
	effects  int                // in the upstream's effect store
	attempts int
}

// expectedMCPCrashOutcome is the recovery table read for a gateway killed
// at point with the write tool's guarantees g; the doc comment of
// TestMCPGatewayCrashPoints spells it out.
func expectedMCPCrashOutcome(p engine.FaultPoint, g contracts.Guarantees) mcpCrashExpectation {
	done := func(attempts int) mcpCrashExpectation {
		return mcpCrashExpectation{ledger.ActionSucceeded, 1, attempts}
	}
	switch p {
	case engine.FaultAfterAttemptRecorded, engine.FaultBeforeToolCall: // recorded, never called
		if !g.Query && !g.Dedup && !g.Cancel {
			return mcpCrashExpectation{ledger.ActionNeedsReview, 0, 1}
		}
		return done(2) // not_happened established (query, cancel) or a resend is safe (dedup): a second attempt
	case engine.FaultAfterToolCall: // the upstream acted; nothing recorded it
		switch {
		case g.Query:
			return done(1) // reconciled from cards_status
		case g.Dedup:
			return done(2) // resent; the upstream deduplicated
		default:
			return mcpCrashExpectation{ledger.ActionNeedsReview, 1, 1}
		}
	default: // before the attempt was recorded (nothing happened), or after its result was (undelivered: replayed)
		return done(1)
	}
}

// mcpCrashPoints are the fault points between an approval and a recorded
// outcome: the engine's four crash points of an attempt, and
// before_tool_call, which the engine says leaves what after_attempt_recorded
// leaves; on the gateway's path (RunCall) that is checked, not assumed.
func mcpCrashPoints() []engine.FaultPoint {
	return append(engine.FaultPoints(), engine.FaultBeforeToolCall)
}

// TestMCPGatewayCrashPoints kills `ledger mcp` with SIGKILL (its fault
// plan, LEDGER_FAULT_PLAN) at each of the engine's four crash points of an
// approved write's attempt and at before_tool_call (mcpCrashPoints), for
// each of the eight guarantee combinations of the upstream's write tool
// (the gateway's profile and the simulator's config agree), then restarts the gateway without the plan; the client,
// in a new stdio session under the same name, makes the same call again.
// Each cell: the client's first call gets the waiting error; a person
// approves its digest through `ledger serve` on the same database; the
// client's second call kills the gateway at the point, which ends the
// client's session with an error; the call through the restarted gateway
// joins the original action and answers as below. The upstream's own
// effect store never holds more than one effect, and none but for the
// action's dedup key.
//
//	point                    guarantees                  answer / action   effects  attempts
//	before_attempt_recorded  any                         succeeded         1        1  (nothing was recorded: the call is made)
//	after_attempt_recorded   none                        needs_review      0        1  (whether the call was sent is unknown)
//	after_attempt_recorded   query, dedup or cancel      succeeded         1        2  (not_happened by query/cancel, or a safe resend)
//	before_tool_call         as after_attempt_recorded
//	after_tool_call          query                       succeeded         1        1  (reconciled from cards_status; answer_lost)
//	after_tool_call          dedup, no query             succeeded         1        2  (resent; the upstream deduplicated)
//	after_tool_call          neither query nor dedup     needs_review      1        1  (effect unknown; a cancel cannot confirm)
//	after_result_recorded    any                         succeeded         1        1  (the recorded outcome, never delivered, is replayed)
//
// A succeeded answer is the upstream's result and names the action and
// the succeeded state in _meta; a needs_review answer is a tool error
// saying so, and the action (GET /v1/actions/{id} of serve) and its run
// are in needs_review, the last attempt's effect unknown. A cell that meets
// where recovery established the effect by a query (after_tool_call with
// query) the upstream's own answer is lost with the gateway: the answer is
// a success marked answer_lost, which says not to repeat the call.
func TestMCPGatewayCrashPoints(t *testing.T) {
	ledgerBinary(t)
	points := mcpCrashPoints()
	began := time.Now()
	t.Cleanup(func() {
		t.Logf("%d cells in %s", len(points)*len(allGuarantees()), time.Since(began).Round(time.Millisecond))
	})
	for _, point := range points {
		for _, g := range allGuarantees() {
			t.Run(fmt.Sprintf("%s/query=%t,dedup=%t,cancel=%t", point, g.Query, g.Dedup, g.Cancel), func(t *testing.T) {
				t.Parallel()
				mcpCrashCellRun(t, point, g)
			})
		}
	}
}

func mcpCrashCellRun(t *testing.T, point engine.FaultPoint, g contracts.Guarantees) {
	c := newMCPCrashCell(t, g)
	api := startServeProcess(t, c.bin, "--db", c.db, "--config", c.config, "--effects", filepath.Join(c.dir, "serve.effects.db"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := map[string]any{"title": "Go", "cards": []map[string]string{{"front": "chan", "back": "a pipe"}}}
	call := &mcp.CallToolParams{Name: "cards__cards_write", Arguments: args}

	doomed := c.gateway(t, ctx, api.url, envFaultPlan+`={"point":"`+string(point)+`"}`)
	waiting, err := doomed.cs.CallTool(ctx, call)
	require.NoError(t, err, doomed.logs.String())
	require.True(t, waiting.IsError, resultText(waiting))
	action, digest := waiting.Meta[mcpgw.MetaAction].(string), waiting.Meta[mcpgw.MetaDigest].(string)
	require.NotEmpty(t, action)
	require.Equal(t, string(ledger.ActionAwaitingApproval), waiting.Meta[mcpgw.MetaState])
	require.Empty(t, effectsIn(t, c.effects), "nothing reaches the upstream before a person approves")

	body, err := json.Marshal(map[string]string{"action_digest": digest, "reason": "crash cell"})
	require.NoError(t, err)
	resp, err := http.Post(api.url+"/v1/actions/"+action+"/approve", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	_, err = doomed.cs.CallTool(ctx, call)
	require.Error(t, err, "the gateway died during the call: the session ends with an error")
	require.True(t, doomed.killedBySIGKILL(), "the fault plan killed ledger mcp at %s: %v\n%s", point, doomed.cmd.ProcessState, doomed.logs.String())

	again := c.gateway(t, ctx, api.url)
	res, err := again.cs.CallTool(ctx, call)
	require.NoError(t, err, again.logs.String())
	logs := func() string {
		return fmt.Sprintf("answer: %s\n--- killed gateway:\n%s--- restarted gateway:\n%s--- serve:\n%s",
			resultText(res), doomed.logs.String(), again.logs.String(), api.logs.String())
	}
	require.Equal(t, action, res.Meta[mcpgw.MetaAction], "the call joined the original action\n%s", logs())

	var act server.Action
	getServeJSON(t, api.url+"/v1/actions/"+action, &act)
	effects := effectsIn(t, c.effects)
	// Never two effects, and none but the action's.
	require.LessOrEqual(t, len(effects), 1, "effects: %+v\n%s", effects, logs())
	for _, e := range effects {
		require.Equal(t, act.DedupKey, e.DedupKey)
		require.Equal(t, simulator.CardsWriteTool, e.Tool)
	}

	want := expectedMCPCrashOutcome(point, g)
	require.Equal(t, want.state, act.State, logs())
	require.Equal(t, string(want.state), res.Meta[mcpgw.MetaState], logs())
	require.Len(t, effects, want.effects, logs())
	require.Len(t, act.Attempts, want.attempts, "attempts: %+v\n%s", act.Attempts, logs())
	switch want.state {
	case ledger.ActionSucceeded:
		require.False(t, res.IsError, logs())
		require.Len(t, effects, 1, "a success is exactly one effect")
		raw, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		if point == engine.FaultAfterToolCall && g.Query {
			// Recovery found the effect through the upstream's query: the
			// call's own answer died with the gateway, and the answer says
			// so rather than inventing one.
			require.Equal(t, true, res.Meta[mcpgw.MetaAnswerLost], logs())
			require.Contains(t, resultText(res), "do not repeat the call", logs())
			require.Nil(t, res.StructuredContent)
			break
		}
		require.JSONEq(t, string(effects[0].Output), string(raw), "the upstream's own answer to the call that acted\n%s", logs())
		require.Equal(t, string(act.Attempts[len(act.Attempts)-1].ID), res.Meta[mcpgw.MetaAttemptID])
	case ledger.ActionNeedsReview:
		require.True(t, res.IsError, logs())
		require.Contains(t, resultText(res), "is needs_review", logs())
		require.Equal(t, ledger.EffectUnknown, act.Attempts[len(act.Attempts)-1].Effect)
		var run server.Run
		getServeJSON(t, api.url+"/v1/runs/"+string(act.RunID), &run)
		require.Equal(t, ledger.RunNeedsReview, run.State, "the run waits for a person too")
	}
}
