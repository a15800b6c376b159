package faultmatrix

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
	"github.com/actionledger/ledger/simulator"
)

// harness drives one scenario's `ledger serve` process (dev mode, loopback,
// its own database) over HTTP.
type harness struct {
	bin, dir, db string
	// effectsPath is the simulator's effect store, "" for beside db
	// (serve's default for a database file); a replica cell's processes
	// share one, passed as --effects.
	effectsPath string
	env         []string // added to every process (Options.Env)
	args        []string // added to every `serve` (the scenario's rules)
	client      *http.Client
	// addr is where serve listens; "" means a free loopback port.
	addr string
	// token, when set, is sent as the bearer token of every request.
	token string
	// agentStore, when set, is the client agent's own effect store, read
	// instead of the simulator's.
	agentStore string
	// python and pyClient run a client agent: the interpreter, and the
	// directory holding the ledger_client package.
	python, pyClient string
	// settle, when set, is how long the scenario's fault took to settle
	// (the report's settle_ms).
	settle time.Duration

	mu     sync.Mutex
	proc   *exec.Cmd
	url    string
	exited chan error
	logs   bytes.Buffer
}

func newHarness(bin, dir string) *harness {
	return &harness{bin: bin, dir: dir, db: filepath.Join(dir, "ledger.db"), client: &http.Client{Timeout: 30 * time.Second}}
}

