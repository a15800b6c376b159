// The client against the real binary: bin/ledger serve with a config file
// declaring a client agent and tools of different guarantees, and tokens of
// the roles agent and approver.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, it } from "node:test";

import {
  Client,
  Denied,
  InvalidArguments,
  LedgerError,
  NeedsRecovery,
  StepKeyReused,
  ToolNotAllowed,
  UnknownTool,
  type JSONValue,
  type Run,
  type RunEvent,
} from "../index.js";
import { clientTool, decidePending, sleep, startLedger, type LedgerServer } from "../testing/index.js";

const config = {
  schema_version: "1.0",
  tools: [
    clientTool("notes.read", "read", {}, { arguments_schema: { type: "object", required: ["id"], properties: { id: { type: "string" } } } }),
    clientTool("payments.send", "write", { query: true }),
    clientTool("orders.place", "write", { query: true }),
    clientTool("emails.send", "write", { dedup: true }, { dedup_retention_ms: 86_400_000 }),
    clientTool("files.delete", "write", {}),
    clientTool("uploads.put", "write", { dedup: true }, { heartbeat_timeout_ms: 1000, max_duration_ms: 20_000, timeout_ms: 20_000 }),
  ],
  agents: [
    { name: "ts-agent", driver: "client", tools: ["notes.read", "payments.send", "orders.place", "emails.send", "files.delete", "uploads.put"] },
  ],
  rules: {
    schema_version: "1.0",
    rules: [
      { tool: "payments.send", decision: "require_approval" },
      { tool: "*", decision: "auto_approve" },
    ],
  },
};

let server: LedgerServer;
let agent: Client;
let approver: Client;

before(async () => {
  server = await startLedger({
    config,
    tokens: {
      agent: { principal: "ts-agent-bot", tenant: "acme", roles: ["agent"], agents: ["ts-agent"] },
      approver: { principal: "alice", tenant: "acme", roles: ["approver"] },
    },
  });
  agent = new Client({ baseUrl: server.url, token: server.tokens.agent });
  approver = new Client({ baseUrl: server.url, token: server.tokens.approver });
});

after(async () => {
  await server?.stop();
});

async function newRun(): Promise<Run> {
  const run = await agent.startRun("ts-agent", { task: "test" }, `run-${randomUUID()}`);
  assert.match(run.id, /^run_/);
  return run;
}

describe("a read", () => {
  it("OK: proposed, auto-approved, begun, completed with its output", async () => {
    const run = await newRun();
    let seen: { args: JSONValue; dedup: string } | undefined;
    const res = await run.call("notes.read", { id: "n1" }, { stepKey: "read-1" }, async (call) => {
      seen = { args: call.arguments, dedup: call.dedupKey };
      return { text: "hello" };
    });
    assert.deepEqual(seen?.args, { id: "n1" });
    assert.equal(seen?.dedup, res.action.dedup_key);
    assert.equal(res.replayed, false);
    assert.equal(res.action.state, "succeeded");
    assert.equal(res.attempt?.status, "succeeded");
    assert.deepEqual(res.value, { text: "hello" });
    const stored = await agent.getAction(res.action.id);
    assert.equal(stored.state, "succeeded");
    assert.equal(stored.attempts.length, 1);
    const next = await run.next();
    assert.deepEqual(next.directives.map((d) => d.directive), ["propose"]);
    const done = await run.finish("completed", { output: { summary: "read n1" } });
    assert.equal(done.state, "completed");
  });

  it("InvalidArguments: arguments failing the tool's schema, with each location", async () => {
    const run = await newRun();
    const err = await run.propose("notes.read", { id: 7 }, "bad-args").catch((e: unknown) => e);
    assert.ok(err instanceof InvalidArguments, String(err));
    assert.equal(err.status, 422);
    assert.equal(err.code, "invalid_arguments");
    assert.ok(err.errors.length > 0);
  });

  it("UnknownTool: a tool nobody declared", async () => {
    const run = await newRun();
    const err = await run.propose("nope.never", {}, "unknown").catch((e: unknown) => e);
    assert.ok(err instanceof UnknownTool, String(err));
    assert.equal(err.status, 422);
  });
});

