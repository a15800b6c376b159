package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/ledger/stores"
	"github.com/actionledger/ledger/mcpgw"
	"github.com/actionledger/ledger/perf"
	"github.com/actionledger/ledger/redact"
	"github.com/actionledger/ledger/storehealth"
)

// The MCP gateway's figures: what the gateway adds to a read call, beside
// the same call made directly to the same upstream in the same run.
//
// The upstream is perf.MCPUpstream, an MCP server in this process on
// loopback streamable HTTP. It is reached three ways, one call at a time,
// taking turns in blocks (perf.MCPDrive):
//
//   - direct: an SDK client session on the upstream's URL, over the same
//     HTTP transport the gateway uses for a url upstream;
//   - relay: an SDK client over in-memory pipes to a proxy with no ledger
//     (perf.OpenMCPRelay), which calls the upstream over its own HTTP
//     session: any MCP proxy's hop;
//   - gateway: an SDK client over in-memory pipes to mcpgw's ServeStdio
//     (what `ledger mcp` serves on stdin and stdout), the upstream
//     confirmed in a lock file as a read, the engine on a fresh database
//     of the pass's driver (SQLite: synchronous=FULL), its pool started,
//     as `ledger mcp` runs it.
//
// The added latency is gateway − direct: what an agent pays for putting
// the gateway in front of an upstream it could call itself. The client's
// hop to the gateway (a pipe; a process's stdio in `ledger mcp`) is part
// of it, as it is part of using the gateway; relay − direct is that hop
// and a second SDK dispatch, so gateway − relay is the ledger's share.

// Targets of the gateway's added latency per read call, concurrency 1.
const (
	targetMCPAddedP50MS = 2.0
	targetMCPAddedP99MS = 5.0
)

// The MCP workload's calls per side (--mcp-calls), the untimed warm-up
// calls per side, and the calls of a side in a row before the next side's
// turn.
const (
	benchMCPCalls = 1000
	benchMCPWarm  = 20
	benchMCPBlock = 10
)

// The upstream's name in the config, and the tenant and principal the
// gateway serves its client as.
const (
	benchMCPUpstream  = "bench"
	benchMCPTenant    = "default"
	benchMCPPrincipal = "bench"
)

// mcpRun is what the MCP workload measured: each side's level (direct,
// relay, gateway), the Store's operations during the gateway's timed
// calls, and the calls they were counted over.
type mcpRun struct {
	direct, relay, gateway perf.MCPSideLevel
	ops                    opCounts
	calls                  int // gateway calls counted in ops
	// failed are the gateway's calls, warm-up included, answered with an
	// error or another text; failure is the first one's answer.
	failed  int
	failure string
}

// opCounts counts a Store's operations by name and kind, those made on a
// gateway call's path (its handler and what it waits for) apart from the
// others (the engine's pool, woken by each proposal), and the Store's
// commits (one transaction each, with the writes it carried; on SQLite a
// group commit).
type opCounts struct {
	path, other opGroup
	// commits counts every commit, and committed the writes they carried.
	commits, committed int
	commitTime         time.Duration // BEGIN to the end of COMMIT, summed
}

// opGroup counts operations by name.
type opGroup struct {
	reads, writes       map[string]int
	readsAll, writesAll int
	// wrote counts the writes that changed the database (ledger.Op.Wrote):
	// a replayed submit commits a transaction that changes nothing.
	wrote int
}

func (g *opGroup) add(op ledger.Op) {
	if g.reads == nil {
		g.reads, g.writes = map[string]int{}, map[string]int{}
	}
	if op.Write {
		g.writes[op.Name]++
		g.writesAll++
		if op.Wrote {
			g.wrote++
		}
	} else {
		g.reads[op.Name]++
		g.readsAll++
	}
}

func (g opGroup) clone() opGroup {
	g.reads, g.writes = maps.Clone(g.reads), maps.Clone(g.writes)
	return g
}

