#!/usr/bin/env node
// A small agent of its own: it sends one reminder to each of a few contacts,
// and puts every tool call through the ledger. The ledger decides (a person
// approves each reminder), records each attempt before the call, and after
// a crash tells the agent what is safe to do; the reminder tool keeps its
// effects in its own file (effects.ts), so it can answer the ledger's query
// and never sends one reminder twice.
//
//   node dist/agent.js --ledger http://127.0.0.1:8080 --token lgr_… --task demo-1
//
// Run it again with the same --task after a crash (or at any time): it
// picks up the same run, settles what the last process left, and sends only
// the reminders not sent yet.

import { parseArgs } from "node:util";

import { Client, Denied, NeedsRecovery, type Call, type Run, type ToolHandler } from "@actionledger/ledger-client";

import { EffectStore } from "./effects.js";

const usage = `usage: node dist/agent.js --ledger URL --token TOKEN [--task ID] [--agent NAME]
                         [--contacts a,b,c] [--effects FILE]

  --ledger    the ledger server (env LEDGER_SERVER)
  --token     a token of role agent bound to the agent (env LEDGER_TOKEN)
  --task      names the run: the same task is the same run, resumed (default reminders-demo)
  --agent     the client agent declared in the server's config (default reminder-agent)
  --contacts  who gets a reminder (default ada,grace,alan)
  --effects   the reminder tool's own record, JSON lines (default reminders.jsonl)`;

/** Exit statuses. */
const exitDone = 0;
const exitFailed = 1;
const exitUsage = 2;
const exitNeedsPerson = 3;

interface Options {
  ledger: string;
  token: string | undefined;
  task: string;
  agent: string;
  contacts: string[];
  effects: string;
}

function options(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      ledger: { type: "string" },
      token: { type: "string" },
      task: { type: "string", default: "reminders-demo" },
      agent: { type: "string", default: "reminder-agent" },
      contacts: { type: "string", default: "ada,grace,alan" },
      effects: { type: "string", default: "reminders.jsonl" },
      help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    console.log(usage);
    process.exit(exitDone);
  }
  const ledger = values.ledger ?? process.env.LEDGER_SERVER;
  if (!ledger) throw new UsageError("--ledger (or LEDGER_SERVER) is required");
  const contacts = values.contacts!.split(",").map((c) => c.trim()).filter((c) => c !== "");
  if (contacts.length === 0) throw new UsageError("--contacts names nobody");
  return {
    ledger,
    token: values.token ?? process.env.LEDGER_TOKEN,
    task: values.task!,
    agent: values.agent!,
    contacts,
    effects: values.effects!,
  };
}

class UsageError extends Error {}

function log(msg: string): void {
  console.log(`[agent] ${msg}`);
}

/**
 * The test's crash hook: AGENT_CRASH_AFTER_EFFECTS=N makes the process die
 * (exit 137, nothing reported) right after its Nth reminder is on disk —
 * the worst moment: the effect happened, the ledger does not know it.
 */
let effectsThisProcess = 0;
function maybeCrash(): void {
  const n = Number(process.env.AGENT_CRASH_AFTER_EFFECTS ?? 0);
  if (n > 0 && ++effectsThisProcess >= n) {
    log(`crashing on purpose after ${effectsThisProcess} reminder(s) (AGENT_CRASH_AFTER_EFFECTS)`);
    process.exit(137);
  }
}

/** The reminder tool: applies a reminder once per dedup key, in its own file. */
function reminderTool(store: EffectStore): ToolHandler {
  return {
    // After a crash: did the call under this dedup key take effect?
    query: (dedupKey) => {
      const e = store.get(dedupKey);
      return e ? { effect: "happened", detail: { reminder_id: e.reminder_id } } : "not_happened";
    },
    execute: (call: Call) => send(store, call),
  };
}

function send(store: EffectStore, call: Call) {
  const args = call.arguments as { to: string; text: string };
  const { effect, applied } = store.apply({
    dedup_key: call.dedupKey,
    to: args.to,
    text: args.text,
    reminder_id: `rem_${effectsThisProcess + 1}_${Date.now().toString(36)}`,
    sent_at: new Date().toISOString(),
  });
  log(applied ? `sent reminder to ${args.to}` : `reminder to ${args.to} was already sent (dedup key ${call.dedupKey})`);
  if (applied) maybeCrash();
  return { reminder_id: effect.reminder_id };
}

async function main(o: Options): Promise<number> {
  const client = new Client({ baseUrl: o.ledger, token: o.token });
  const store = new EffectStore(o.effects);
  const tools = { "reminders.send": reminderTool(store) };

  // The task's key makes the submission idempotent: a restarted agent gets
  // the same run back.
  const run: Run = await client.startRun(o.agent, { task: o.task, contacts: o.contacts }, `task:${o.task}`);
  log(`run ${run.id}`);

  // Settle whatever a previous process left open (nothing, on a fresh run).
  const next = await run.resume(tools, {
    onDirective: (d) => log(`settling ${d.action_id} (${d.tool}): ${d.directive} — ${d.rationale ?? ""}`),
  });
  if (["completed", "stopped", "failed"].includes(next.run_state)) {
    log(`run already ${next.run_state}`);
    return exitDone;
  }
  if (next.directives.some((d) => d.directive === "review")) {
    log("a person must settle an action first: see `ledger runs show " + run.id + "`");
    return exitNeedsPerson;
  }

  // A read: who gets a reminder. Reads are safe to repeat, so each process
  // reads afresh under its own step key.
  const read = await run.call("contacts.list", { group: "team" }, { stepKey: `contacts:${process.pid}:${Date.now()}` }, () => ({
    contacts: o.contacts,
  }));
  const contacts = (read.value as { contacts: string[] }).contacts;

  let sent = 0;
  for (const to of contacts) {
    try {
      const res = await run.call(
        "reminders.send",
        { to, text: `Hi ${to}, the review is at 3pm.` },
        {
          stepKey: `remind:${to}`,
          onWait: (a) => log(`reminder to ${to} waits for approval: ledger approvals list; ledger approve ${a.id} --digest ${a.action_digest}`),
        },
        (call) => send(store, call),
      );
      if (res.replayed) log(`reminder to ${to}: done before (${res.action.state})`);
      if (res.action.state === "succeeded") sent++;
    } catch (err) {
      if (err instanceof Denied) {
        log(`reminder to ${to} was denied: skipped`);
        continue;
      }
      if (err instanceof NeedsRecovery) {
        log(`reminder to ${to} is ${err.action?.state}: run the agent again, or a person settles it`);
        return exitNeedsPerson;
      }
      throw err;
    }
  }
  const done = await run.finish("completed", { output: { reminders_sent: sent, contacts: contacts.length } });
  log(`run ${run.id} ${done.state}: ${sent} of ${contacts.length} reminders sent`);
  return exitDone;
}

let opts: Options;
try {
  opts = options(process.argv.slice(2));
} catch (err) {
  console.error(`${err instanceof Error ? err.message : String(err)}\n${usage}`);
  process.exit(exitUsage);
}
main(opts).then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(`[agent] ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
    process.exit(exitFailed);
  },
);