describe("a write that needs approval", () => {
  it("OK: waits for the approver, then runs once with the approved arguments", async () => {
    const run = await newRun();
    let calls = 0;
    const deciding = decidePending(approver, run.id, "approve");
    const res = await run.call("payments.send", { to: "acct_1", cents: 500 }, { stepKey: "pay-1", waitSeconds: 5 }, async (call) => {
      calls++;
      assert.deepEqual(call.arguments, { cents: 500, to: "acct_1" });
      call.succeeded({ payment_id: "pay_9" });
    });
    assert.equal(await deciding, res.action.id);
    assert.equal(calls, 1);
    assert.equal(res.action.state, "succeeded");
    assert.equal(res.attempt?.effect, "happened");
    assert.deepEqual(res.outcome, { status: "succeeded", effect: "happened", output: { payment_id: "pay_9" } });
    const stored = await agent.getAction(res.action.id);
    assert.equal(stored.approvals[0]?.state, "granted");
    assert.equal(stored.approvals[0]?.decided_by, "alice");
  });

  it("Denied: the approver's no, and the call is never made", async () => {
    const run = await newRun();
    let calls = 0;
    const deciding = decidePending(approver, run.id, "deny");
    const err = await run
      .call("payments.send", { to: "acct_2", cents: 1 }, { stepKey: "pay-denied", waitSeconds: 5 }, async () => {
        calls++;
      })
      .catch((e: unknown) => e);
    await deciding;
    assert.ok(err instanceof Denied, String(err));
    assert.equal(err.code, "denied");
    assert.equal(err.action?.state, "denied");
    assert.equal(calls, 0);
  });

  it("Forbidden: the agent's token cannot approve", async () => {
    const run = await newRun();
    const action = await run.propose("payments.send", { to: "acct_3", cents: 2 }, "pay-self");
    assert.equal(action.state, "awaiting_approval");
    const err = await agent.approve(action.id, action.action_digest).catch((e: unknown) => e);
    assert.ok(err instanceof LedgerError, String(err));
    assert.equal(err.status, 403);
  });
});

describe("step keys", () => {
  it("OK: a replay of the same key and body is the same action", async () => {
    const run = await newRun();
    const first = await run.propose("emails.send", { to: "bo@example.com" }, "mail-1");
    assert.equal(first.replayed, false);
    const again = await run.propose("emails.send", { to: "bo@example.com" }, "mail-1");
    assert.equal(again.replayed, true);
    assert.equal(again.id, first.id);
  });

  it("StepKeyReused: the key with another body, carrying the recorded action", async () => {
    const run = await newRun();
    const first = await run.propose("emails.send", { to: "bo@example.com" }, "mail-2");
    const err = await run.propose("emails.send", { to: "someone@example.com" }, "mail-2").catch((e: unknown) => e);
    assert.ok(err instanceof StepKeyReused, String(err));
    assert.equal(err.status, 422);
    assert.equal(err.action?.id, first.id);
  });

  it("OK: call with the key of a finished step does not call again", async () => {
    const run = await newRun();
    let calls = 0;
    const fn = async () => {
      calls++;
      return { sent: true };
    };
    const first = await run.call("emails.send", { to: "cy@example.com" }, { stepKey: "mail-3" }, fn);
    const again = await run.call("emails.send", { to: "cy@example.com" }, { stepKey: "mail-3" }, fn);
    assert.equal(calls, 1);
    assert.equal(again.replayed, true);
    assert.equal(again.action.id, first.action.id);
    assert.equal(again.action.state, "succeeded");
  });

  it("ToolNotAllowed or UnknownTool: a step naming a tool outside the agent's list", async () => {
    const run = await newRun();
    const err = await run.propose("cards.write", {}, "cards").catch((e: unknown) => e);
    assert.ok(err instanceof ToolNotAllowed || err instanceof UnknownTool, String(err));
  });
});

describe("a write whose call throws", () => {
  it("OK: reported failed with effect unknown, never not_happened; the error is thrown on", async () => {
    const run = await newRun();
    const boom = new Error("connection reset mid-call");
    const err = await run
      .call("orders.place", { sku: "a1" }, { stepKey: "order-throws" }, async () => {
        throw boom;
      })
      .catch((e: unknown) => e);
    assert.equal(err, boom);
    const action = (await run.get()).actions.find((a) => a.tool === "orders.place")!;
    assert.equal(action.attempts[0]?.status, "failed");
    assert.equal(action.attempts[0]?.effect, "unknown");
    assert.notEqual(action.state, "failed");
    const next = await run.next();
    assert.deepEqual(next.directives.map((d) => d.directive), ["query"]);
  });
});

/** Proposes and begins a call, then forgets it: the agent's process died mid-call. */
async function crashMidCall(run: Run, tool: string, args: JSONValue, stepKey: string): Promise<{ actionId: string; dedupKey: string }> {
  const action = await run.propose(tool, args, stepKey);
  assert.equal(action.state, "approved");
  const begun = await agent.beginAttempt(action.id, `begin:${stepKey}`);
  return { actionId: action.id, dedupKey: begun.dedup_key };
}