// minus is what g counted since it was before.
func (g opGroup) minus(before opGroup) opGroup {
	out := opGroup{reads: map[string]int{}, writes: map[string]int{}, readsAll: g.readsAll - before.readsAll,
		writesAll: g.writesAll - before.writesAll, wrote: g.wrote - before.wrote}
	for n, k := range g.reads {
		if d := k - before.reads[n]; d != 0 {
			out.reads[n] = d
		}
	}
	for n, k := range g.writes {
		if d := k - before.writes[n]; d != 0 {
			out.writes[n] = d
		}
	}
	return out
}

// minus is what c counted since it was before.
func (c opCounts) minus(before opCounts) opCounts {
	return opCounts{path: c.path.minus(before.path), other: c.other.minus(before.other), commits: c.commits - before.commits,
		committed: c.committed - before.committed, commitTime: c.commitTime - before.commitTime}
}

// settled answers the counts once a call's answer is in: a read call's
// path ends before its answer (the gateway records no delivery of a read:
// a read is read again), so nothing of it is still to come.
func (o *opCounter) settled() opCounts { return o.counts() }

// onCallPath marks the context the gateway serves its client on: the
// operations made under it are on a call's path.
type onCallPath struct{}

// opMark is one point of a call's timeline (opCounter.trace): an
// operation on its path ended, or the client sent or got the call.
type opMark struct {
	at   time.Time
	name string
}

// opCounter is a Store's observation hook and commit hook that count
// every operation and commit, and, while tracing, note when each
// operation on a call's path ended.
type opCounter struct {
	tracing atomic.Bool
	mu      sync.Mutex
	c       opCounts
	trace   []opMark
}

func newOpCounter() *opCounter { return &opCounter{} }

func (o *opCounter) observe(ctx context.Context, op ledger.Op) {
	path := ctx.Value(onCallPath{}) != nil
	o.mu.Lock()
	defer o.mu.Unlock()
	if !path {
		o.c.other.add(op)
		return
	}
	o.c.path.add(op)
	if o.tracing.Load() {
		o.trace = append(o.trace, opMark{at: time.Now(), name: op.Name})
	}
}

// mark notes a point of the client's in the trace.
func (o *opCounter) mark(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.trace = append(o.trace, opMark{at: time.Now(), name: name})
}

func (o *opCounter) commit(s ledger.CommitStats) {
	if s.Err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.c.commits++
	o.c.committed += s.Writes
	o.c.commitTime += s.Duration
}

func (o *opCounter) counts() opCounts {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.c
	c.path, c.other = c.path.clone(), c.other.clone()
	return c
}

