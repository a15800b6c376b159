import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Client, parseSSE, errorFromProblem, StepKeyReused, LedgerError, NotFound, beginKey, type RunEvent } from "../index.js";

function streamOf(...chunks: string[]): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(ctl) {
      for (const c of chunks) ctl.enqueue(enc.encode(c));
      ctl.close();
    },
  });
}

async function collect(body: ReadableStream<Uint8Array>) {
  const out = [];
  for await (const m of parseSSE(body)) out.push(m);
  return out;
}

describe("parseSSE", () => {
  it("OK: events split across chunks, CRLF and LF, comments, multi-line data", async () => {
    const got = await collect(
      streamOf(": hello\n\nid: 1\nevent: run.run", "ning\ndata: {\"a\":\r\ndata: 1}\r\n\r", "\nid: 2\ndata: x\n\n", "data: cut"),
    );
    assert.deepEqual(got, [
      { id: "1", event: "run.running", data: '{"a":\n1}' },
      { id: "2", event: "message", data: "x" },
    ]);
  });

  it("OK: an event without an id keeps the last id; one without data is not dispatched", async () => {
    const got = await collect(streamOf("id: 7\nevent: a\n\nevent: b\ndata:y\n\n"));
    assert.deepEqual(got, [{ id: "7", event: "b", data: "y" }]);
  });
});

describe("errorFromProblem", () => {
  it("OK: the class its code names, with the extension members", () => {
    const err = errorFromProblem({
      status: 422,
      code: "step_key_reused",
      detail: "used for another body",
      instance: "urn:request:r1",
      action: { id: "act_1" } as never,
    });
    assert.ok(err instanceof StepKeyReused);
    assert.ok(err instanceof LedgerError);
    assert.equal(err.status, 422);
    assert.equal(err.code, "step_key_reused");
    assert.equal(err.detail, "used for another body");
    assert.equal(err.instance, "urn:request:r1");
    assert.equal(err.action?.id, "act_1");
  });

  it("OK: an unknown code falls back on its status", () => {
    const err = errorFromProblem({ status: 404, code: "route_not_found" });
    assert.ok(err instanceof NotFound);
    assert.equal(errorFromProblem({ status: 418, code: "teapot" }).constructor, LedgerError);
  });
});

describe("beginKey", () => {
  it("OK: the same scope and attempt, the same key; another attempt or scope, another key", () => {
    const k = beginKey("run_1\0step-1", 1);
    assert.match(k, /^begin:[0-9a-f]{40}:1$/);
    assert.equal(beginKey("run_1\0step-1", 1), k);
    assert.notEqual(beginKey("run_1\0step-1", 2), k);
    assert.notEqual(beginKey("run_1\0step-2", 1), k);
    assert.ok(beginKey("x".repeat(10_000), 1).length <= 255);
  });
});

function sse(events: Array<{ seq: number; type: string; to?: string; entity?: string }>): string {
  return events
    .map((e) => {
      const data = { seq: e.seq, type: e.type, entity_type: e.entity ?? "action", entity_id: "x", to_state: e.to, created_at: "", hash: "" };
      return `id: ${e.seq}\nevent: ${e.type}\ndata: ${JSON.stringify(data)}\n\n`;
    })
    .join("");
}

describe("run.events", () => {
  it("OK: a stream that breaks mid-way is reopened after the last event seen, until the run's end", async () => {
    const asked: Array<string | null> = [];
    const fake = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
      const url = new URL(String(input));
      if (url.pathname === "/v1/runs/run_1") {
        return new Response(JSON.stringify({ id: "run_1", state: "running" }), { headers: { "Content-Type": "application/json" } });
      }
      const last = new Headers(init?.headers).get("Last-Event-ID");
      asked.push(last);
      const enc = new TextEncoder();
      if (last === null) {
        // Two events, then the connection breaks.
        let pulls = 0;
        const body = new ReadableStream<Uint8Array>({
          pull(ctl) {
            if (pulls++ === 0) ctl.enqueue(enc.encode(sse([{ seq: 1, type: "run.running", entity: "run", to: "running" }, { seq: 2, type: "action.approved" }])));
            else ctl.error(new Error("connection reset"));
          },
        });
        return new Response(body, { headers: { "Content-Type": "text/event-stream" } });
      }
      return new Response(sse([{ seq: 3, type: "action.succeeded" }, { seq: 4, type: "run.completed", entity: "run", to: "completed" }]), {
        headers: { "Content-Type": "text/event-stream" },
      });
    };
    const client = new Client({ baseUrl: "http://ledger.invalid", fetch: fake as typeof fetch });
    const got: RunEvent[] = [];
    for await (const e of client.run("run_1").events()) got.push(e);
    assert.deepEqual(got.map((e) => e.id), ["1", "2", "3", "4"]);
    assert.deepEqual(asked, [null, "2"]);
    assert.equal(got[3]?.data.to_state, "completed");
  });
});