// start runs `ledger serve` with extra environment and waits for its
// address.
func (h *harness) start(ctx context.Context, env ...string) error {
	addr := h.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	cmd := exec.Command(h.bin, append([]string{"serve", "--db", h.db, "--addr", addr, "--log-format", "json"}, h.args...)...)
	cmd.Dir = h.dir
	cmd.Env = append(append(cleanEnv(), h.env...), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start serve: %w", err)
	}
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			h.mu.Lock()
			h.logs.Write(line)
			h.logs.WriteByte('\n')
			h.mu.Unlock()
			var rec struct {
				Msg string `json:"msg"`
				URL string `json:"url"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.URL != "" && strings.HasPrefix(rec.Msg, "listening on") {
				select {
				case urls <- rec.URL:
				default:
				}
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	h.mu.Lock()
	h.proc, h.exited = cmd, exited
	h.mu.Unlock()
	select {
	case u := <-urls:
		h.url = u
		return nil
	case err := <-exited:
		exited <- err
		return fmt.Errorf("serve exited before listening (%v): %s", err, h.tail())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("serve did not listen within 20s: %s", h.tail())
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return ctx.Err()
	}
}

// waitKilled waits for the process to die by SIGKILL (the fault plan).
func (h *harness) waitKilled(timeout time.Duration) error {
	select {
	case err := <-h.exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				return nil
			}
		}
		return fmt.Errorf("serve exited without being killed (%v): %s", err, h.tail())
	case <-time.After(timeout):
		return fmt.Errorf("the fault plan did not fire within %s", timeout)
	}
}

// kill SIGKILLs the running process and waits for its end.
func (h *harness) kill() error {
	h.mu.Lock()
	proc, exited := h.proc, h.exited
	h.mu.Unlock()
	if proc == nil {
		return errors.New("no serve process to kill")
	}
	if err := proc.Process.Kill(); err != nil {
		return fmt.Errorf("kill serve: %w", err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(15 * time.Second):
		return errors.New("serve did not die within 15s of SIGKILL")
	}
}

// stop ends the process gracefully (SIGTERM) or, failing that, kills it.
func (h *harness) stop() error {
	h.mu.Lock()
	proc, exited := h.proc, h.exited
	h.mu.Unlock()
	if proc == nil || proc.ProcessState != nil {
		return nil
	}
	_ = proc.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		return err
	case <-time.After(15 * time.Second):
		_ = proc.Process.Kill()
		<-exited
		return errors.New("serve ignored SIGTERM for 15s")
	}
}

func (h *harness) tail() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.logs.String()
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// do sends a JSON request with the harness's token and decodes a 2xx
// answer into out.
func (h *harness) do(method, path string, header map[string]string, body, out any) (int, error) {
	return h.doAs(h.token, method, path, header, body, out)
}

// doAs is do with another bearer token ("" for none): a client cell acts
// as the agent or as a person.
func (h *harness) doAs(token, method, path string, header map[string]string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(data, out)
	}
	return resp.StatusCode, nil
}

func (h *harness) submit(key string, budgets map[string]int64) (server.SubmitResponse, int, error) {
	title, md := simulator.SampleDocument()
	body := map[string]any{"agent": "practice-cards", "input": map[string]string{"title": title, "markdown": md}}
	if budgets != nil {
		body["budgets"] = budgets
	}
	var out server.SubmitResponse
	code, err := h.do(http.MethodPost, "/v1/runs", map[string]string{server.HeaderIdempotencyKey: key}, body, &out)
	return out, code, err
}

func (h *harness) run(id ledger.RunID) (server.Run, error) {
	var r server.Run
	_, err := h.do(http.MethodGet, "/v1/runs/"+string(id), nil, nil, &r)
	return r, err
}

func (h *harness) timeline(id ledger.RunID) (server.Timeline, error) {
	var tl server.Timeline
	_, err := h.do(http.MethodGet, "/v1/runs/"+string(id)+"/timeline", nil, nil, &tl)
	return tl, err
}

func (h *harness) decide(action ledger.ActionID, digest ledger.Digest, verb string) (int, error) {
	return h.do(http.MethodPost, "/v1/actions/"+string(action)+"/"+verb, nil, server.DecisionRequest{ActionDigest: digest}, nil)
}

func (h *harness) cancel(id ledger.RunID) (int, error) {
	return h.do(http.MethodPost, "/v1/runs/"+string(id)+"/cancel", nil, server.CancelRequest{Reason: "fault matrix"}, nil)
}

// waitRun polls the run until pred holds; it gives up after timeout or when
// the process dies.
func (h *harness) waitRun(id ledger.RunID, timeout time.Duration, pred func(server.Run) bool) (server.Run, error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last server.Run
	for {
		r, err := h.run(id)
		if err == nil {
			last = r
			if pred(r) {
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			return last, fmt.Errorf("run %s still %s/%s after %s", id, last.State, last.StopReason, timeout)
		}
		select {
		case err := <-h.exited:
			h.exited <- err
			return last, fmt.Errorf("serve exited (%v) while waiting for run %s: %s", err, id, h.tail())
		case <-tick.C:
		}
	}
}

// effects reads the tool's own store (the simulator's, or the client
// agent's): never the ledger.
func (h *harness) effects(ctx context.Context) ([]simulator.Effect, error) {
	if h.agentStore != "" {
		return agentEffects(ctx, h.agentStore)
	}
	return fromSimulator(ctx, h, (*simulator.EffectStore).Effects)
}

// calls reads the simulator's record of every call its tools got.
func (h *harness) calls(ctx context.Context) ([]simulator.CallRecord, error) {
	return fromSimulator(ctx, h, (*simulator.EffectStore).Calls)
}

// fromSimulator reads the cell's simulator store with read, opened for it.
func fromSimulator[T any](ctx context.Context, h *harness, read func(*simulator.EffectStore, context.Context) ([]T, error)) ([]T, error) {
	path := h.effectsPath
	if path == "" {
		path = h.db + ".effects.db"
	}
	s, err := simulator.OpenEffectStore(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return read(s, ctx)
}

// cli runs a local command of the binary (evidence verify, recover…).
func (h *harness) cli(args ...string) (string, int, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Dir = h.dir
	cmd.Env = append(cleanEnv(), h.env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode(), nil
	}
	return string(out), 0, err
}

// cleanEnv is the runner's environment without any fault settings of its
// own, so only what a scenario sets applies.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LEDGER_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