// perCall lists ops as "name ×k" per call, most first.
func perCall(ops map[string]int, calls int) string {
	names := slices.Collect(maps.Keys(ops))
	sort.Slice(names, func(i, j int) bool {
		if ops[names[i]] != ops[names[j]] {
			return ops[names[i]] > ops[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, float64(ops[n])/float64(calls)))
	}
	return strings.Join(parts, ", ")
}

// mcpGateway is the gateway of the workload, wired as openService wires
// `ledger mcp`'s: its Store (with the counting hooks beside store health),
// the default rules, a redactor, the engine with the gateway's agent and
// its pool started, and the gateway bound to it; session is the client's
// session over pipes.
type mcpGateway struct {
	store   *ledger.DB
	engine  *engine.Engine
	gateway *mcpgw.Gateway
	counter *opCounter
	session *mcp.ClientSession
	closers []func() error
}

// Close ends the client's session, the gateway, the engine and the Store.
func (g *mcpGateway) Close() error {
	var errs []error
	for _, c := range slices.Backward(g.closers) {
		errs = append(errs, c())
	}
	g.closers = nil
	return errors.Join(errs...)
}

// openMCPGateway confirms the upstream's read tool into a lock file in dir
// (as `ledger mcp tools confirm` does), opens db and serves the gateway
// over pipes to an SDK client.
func openMCPGateway(ctx context.Context, db, dir, upstreamURL string) (_ *mcpGateway, err error) {
	cfg := &contracts.ConfigMCP{LockFile: filepath.Join(dir, "mcp-tools.lock.json"), Upstreams: []contracts.ConfigUpstream{{
		Name: benchMCPUpstream, URL: upstreamURL,
		Tools: map[string]contracts.ToolProfile{perf.MCPReadTool: {Effect: contracts.EffectRead}},
	}}}
	log := discardLogger()
	confirm, err := mcpgw.New(mcpgw.Options{Config: cfg, Dir: dir, Logger: log, Version: Version})
	if err != nil {
		return nil, err
	}
	tool := benchMCPUpstream + "__" + perf.MCPReadTool
	done, err := confirm.Confirm(ctx, []string{tool}, "bench", time.Now())
	err = errors.Join(err, confirm.Close())
	if err == nil && len(done) != 1 {
		err = fmt.Errorf("confirm %s: the upstream does not list it", tool)
	}
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}

	g := &mcpGateway{counter: newOpCounter()}
	defer func() {
		if err != nil {
			err = errors.Join(err, g.Close())
		}
	}()
	health := storehealth.New(storehealth.Config{Logger: log})
	g.store, err = stores.Open(ctx, stores.Config{DB: db, OnCommit: g.counter.commit,
		Observe: func(ctx context.Context, op ledger.Op) { health.Observe(ctx, op); g.counter.observe(ctx, op) }})
	if err != nil {
		return nil, err
	}
	g.closers = append(g.closers, g.store.Close)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	redactor, err := redact.NewRedactor(key)
	if err != nil {
		return nil, err
	}
	if g.gateway, err = mcpgw.New(mcpgw.Options{Config: cfg, Dir: dir, Logger: log, Version: Version, StateKey: mcpStateKey(key)}); err != nil {
		return nil, err
	}
	g.closers = append(g.closers, g.gateway.Close)
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	if err != nil {
		return nil, err
	}
	approvals := approval.NewService(g.store, policy, func(name string) (contracts.ToolDescriptor, bool) { return g.engine.Tool(name) },
		approval.Options{Redactor: redactor})
	if _, err := approvals.StoreRules(ctx); err != nil {
		return nil, err
	}
	g.engine, err = engine.New(engine.Config{Store: g.store, Approvals: approvals, Agents: []engine.Agent{g.gateway.Agent()},
		Logger: log, Redactor: redactor, Health: health, AttemptTokenKey: attemptTokenKey(key)})
	if err != nil {
		return nil, err
	}
	g.gateway.Bind(g.engine)
	g.engine.Start(context.WithoutCancel(ctx))
	g.closers = append(g.closers, func() error { g.engine.Stop(); return nil })
	id := mcpgw.Identity{Tenant: benchMCPTenant, Principal: benchMCPPrincipal}
	s, stop, err := perf.PipeSession(ctx, "ledger-bench-client", func(ctx context.Context, in io.ReadCloser, out io.WriteCloser) error {
		return g.gateway.ServeStdio(context.WithValue(ctx, onCallPath{}, true), id, in, out)
	})
	if err != nil {
		return nil, err
	}
	g.session = s
	g.closers = append(g.closers, stop)
	return g, nil
}

