package faultmatrix

import (
	"bytes"
	"context"
	"database/sql"
	_ "embed" // the client agent's script
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// faultAgent is the Python agent the client-driven scenarios run: written
// into each scenario's directory, run with the repository's clients/python
// on its path.
//
//go:embed agent/fault_agent.py
var faultAgent []byte

const (
	clientAgent  = "fm-agent"
	clientTenant = "fm"
	// clientLease is the client tools' heartbeat_timeout: a killed agent's
	// lease lapses this soon.
	clientLease = 1000 * time.Millisecond
	// clientDecisionTimeout is the client tools' decision_timeout in the
	// client-gone cells: a recovery decision told to the agent (query,
	// cancel, resend) that nobody answers this long goes to review. The
	// cells whose agent comes back keep the default (five minutes), so
	// that a slow restart is never taken for an agent that is gone.
	clientDecisionTimeout = 2000 * time.Millisecond
	// clientReadTool is the client read tool of the client-read cells:
	// no guarantees, since a read has no effect to establish.
	clientReadTool = "fm.read"
	// redactionKey is the scenario servers' redaction key (a tokens file
	// takes serve out of dev mode, which needs one).
	redactionKey = "LEDGER_REDACTION_KEY=faultmatrix-client-redaction-key-0123456789"
)

// clientTool is the name of the client write tool with these guarantees.
func clientTool(g contracts.Guarantees) string {
	return "fm." + strings.ReplaceAll(comboName(g), "-", "_")
}

// clientScenarios are the client-driven lines of the matrix: a real Python
// agent SIGKILLs itself at each attempt point, for every combination of
// guarantees, and is started again; and the server is SIGKILLed mid-attempt
// while the agent goes on.
func clientScenarios() []*Scenario {
	var out []*Scenario
	for _, p := range engine.FaultPoints() {
		for _, g := range guaranteeCombos() {
			out = append(out, &Scenario{Name: fmt.Sprintf("client/%s/%s", p, comboName(g)), Guarantees: g,
				Fault:  fmt.Sprintf("the Python agent SIGKILLs itself at %s, then resumes", p),
				Expect: crashExpectation(p, g), python: true, drive: driveClientCrash(p)})
		}
	}
	for _, c := range []struct {
		point engine.FaultPoint
		g     contracts.Guarantees
	}{
		// The begin answered, the server dies: the agent calls its tool and
		// reports while the server is down, until it is back.
		{engine.FaultAfterAttemptRecorded, allOn},
		{engine.FaultAfterAttemptRecorded, contracts.Guarantees{Query: true}},
		// The effect is made, the server dies before the complete: the
		// report reaches the server back, late, and settles the action as
		// a query's answer would, or the agent gives up reporting, resumes,
		// and the query finds the effect. (Cells whose end depends on which
		// comes first are left out: with only dedup a resend may follow,
		// with only cancel a person may be asked.)
		{engine.FaultAfterToolCall, allOn},
		{engine.FaultAfterToolCall, contracts.Guarantees{Query: true}},
	} {
		out = append(out, &Scenario{Name: fmt.Sprintf("client-server-kill/%s/%s", c.point, comboName(c.g)), Guarantees: c.g,
			Fault:  fmt.Sprintf("the server is SIGKILLed while the agent is at %s, restarted on the same port", c.point),
			Expect: completed(1, 1), python: true, drive: driveServerKill(c.point)})
	}
	return out
}

// clientConfig is the scenario server's config file: the eight client
// write tools, the read tool, the agent, and rules that approve each call.
// decisionTimeout, if positive, is every client tool's
// decision_timeout_ms.
func clientConfig(decisionTimeout time.Duration) ([]byte, error) {
	var (
		tools []string
		rules []map[string]string
	)
	toolDocs := []map[string]any{}
	add := func(name, effect string, g contracts.Guarantees) {
		doc := map[string]any{
			"name": name, "version": "1", "effect": effect, "executor": "client",
			"arguments_schema": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"text"},
				"properties": map[string]any{"text": map[string]string{"type": "string"}}},
			"guarantees":           map[string]bool{"query": g.Query, "dedup": g.Dedup, "cancel": g.Cancel},
			"timeout_ms":           20000,
			"heartbeat_timeout_ms": clientLease.Milliseconds(),
			"max_duration_ms":      20000,
		}
		if decisionTimeout > 0 {
			doc["decision_timeout_ms"] = decisionTimeout.Milliseconds()
		}
		toolDocs = append(toolDocs, doc)
		tools = append(tools, name)
		rules = append(rules, map[string]string{"tool": name, "decision": "auto_approve"})
	}
	for _, g := range guaranteeCombos() {
		add(clientTool(g), "write", g)
	}
	add(clientReadTool, "read", contracts.Guarantees{})
	return json.MarshalIndent(map[string]any{
		"schema_version": "1.0",
		"tools":          toolDocs,
		"agents": []map[string]any{{"name": clientAgent, "driver": "client", "tools": tools, "tenants": []string{clientTenant},
			"policies": map[string]int{"repeat_limit": 50, "no_progress_window": 50, "consecutive_errors": 50}}},
		"rules": map[string]any{"schema_version": "1.0", "rules": rules},
	}, "", "  ")
}

