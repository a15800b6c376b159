// What the client sends again, and what it sends once, when an answer is
// lost: the real server (bin/ledger serve) behind a proxy of the test's own
// that fails chosen requests. It answers 502 itself, or passes the request
// on and then loses the server's answer (a 502, or the connection dropped),
// as a load balancer or a restarting server does. A complete, a heartbeat
// and a finish answer a replay the same, so the client sends them again and
// the server records each once; an abandon or an observation is sent once.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, request as httpRequest, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, beforeEach, describe, it } from "node:test";

import { AttemptClosed, Client, LedgerError, OutcomeConflict, type Action, type Begun, type Run } from "../index.js";
import { clientTool, startLedger, type LedgerServer } from "../testing/index.js";

const config = {
  schema_version: "1.0",
  tools: [clientTool("notes.read", "read", {})],
  agents: [{ name: "ts-agent", driver: "client", tools: ["notes.read"] }],
};

/** What a read's succeeded outcome records, once. */
const recordedOnce = ["attempt.succeeded", "observation.recorded", "attempt.effect_not_happened", "action.succeeded"];

/**
 * How the proxy fails a request: "502" answers 502 (not JSON) without
 * passing it on; "500" answers the server's own 500 problem without passing
 * it on (a store that failed before it wrote); "502-after" passes it on,
 * then answers 502 instead of the answer; "drop-after" passes it on, then
 * closes the connection unanswered.
 */
type Fault = "502" | "500" | "502-after" | "drop-after";

/** Hop-by-hop headers, which a proxy does not pass on. */
const hop = new Set(["connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host", "content-length"]);

/**
 * An HTTP proxy in front of upstream that fails the requests it is told to:
 * fail(route, …faults) queues faults for the next requests whose last path
 * segment is route, one a request; sent(route) counts the requests it got.
 */
class FaultyProxy {
  url = "";
  readonly #upstream: URL;
  readonly #faults = new Map<string, Fault[]>();
  readonly #sent = new Map<string, number>();
  readonly #server: Server;

  constructor(upstream: string) {
    this.#upstream = new URL(upstream);
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const route = new URL(req.url ?? "/", "http://x").pathname.replace(/\/+$/, "").split("/").pop() ?? "";
        this.#sent.set(route, (this.#sent.get(route) ?? 0) + 1);
        const fault = this.#faults.get(route)?.shift();
        if (fault === "502") {
          res.writeHead(502, { "Content-Type": "text/html" }).end("<html>502 Bad Gateway</html>");
          return;
        }
        if (fault === "500") {
          const problem = { type: "about:blank", title: "Internal error", status: 500, code: "internal", detail: "a session of the store ended" };
          res.writeHead(500, { "Content-Type": "application/problem+json" }).end(JSON.stringify(problem));
          return;
        }
        this.#forward(req.method ?? "GET", req.url ?? "/", req.headers, Buffer.concat(chunks)).then(
          ({ status, headers, body }) => {
            if (fault === "502-after") res.writeHead(502, { "Content-Type": "text/plain" }).end("bad gateway");
            else if (fault === "drop-after") res.socket?.destroy();
            else res.writeHead(status, headers).end(body);
          },
          () => res.socket?.destroy(),
        );
      });
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  fail(route: string, ...faults: Fault[]): void {
    this.#faults.set(route, [...(this.#faults.get(route) ?? []), ...faults]);
  }

  sent(route: string): number {
    return this.#sent.get(route) ?? 0;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  #forward(method: string, path: string, headers: IncomingHttpHeaders, body: Buffer): Promise<{ status: number; headers: Record<string, string>; body: Buffer }> {
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(headers)) if (!hop.has(k) && typeof v === "string") out[k] = v;
    return new Promise((resolve, reject) => {
      const req = httpRequest({ host: this.#upstream.hostname, port: this.#upstream.port, method, path, headers: out }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const h: Record<string, string> = {};
          for (const [k, v] of Object.entries(res.headers)) if (!hop.has(k) && typeof v === "string") h[k] = v;
          resolve({ status: res.statusCode ?? 502, headers: h, body: Buffer.concat(chunks) });
        });
        res.on("error", reject);
      });
      req.on("error", reject);
      req.end(body);
    });
  }
}

let server: LedgerServer;
let proxy: FaultyProxy;
let agent: Client; // through the proxy
let direct: Client; // to the server itself
let auditor: Client;

before(async () => {
  server = await startLedger({
    config,
    tokens: {
      agent: { principal: "ts-agent-bot", tenant: "acme", roles: ["agent"], agents: ["ts-agent"] },
      auditor: { principal: "audrey", tenant: "acme", roles: ["auditor"] },
    },
  });
  direct = new Client({ baseUrl: server.url, token: server.tokens.agent });
  auditor = new Client({ baseUrl: server.url, token: server.tokens.auditor });
});

after(async () => {
  await server?.stop();
});

beforeEach(async () => {
  await proxy?.stop();
  proxy = await new FaultyProxy(server.url).start();
  agent = new Client({ baseUrl: proxy.url, token: server.tokens.agent, retries: 3 });
});