// benchMCP runs the MCP workload on a fresh database of t: n timed read
// calls each way after the warm-up, the gateway's Store operations counted
// over its timed calls and their deliveries.
func benchMCP(ctx context.Context, t benchTarget, n int, progress perf.Progress) (mcpRun, error) {
	var r mcpRun
	up := perf.OpenMCPUpstream()
	defer up.Close()
	db, err := t.newDB(ctx, "mcp")
	if err != nil {
		return r, err
	}
	lockDir := filepath.Join(t.dir, "mcp-"+t.driver)
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return r, err
	}
	gw, err := openMCPGateway(ctx, db, lockDir, up.URL)
	if err != nil {
		return r, err
	}
	defer gw.Close()
	direct, err := up.Connect(ctx, "ledger-bench-direct")
	if err != nil {
		return r, err
	}
	defer direct.Close()
	relay, closeRelay, err := perf.OpenMCPRelay(ctx, up.URL)
	if err != nil {
		return r, err
	}
	defer closeRelay()

	var runs sync.Map // the runs the gateway's answers named: one, the session's
	sides := []perf.MCPSide{
		{Name: "direct", Session: direct, Tool: perf.MCPReadTool},
		{Name: "relay", Session: relay, Tool: perf.MCPReadTool},
		{Name: "gateway", Session: gw.session, Tool: benchMCPUpstream + "__" + perf.MCPReadTool, Check: func(res *mcp.CallToolResult) error {
			if st := res.Meta[mcpgw.MetaState]; st != string(ledger.ActionSucceeded) {
				return fmt.Errorf("the action is %v, not succeeded", st)
			}
			if res.Meta[mcpgw.MetaReplayed] == true {
				return errors.New("the answer was replayed: the call joined an earlier action")
			}
			runs.Store(res.Meta[mcpgw.MetaRun], true)
			return nil
		}},
	}
	// The warm-up connects the gateway to its upstream and opens the
	// session's run; the counting starts with the timed calls.
	drive := &perf.MCPDrive{Sides: sides, Block: benchMCPBlock}
	warm, err := drive.Warm(ctx, benchMCPWarm)
	if err != nil {
		return r, err
	}
	levels, ops, err := driveMCPCounted(ctx, gw, drive, n)
	if err != nil {
		return r, err
	}
	r.direct, r.relay, r.gateway = levels[0], levels[1], levels[2]
	r.ops, r.calls = ops, n
	// Only the gateway's calls may fail: it is what is measured. A failure
	// of the others is the bench's own.
	for k, l := range append(warm[:2:2], levels[:2]...) {
		if l.Failed > 0 {
			return r, fmt.Errorf("%s: %d calls failed, the first: %s", sides[k%2].Name, l.Failed, l.FirstFailure)
		}
	}
	for _, l := range []perf.MCPSideLevel{warm[2], levels[2]} {
		if l.Failed > 0 && r.failed == 0 {
			r.failure = l.FirstFailure
		}
		r.failed += l.Failed
	}
	if r.failed > 0 {
		progress("mcp gateway: %d of %d read calls answered otherwise than the upstream, the first: %s", r.failed, benchMCPWarm+n, r.failure)
	}
	nruns := 0
	runs.Range(func(any, any) bool { nruns++; return true })
	made := int64(3 * (benchMCPWarm + n))
	if got := up.Calls(); got < made-int64(r.failed) || got > made || nruns != 1 {
		return r, fmt.Errorf("the upstream answered %d calls for %d made (%d of them failed); the gateway's answers named %d runs, not one",
			got, made, r.failed, nruns)
	}
	progress("mcp gateway: %d read calls each way: direct p50 %.2f ms p99 %.2f ms; relay p50 %.2f ms; gateway p50 %.2f ms p99 %.2f ms; "+
		"per gateway call %.2f Store writes in %.2f commits (%.2f ms in them), %.2f reads", n, ms(r.direct.P(0.5)), ms(r.direct.P(0.99)),
		ms(r.relay.P(0.5)), ms(r.gateway.P(0.5)), ms(r.gateway.P(0.99)), float64(r.ops.path.writesAll+r.ops.other.writesAll)/float64(n),
		float64(r.ops.commits)/float64(n), ms(r.ops.commitTime)/float64(n), float64(r.ops.path.readsAll+r.ops.other.readsAll)/float64(n))
	return r, nil
}

// driveMCPCounted makes the timed calls and answers the gateway's Store
// operations they made: a read call's are all made by the time its answer
// is in (no delivery of a read is recorded).
func driveMCPCounted(ctx context.Context, gw *mcpGateway, drive *perf.MCPDrive, n int) ([]perf.MCPSideLevel, opCounts, error) {
	before := gw.counter.settled()
	levels, err := drive.Run(ctx, n)
	if err != nil {
		return nil, opCounts{}, err
	}
	return levels, gw.counter.settled().minus(before), nil
}

