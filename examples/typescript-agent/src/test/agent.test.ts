// The example agent against the real binary, with the config file it ships:
// a person (the approver's token) approves each reminder; the agent crashes
// right after a reminder is on disk and before the ledger hears of it; run
// again, it settles that call by asking its tool, sends the rest, and every
// action has exactly one effect.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, it } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "@actionledger/ledger-client";
import { sleep, startLedger, type LedgerServer } from "@actionledger/ledger-client/testing";

import { EffectStore } from "../effects.js";

const here = dirname(fileURLToPath(import.meta.url));
const agentJs = join(here, "..", "agent.js");
const config = JSON.parse(readFileSync(join(here, "..", "..", "ledger.config.json"), "utf8")) as unknown;

let server: LedgerServer;
let approver: Client;

before(async () => {
  server = await startLedger({
    config,
    tokens: {
      agent: { principal: "reminder-bot", tenant: "acme", roles: ["agent"], agents: ["reminder-agent"] },
      approver: { principal: "alice", tenant: "acme", roles: ["approver"] },
    },
  });
  approver = new Client({ baseUrl: server.url, token: server.tokens.approver });
});

after(async () => {
  await server?.stop();
});

/** Runs the agent to its exit, approving every pending approval meanwhile. */
async function runAgent(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; out: string }> {
  const child = spawn(process.execPath, [agentJs, "--ledger", server.url, ...args], {
    env: { ...process.env, LEDGER_TOKEN: server.tokens.agent, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (b: Buffer) => (out += b.toString()));
  child.stderr.on("data", (b: Buffer) => (out += b.toString()));
  const exited = new Promise<number | null>((res) => child.once("exit", (code) => res(code)));
  let running = true;
  const approving = (async () => {
    while (running) {
      const { approvals } = await approver.listApprovals({ state: "pending" });
      for (const a of approvals) await approver.approve(a.action_id, a.action_digest, "fine").catch(() => undefined);
      await sleep(50);
    }
  })();
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  const code = await exited;
  clearTimeout(timer);
  running = false;
  await approving;
  return { code, out };
}

it("OK: one effect per action, across a crash between the effect and its report", async () => {
  const effects = join(server.dir, "reminders.jsonl");
  const args = ["--task", "crash-1", "--contacts", "ada,grace,alan", "--effects", effects];

  const first = await runAgent(args, { AGENT_CRASH_AFTER_EFFECTS: "2" });
  assert.equal(first.code, 137, first.out);
  assert.equal(new EffectStore(effects).all().size, 2, first.out);

  const second = await runAgent(args);
  assert.equal(second.code, 0, second.out);
  // The restarted agent abandoned the call it lost and answered the query by its own record.
  assert.match(second.out, /: in_flight/, second.out);
  assert.match(second.out, /: query/, second.out);
  const third = await runAgent(args);
  assert.equal(third.code, 0, third.out);
  assert.match(third.out, /already completed/);

  const runId = /run (run_\S+)/.exec(first.out)?.[1];
  assert.ok(runId, first.out);
  const run = await approver.getRun(runId);
  assert.equal(run.state, "completed");
  const sends = run.actions.filter((a) => a.tool === "reminders.send");
  assert.equal(sends.length, 3);
  for (const a of sends) assert.equal(a.state, "succeeded", `${a.id} is ${a.state}`);

  // The tool's own record: one line per action, under the action's dedup key.
  const lines = readFileSync(effects, "utf8").trim().split("\n");
  assert.equal(lines.length, 3, lines.join("\n"));
  const byKey = new EffectStore(effects).all();
  assert.deepEqual([...byKey.keys()].sort(), sends.map((a) => a.dedup_key).sort());
  assert.deepEqual([...byKey.values()].map((e) => e.to).sort(), ["ada", "alan", "grace"]);
});

it("Usage: no --ledger is exit status 2", async () => {
  const child = spawn(process.execPath, [agentJs], { env: { ...process.env, LEDGER_SERVER: "" }, stdio: "ignore" });
  const code = await new Promise<number | null>((res) => child.once("exit", (c) => res(c)));
  assert.equal(code, 2);
});