after(async () => {
  await proxy?.stop();
});

/** A run of the tests' agent, its first action (a read: approved at once) and an attempt begun on it. */
async function begun(label: string): Promise<{ run: Run; action: Action; att: Begun }> {
  const run = await agent.startRun("ts-agent", { task: label }, `${label}-${randomUUID()}`);
  const action = await run.propose("notes.read", { text: label }, `${label}-1`);
  assert.equal(action.state, "approved");
  const att = await agent.beginAttempt(action.id, `${label}-begin-${randomUUID()}`);
  return { run, action, att };
}

/** The types of the run's events since its first attempt started: what completing it recorded. */
async function completions(runId: string): Promise<string[]> {
  const res = await auditor.request<{ events: Array<{ type: string }> }>("GET", `/v1/runs/${runId}/timeline`);
  const types = res.body.events.map((e) => e.type);
  return types.slice(types.indexOf("attempt.started") + 1);
}

describe("requests the server answers the same when they come again", () => {
  it("OK: a complete whose answer was lost is sent again and recorded once", async () => {
    // The server records the outcome, the answer is lost twice over; the
    // third answer is the replay's, the same 200.
    proxy.fail("complete", "502-after", "drop-after");
    const run = await agent.startRun("ts-agent", { task: "lost" }, `lost-${randomUUID()}`);
    const res = await run.call("notes.read", { text: "hello" }, { stepKey: "read-1" }, async () => ({ text: "hello" }));
    assert.equal(proxy.sent("complete"), 3);
    assert.equal(res.action.state, "succeeded");
    assert.equal(res.attempt?.status, "succeeded");
    const stored = await direct.getAction(res.action.id);
    assert.deepEqual(stored.attempts.map((a) => a.status), ["succeeded"]);
    assert.deepEqual(await completions(run.id), recordedOnce);
  });

  it("OK: a complete the server failed (500) or a proxy refused (502) is sent again", async () => {
    const { run, att } = await begun("failed");
    proxy.fail("complete", "500", "502");
    const done = await agent.complete(att.attempt.id, att.attempt_token, { status: "succeeded", output: { ok: true } });
    assert.equal(proxy.sent("complete"), 3);
    assert.equal(done.action.state, "succeeded");
    assert.deepEqual(await completions(run.id), recordedOnce);
  });

  it("OK: a heartbeat and a finish are sent again", async () => {
    const { run, att } = await begun("beat");
    proxy.fail("heartbeat", "502", "drop-after");
    const hb = await agent.heartbeat(att.attempt.id, att.attempt_token, { step: 1 });
    assert.ok(hb.lease_remaining_s > 0);
    assert.equal(proxy.sent("heartbeat"), 3);
    await agent.complete(att.attempt.id, att.attempt_token, { status: "succeeded", output: { ok: true } });

    proxy.fail("finish", "502-after");
    const view = await run.finish("completed", { output: { done: true } });
    assert.equal(view.state, "completed");
    assert.equal(proxy.sent("finish"), 2);
  });

  it("ServerError: the retries give up", async () => {
    const { att } = await begun("give-up");
    proxy.fail("complete", "502", "502", "502", "502");
    await assert.rejects(agent.complete(att.attempt.id, att.attempt_token, { status: "succeeded" }), (err: unknown) => {
      assert.ok(err instanceof LedgerError);
      assert.equal(err.status, 502);
      return true;
    });
    assert.equal(proxy.sent("complete"), 4);
  });
});

describe("requests sent once", () => {
  it("OutcomeConflict and AttemptClosed: a refusal is not sent again", async () => {
    const { run, att } = await begun("conflict");
    await agent.complete(att.attempt.id, att.attempt_token, { status: "succeeded", output: { ok: true } });
    await assert.rejects(
      agent.complete(att.attempt.id, att.attempt_token, { status: "failed", error: { code: "x", message: "no" } }),
      OutcomeConflict,
    );
    assert.equal(proxy.sent("complete"), 2);

    const action = await run.propose("notes.read", { text: "again" }, "conflict-2");
    const att2 = await agent.beginAttempt(action.id, `conflict-begin-2-${randomUUID()}`);
    await direct.abandon(att2.attempt.id, "lost it");
    await assert.rejects(agent.complete(att2.attempt.id, att2.attempt_token, { status: "succeeded" }), AttemptClosed);
    assert.equal(proxy.sent("complete"), 3);
  });

  it("ServerError: an abandon and an observation are sent once", async () => {
    const { action, att } = await begun("once");
    proxy.fail("abandon", "502");
    await assert.rejects(agent.abandon(att.attempt.id, "lost it"), (err: unknown) => err instanceof LedgerError && err.status === 502);
    assert.equal(proxy.sent("abandon"), 1);
    assert.equal((await direct.getAction(action.id)).state, "running", "the abandon never arrived");

    proxy.fail("observations", "502");
    await assert.rejects(
      agent.observe(att.attempt.id, { decision_id: "dec_x", kind: "query", effect: "happened" }),
      (err: unknown) => err instanceof LedgerError && err.status === 502,
    );
    assert.equal(proxy.sent("observations"), 1);
  });
});