// clientSetup is what a client scenario's agent needs, and the token of
// the person who settles a review.
type clientSetup struct {
	script, agentToken, approverToken string
}

// setupClient writes the config, the tokens and the agent's script into the
// scenario's directory and points the harness at them; decisionTimeout is
// as for clientConfig.
func setupClient(h *harness, decisionTimeout time.Duration) (clientSetup, error) {
	cfg, err := clientConfig(decisionTimeout)
	if err != nil {
		return clientSetup{}, err
	}
	cfgPath, tokens := filepath.Join(h.dir, "config.json"), filepath.Join(h.dir, "tokens.json")
	script := filepath.Join(h.dir, "fault_agent.py")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return clientSetup{}, err
	}
	if err := os.WriteFile(script, faultAgent, 0o644); err != nil {
		return clientSetup{}, err
	}
	token := func(principal string, roles ...string) (string, error) {
		args := []string{"token", "new", "--principal", principal, "--tenant", clientTenant, "--json", "--add-to", tokens}
		for _, r := range roles {
			args = append(args, "--role", r)
		}
		if roles[0] == "agent" {
			args = append(args, "--agent", clientAgent)
		}
		out, code, err := h.cli(args...)
		if err != nil || code != 0 {
			return "", fmt.Errorf("token new (exit %d, %v): %s", code, err, out)
		}
		var t struct{ Token string }
		if err := json.Unmarshal([]byte(out), &t); err != nil || t.Token == "" {
			return "", fmt.Errorf("token new: %q", out)
		}
		return t.Token, nil
	}
	agentToken, err := token("fm-agent-1", "agent")
	if err != nil {
		return clientSetup{}, err
	}
	if h.token, err = token("fm-auditor", "auditor"); err != nil {
		return clientSetup{}, err
	}
	approverToken, err := token("fm-approver", "approver")
	if err != nil {
		return clientSetup{}, err
	}
	h.env = append(h.env, redactionKey)
	h.args = append(h.args, "--config", cfgPath, "--tokens", tokens, "--rate-limit", "0")
	h.agentStore = filepath.Join(h.dir, "agent-effects.db")
	return clientSetup{script: script, agentToken: agentToken, approverToken: approverToken}, nil
}

// agentProc is one run of the Python agent.
type agentProc struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer // read (runID) while the agent still writes
	done           chan error
}

// lockedBuffer is a bytes.Buffer safe for one writer and concurrent
// readers: exec's copying goroutine writes the agent's output while a
// cell reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Bytes is a copy of what was written so far.
func (l *lockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startAgent starts the agent on the scenario's run and tool (the read
// tool for a read cell).
func startAgent(ctx context.Context, h *harness, cs clientSetup, sc *Scenario, n int, extra ...string) (*agentProc, error) {
	tool := clientTool(sc.Guarantees)
	if sc.read {
		tool, extra = clientReadTool, append([]string{"--read"}, extra...)
	}
	args := []string{cs.script, "--ledger", h.url, "--token", cs.agentToken, "--agent", clientAgent, "--run-key", "client-1",
		"--tool", tool, "--effects", h.agentStore, "--pause-dir", h.dir}
	for flag, on := range map[string]bool{"--query": sc.Guarantees.Query, "--dedup": sc.Guarantees.Dedup, "--cancel": sc.Guarantees.Cancel} {
		if on {
			args = append(args, flag)
		}
	}
	p := &agentProc{done: make(chan error, 1)}
	p.cmd = exec.CommandContext(ctx, h.python, append(args, extra...)...)
	p.cmd.Dir = h.dir
	p.cmd.Env = append(cleanEnv(), "PYTHONPATH="+h.pyClient, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the agent: %w", err)
	}
	go func() {
		err := p.cmd.Wait()
		_ = os.WriteFile(filepath.Join(h.dir, fmt.Sprintf("agent-%d.log", n)), append(p.stdout.Bytes(), p.stderr.Bytes()...), 0o644)
		p.done <- err
	}()
	return p, nil
}

// wait waits for the agent's end; killed says it must die by SIGKILL,
// else it must exit 0.
func (p *agentProc) wait(timeout time.Duration, killed bool) error {
	select {
	case err := <-p.done:
		var exit *exec.ExitError
		signaled := errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled() &&
			exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
		switch {
		case killed && !signaled:
			return fmt.Errorf("the agent was not SIGKILLed (%v): %s", err, p.tail())
		case !killed && err != nil:
			return fmt.Errorf("the agent failed (%v): %s", err, p.tail())
		}
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("the agent did not end within %s: %s", timeout, p.tail())
	}
}

func (p *agentProc) tail() string {
	s := p.stderr.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return strings.TrimSpace(s)
}

// runID is the run the agent drove: its last line says so, and its log
// once it has submitted.
func (p *agentProc) runID() ledger.RunID {
	if f := strings.Fields(p.stdout.String()); len(f) >= 2 {
		return ledger.RunID(f[0])
	}
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		if _, rest, ok := strings.Cut(line, "]: run "); ok {
			if id, _, ok := strings.Cut(rest, " "); ok {
				return ledger.RunID(id)
			}
		}
	}
	return ""
}