describe("resume after a crash", () => {
  it("OK: a tool that can be queried is asked, and its answer reconciles the action", async () => {
    const run = await newRun();
    const lost = await crashMidCall(run, "orders.place", { sku: "b2" }, "order-crash");
    const restarted = new Client({ baseUrl: server.url, token: server.tokens.agent }).run(run.id);
    const asked: string[] = [];
    const next = await restarted.resume({
      "orders.place": {
        query: (dedupKey) => {
          asked.push(dedupKey);
          return { effect: "happened", detail: { order: "ord_1" } };
        },
        execute: () => {
          throw new Error("must not run again");
        },
      },
    });
    assert.deepEqual(asked, [lost.dedupKey]);
    assert.deepEqual(next.directives.map((d) => d.directive), ["propose"]);
    const action = await agent.getAction(lost.actionId);
    assert.equal(action.state, "succeeded");
  });

  it("OK: a dedup tool gets its call again, with the same dedup key", async () => {
    const run = await newRun();
    const lost = await crashMidCall(run, "emails.send", { to: "di@example.com" }, "mail-crash");
    const restarted = new Client({ baseUrl: server.url, token: server.tokens.agent }).run(run.id);
    const sent: string[] = [];
    const next = await restarted.resume({
      "emails.send": {
        execute: (call) => {
          sent.push(call.dedupKey);
          assert.deepEqual(call.arguments, { to: "di@example.com" });
          return { message_id: "m1" };
        },
      },
    });
    assert.deepEqual(sent, [lost.dedupKey]);
    assert.deepEqual(next.directives.map((d) => d.directive), ["propose"]);
    const action = await agent.getAction(lost.actionId);
    assert.equal(action.state, "succeeded");
    assert.equal(action.attempts.length, 2);
  });

  it("OK: a tool with no guarantees goes to a person; nothing is called", async () => {
    const run = await newRun();
    const lost = await crashMidCall(run, "files.delete", { path: "/tmp/x" }, "delete-crash");
    const restarted = new Client({ baseUrl: server.url, token: server.tokens.agent }).run(run.id);
    const next = await restarted.resume({
      "files.delete": {
        query: () => {
          throw new Error("must not be asked");
        },
        execute: () => {
          throw new Error("must not run again");
        },
      },
    });
    assert.deepEqual(next.directives.map((d) => d.directive), ["review"]);
    const action = await agent.getAction(lost.actionId);
    assert.equal(action.state, "needs_review");
  });

  it("NeedsRecovery: call with the step key of a call in doubt refuses to run it blind", async () => {
    const run = await newRun();
    await crashMidCall(run, "files.delete", { path: "/tmp/y" }, "delete-doubt");
    let calls = 0;
    const err = await run
      .call("files.delete", { path: "/tmp/y" }, { stepKey: "delete-doubt" }, () => {
        calls++;
      })
      .catch((e: unknown) => e);
    assert.ok(err instanceof NeedsRecovery, String(err));
    assert.equal(err.code, "needs_recovery");
    assert.equal(calls, 0);
  });
});

describe("heartbeats", () => {
  it("OK: a call longer than three leases stays alive and completes", async () => {
    const run = await newRun();
    let beats = 0;
    const res = await run.call("uploads.put", { file: "big.bin" }, { stepKey: "upload-1" }, async (call) => {
      await sleep(3500);
      beats = call.heartbeats;
      assert.equal(call.leaseLost, false);
      assert.equal(call.cancelRequested, false);
      return { uploaded: true };
    });
    assert.ok(beats >= 3, `only ${beats} heartbeats`);
    assert.equal(res.action.state, "succeeded");
    assert.equal(res.attempt?.status, "succeeded");
  });
});

describe("cancellation", () => {
  it("OK: a heartbeat brings the run's cancel; call.signal aborts and the call reports it", async () => {
    const run = await newRun();
    let sawCancel = false;
    const res = await run.call("uploads.put", { file: "other.bin" }, { stepKey: "upload-cancel", heartbeatIntervalMs: 100 }, async (call) => {
      await run.cancel("changed my mind");
      await new Promise<void>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error("no cancel within 10 s")), 10_000);
        call.signal.addEventListener("abort", () => {
          clearTimeout(t);
          resolve();
        });
      });
      sawCancel = call.cancelRequested;
      call.cancelled({ effect: "not_happened" });
    });
    assert.equal(sawCancel, true);
    assert.equal(res.attempt?.status, "cancelled");
    assert.equal(res.attempt?.effect, "not_happened");
  });
});

describe("events", () => {
  it("OK: the stream delivers the run's events up to its end, and resumes after Last-Event-ID", async () => {
    const run = await newRun();
    const live: RunEvent[] = [];
    const reading = (async () => {
      for await (const e of run.events()) live.push(e);
    })();
    await run.call("notes.read", { id: "n2" }, { stepKey: "read-sse" }, () => ({ text: "x" }));
    await run.finish("completed", { output: { done: true } });
    await reading;
    assert.ok(live.length >= 4, `only ${live.length} events`);
    const seqs = live.map((e) => Number(e.id));
    assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
    assert.equal(new Set(seqs).size, seqs.length);
    assert.ok(live.some((e) => e.type.startsWith("action.")));
    const lastEvent = live[live.length - 1]!;
    assert.equal(lastEvent.data.entity_type, "run");
    assert.equal(lastEvent.data.to_state, "completed");
    assert.equal(lastEvent.data.seq, Number(lastEvent.id));

    const from = live[1]!.id;
    const rest: RunEvent[] = [];
    for await (const e of run.events({ lastEventId: from })) rest.push(e);
    assert.deepEqual(
      rest.map((e) => e.id),
      live.slice(2).map((e) => e.id),
    );
  });
});