// mcpFigures are the MCP workload's figures; lat is a time's ratio to the
// floor.
func mcpFigures(r mcpRun, lat func(ms float64) *float64) []benchFigure {
	p := func(l perf.MCPSideLevel, q float64) float64 { return ms(l.P(q)) }
	n := len(r.gateway.Latencies)
	timeFig := func(key, name string, v float64) benchFigure {
		return benchFigure{Key: key, Name: name, Value: v, Unit: "ms", RatioToFloor: lat(v)}
	}
	addedP50 := p(r.gateway, 0.50) - p(r.direct, 0.50)
	addedP99 := p(r.gateway, 0.99) - p(r.direct, 0.99)
	added50 := timeFig("mcp_added_p50_ms", "mcp gateway: added per read call, p50", addedP50)
	added50.Target, added50.Met, added50.Note = fmt.Sprintf("< %.0f ms", targetMCPAddedP50MS), met(addedP50 < targetMCPAddedP50MS),
		"gateway p50 − direct p50; "+byHowMuch(addedP50, targetMCPAddedP50MS)
	added99 := timeFig("mcp_added_p99_ms", "mcp gateway: added per read call, p99", addedP99)
	added99.Target, added99.Met, added99.Note = fmt.Sprintf("< %.0f ms", targetMCPAddedP99MS), met(addedP99 < targetMCPAddedP99MS),
		"gateway p99 − direct p99; "+byHowMuch(addedP99, targetMCPAddedP99MS)
	perCallOf := func(k int) float64 {
		if r.calls == 0 {
			return 0
		}
		return float64(k) / float64(r.calls)
	}
	direct50 := timeFig("mcp_direct_p50_ms", "mcp read call, direct, p50", p(r.direct, 0.50))
	direct50.Note = fmt.Sprintf("%d calls each way, concurrency 1, taking turns in blocks of %d: an SDK client on the upstream's "+
		"streamable HTTP on loopback, as the gateway reaches it", n, benchMCPBlock)
	relay50 := timeFig("mcp_relay_p50_ms", "mcp read call, proxy without ledger, p50", p(r.relay, 0.50))
	relay50.Note = "an SDK client over in-memory pipes to an MCP proxy that calls the upstream over HTTP: the hop every proxy adds"
	gw50 := timeFig("mcp_gateway_p50_ms", "mcp read call, gateway, p50", p(r.gateway, 0.50))
	gw50.Note = "an SDK client over in-memory pipes to ledger mcp's ServeStdio, the engine on this driver, its pool started; " +
		"every call of the session is an action of one run"
	first := timeFig("mcp_gateway_first_tenth_p50_ms", "mcp read call, gateway, first tenth, p50", p(r.gateway.Part(0, 0.1), 0.50))
	first.Note = fmt.Sprintf("calls 1–%d of the timed ones (the run holds %d actions before them): "+
		"each call reads every action of its run", max(n/10, 1), benchMCPWarm)
	last := timeFig("mcp_gateway_last_tenth_p50_ms", "mcp read call, gateway, last tenth, p50", p(r.gateway.Part(0.9, 1), 0.50))
	ledger50 := timeFig("mcp_ledger_p50_ms", "mcp gateway: the ledger's share, p50", p(r.gateway, 0.50)-p(r.relay, 0.50))
	ledger50.Note = "gateway p50 − proxy p50"
	writes := benchFigure{Key: "mcp_store_writes_per_call", Name: "mcp gateway: Store writes per read call, on its path",
		Value: perCallOf(r.ops.path.writesAll), Unit: "writes", Note: fmt.Sprintf("the call's own, its delivery's among them; "+
			"%.2f of them changed the database; by operation: %s", perCallOf(r.ops.path.wrote), perCall(r.ops.path.writes, max(r.calls, 1)))}
	poolWrites := benchFigure{Key: "mcp_pool_writes_per_call", Name: "mcp gateway: Store writes per read call, the engine pool's",
		Value: perCallOf(r.ops.other.writesAll), Unit: "writes", Note: fmt.Sprintf("each proposal wakes the pool for a pass: "+
			"%.2f of them changed the database; by operation: %s", perCallOf(r.ops.other.wrote), perCall(r.ops.other.writes, max(r.calls, 1)))}
	commits := benchFigure{Key: "mcp_commits_per_call", Name: "mcp gateway: commits per read call", Value: perCallOf(r.ops.commits),
		Unit: "commits", Note: "write transactions (group commits on SQLite); one that changed something is one fsync"}
	cpuDirect := timeFig("mcp_direct_cpu_ms_per_call", "mcp direct: CPU per read call", ms(r.direct.CPUPerCall()))
	cpuDirect.Note = "the whole process's CPU time (getrusage) over the side's turns ÷ its calls: client, upstream, and " +
		"for the gateway the ledger and the engine pool; less at the mercy of other load than the latencies"
	cpuAdded := timeFig("mcp_added_cpu_ms_per_call", "mcp gateway: added CPU per read call", ms(r.gateway.CPUPerCall()-r.direct.CPUPerCall()))
	cpuAdded.Note = "gateway − direct"
	failed := benchFigure{Key: "mcp_gateway_failed_calls", Name: "mcp gateway: read calls that failed", Value: float64(r.failed),
		Unit: "calls", Target: "0", Met: met(r.failed == 0), Note: fmt.Sprintf("of %d, warm-up included", benchMCPWarm+n)}
	if r.failed > 0 {
		failed.Note += "; the first answered: " + r.failure
	}
	var commitMS float64
	if r.calls > 0 {
		commitMS = ms(r.ops.commitTime) / float64(r.calls)
	}
	inCommits := timeFig("mcp_commit_ms_per_call", "mcp gateway: time in commits per read call", commitMS)
	inCommits.Note = "BEGIN to the end of COMMIT, summed over the calls' commits (the engine pool's among them) ÷ calls"
	reads := benchFigure{Key: "mcp_store_reads_per_call", Name: "mcp gateway: Store reads per read call, on its path",
		Value: perCallOf(r.ops.path.readsAll), Unit: "reads", Note: fmt.Sprintf("%s; the pool's: %s",
			perCall(r.ops.path.reads, max(r.calls, 1)), perCall(r.ops.other.reads, max(r.calls, 1)))}
	return []benchFigure{
		direct50, timeFig("mcp_direct_p99_ms", "mcp read call, direct, p99", p(r.direct, 0.99)),
		relay50, timeFig("mcp_relay_p99_ms", "mcp read call, proxy without ledger, p99", p(r.relay, 0.99)),
		gw50, timeFig("mcp_gateway_p99_ms", "mcp read call, gateway, p99", p(r.gateway, 0.99)), first, last,
		added50, added99, ledger50,
		{Key: "mcp_direct_per_s", Name: "mcp read calls, direct", Value: r.direct.PerSecond(), Unit: "calls/s",
			Note: "calls ÷ the side's own time (the sides take turns)"},
		{Key: "mcp_gateway_per_s", Name: "mcp read calls, gateway", Value: r.gateway.PerSecond(), Unit: "calls/s"},
		cpuDirect, timeFig("mcp_gateway_cpu_ms_per_call", "mcp gateway: CPU per read call", ms(r.gateway.CPUPerCall())),
		cpuAdded,
		writes, poolWrites, commits, inCommits, reads, failed,
	}
}

// byHowMuch says whether v (ms) is under target, and by how much.
func byHowMuch(v, target float64) string {
	if v < target {
		return fmt.Sprintf("met, %.2f ms under", target-v)
	}
	return fmt.Sprintf("missed, %.2f ms over (%.1f× the target)", v-target, v/target)
}