// driveClientCrash: the agent SIGKILLs itself at the point; started again
// without the fault, it resumes the run and finishes it.
func driveClientCrash(p engine.FaultPoint) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		cs, err := setupClient(h, 0)
		if err != nil {
			return "", err
		}
		if err := h.start(ctx); err != nil {
			return "", err
		}
		first, err := startAgent(ctx, h, cs, sc, 1, "--fault-at", string(p))
		if err != nil {
			return "", err
		}
		if err := first.wait(wait, true); err != nil {
			return first.runID(), err
		}
		second, err := startAgent(ctx, h, cs, sc, 2)
		if err != nil {
			return first.runID(), err
		}
		err = second.wait(wait, false)
		id := second.runID()
		if id == "" {
			id = first.runID()
		}
		if err != nil {
			return id, err
		}
		_, err = h.waitRun(id, wait, finished)
		return id, err
	}
}

// driveServerKill: the agent pauses at the point, the server is SIGKILLed,
// the agent goes on while it is down, and the server comes back on the
// same port.
func driveServerKill(p engine.FaultPoint) func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
	return func(ctx context.Context, h *harness, sc *Scenario) (ledger.RunID, error) {
		cs, err := setupClient(h, 0)
		if err != nil {
			return "", err
		}
		if err := h.start(ctx); err != nil {
			return "", err
		}
		u, err := url.Parse(h.url)
		if err != nil {
			return "", err
		}
		agent, err := startAgent(ctx, h, cs, sc, 1, "--pause-at", string(p))
		if err != nil {
			return "", err
		}
		if err := awaitFile(filepath.Join(h.dir, "paused"), wait, agent); err != nil {
			return agent.runID(), err
		}
		if err := h.kill(); err != nil {
			return agent.runID(), err
		}
		if err := os.WriteFile(filepath.Join(h.dir, "go"), nil, 0o644); err != nil {
			return agent.runID(), err
		}
		// Down longer than the lease: the agent's calls fail meanwhile, and
		// the server comes back to an attempt whose lease has lapsed.
		time.Sleep(clientLease + 500*time.Millisecond)
		h.addr = u.Host
		if err := h.start(ctx); err != nil {
			return agent.runID(), err
		}
		err = agent.wait(wait, false)
		id := agent.runID()
		if err != nil {
			return id, err
		}
		_, err = h.waitRun(id, wait, finished)
		return id, err
	}
}

// awaitFile waits for path to exist, or for the agent to end first.
func awaitFile(path string, timeout time.Duration, agent *agentProc) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case err := <-agent.done:
			agent.done <- err
			return fmt.Errorf("the agent ended (%v) before pausing: %s", err, agent.tail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not pause within %s", timeout)
		}
	}
}

// agentEffects reads the client agent's own effect store: one row per
// effect, keyed by dedup key.
func agentEffects(ctx context.Context, path string) ([]simulator.Effect, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		return nil, fmt.Errorf("open the agent's effect store: %w", err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT seq, dedup_key FROM effects ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("read the agent's effect store: %w", err)
	}
	defer rows.Close()
	var out []simulator.Effect
	for rows.Next() {
		var e simulator.Effect
		if err := rows.Scan(&e.Seq, &e.DedupKey); err != nil {
			return nil, fmt.Errorf("read the agent's effect store: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// findPython resolves the interpreter and the Python client's directory:
// given ones, else python3 on PATH and clients/python found upward from the
// working directory or from the binary. The error says why client
// scenarios cannot run.
func findPython(python, client, bin string) (string, string, error) {
	if python == "" {
		python = "python3"
	}
	py, err := exec.LookPath(python)
	if err != nil {
		return "", "", fmt.Errorf("%s not found: client-driven scenarios need a Python 3 interpreter", python)
	}
	if client != "" {
		if _, err := os.Stat(filepath.Join(client, "ledger_client", "__init__.py")); err != nil {
			return "", "", fmt.Errorf("no ledger_client package in %s", client)
		}
		abs, err := filepath.Abs(client)
		return py, abs, err
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if abs, err := filepath.Abs(bin); err == nil {
		starts = append(starts, filepath.Dir(abs))
	}
	for _, d := range starts {
		for {
			c := filepath.Join(d, "clients", "python")
			if _, err := os.Stat(filepath.Join(c, "ledger_client", "__init__.py")); err == nil {
				return py, c, nil
			}
			parent := filepath.Dir(d)
			if parent == d {
				break
			}
			d = parent
		}
	}
	return "", "", errors.New("clients/python not found above the working directory or the binary: give --python-client")
}
