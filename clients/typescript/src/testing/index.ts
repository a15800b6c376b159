// Test support: a real `ledger serve` on a free loopback port, over a fresh
// database, with an operator config file and a tokens file made by
// `ledger token new`. Used by this package's tests and the example agent's.

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** A token to make: its principal, tenant, roles and (role agent) the agents it drives. */
export interface TokenSpec {
  principal: string;
  tenant: string;
  roles: string[];
  agents?: string[];
}

/** What startLedger starts. */
export interface LedgerOptions {
  /** The operator config file's content (written as JSON). */
  config: unknown;
  /** The tokens to make, by the name the test calls them. */
  tokens: Record<string, TokenSpec>;
  /** The binary (default: $LEDGER_BIN, else bin/ledger of the repository). */
  bin?: string;
  /** More flags for serve. */
  args?: string[];
}

/** A running ledger server. */
export interface LedgerServer {
  /** Its address, e.g. http://127.0.0.1:41234. */
  url: string;
  /** The tokens made, by name. */
  tokens: Record<string, string>;
  /** The directory of its database, config and tokens (removed by stop). */
  dir: string;
  /** The binary. */
  bin: string;
  /** The server's log lines so far (JSON). */
  logs(): string[];
  /** Stops it (SIGTERM, then SIGKILL) and removes its directory. */
  stop(): Promise<void>;
}

/** The repository's root: the nearest directory up from here with the ledger's go.mod. */
export function repoRoot(from: string = dirname(fileURLToPath(import.meta.url))): string {
  let dir = resolve(from);
  for (;;) {
    const mod = join(dir, "go.mod");
    if (existsSync(mod) && readFileSync(mod, "utf8").includes("module github.com/actionledger/ledger")) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error(`no ledger repository above ${from}`);
    dir = up;
  }
}

/** The ledger binary the tests run: $LEDGER_BIN, else bin/ledger (make build). */
export function ledgerBin(): string {
  const bin = process.env.LEDGER_BIN || join(repoRoot(), "bin", "ledger");
  if (!existsSync(bin)) throw new Error(`${bin} does not exist: run \`make build\` first (or set LEDGER_BIN)`);
  return bin;
}

/** Makes a token with `ledger token new` and adds it to the tokens file. */
export async function makeToken(bin: string, tokensFile: string, spec: TokenSpec): Promise<string> {
  const args = ["token", "new", "--principal", spec.principal, "--tenant", spec.tenant, "--add-to", tokensFile, "--json"];
  for (const r of spec.roles) args.push("--role", r);
  for (const a of spec.agents ?? []) args.push("--agent", a);
  const { stdout } = await run(bin, args);
  const { token } = JSON.parse(stdout) as { token: string };
  return token;
}

/** Starts `ledger serve` on 127.0.0.1:0 and waits for its "listening on" line. */
export async function startLedger(options: LedgerOptions): Promise<LedgerServer> {
  const bin = options.bin ?? ledgerBin();
  const dir = mkdtempSync(join(tmpdir(), "ledger-ts-"));
  const configFile = join(dir, "config.json");
  const tokensFile = join(dir, "tokens.json");
  writeFileSync(configFile, JSON.stringify(options.config, null, 2));
  const tokens: Record<string, string> = {};
  for (const [name, spec] of Object.entries(options.tokens)) tokens[name] = await makeToken(bin, tokensFile, spec);

  const args = [
    "serve",
    "--db", join(dir, "ledger.db"),
    "--addr", "127.0.0.1:0",
    "--tokens", tokensFile,
    "--config", configFile,
    "--log-format", "json",
    "--rate-limit", "0",
    ...(options.args ?? []),
  ];
  const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
  const lines: string[] = [];
  const url = await new Promise<string>((resolveUrl, reject) => {
    const timer = setTimeout(() => fail(new Error("ledger serve did not say where it listens within 20 s")), 20_000);
    const fail = (err: Error) => {
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(new Error(`${err.message}\n${lines.join("\n")}`));
    };
    createInterface({ input: child.stderr! }).on("line", (line) => {
      lines.push(line);
      try {
        const rec = JSON.parse(line) as { msg?: string; url?: string };
        if (rec.url && rec.msg?.startsWith("listening on")) {
          clearTimeout(timer);
          resolveUrl(rec.url);
        }
      } catch {
        // Not a JSON line: kept in the logs.
      }
    });
    child.once("exit", (code, signal) => fail(new Error(`ledger serve exited (${code ?? signal}) before listening`)));
    child.once("error", (err) => fail(err));
  });
  return {
    url,
    tokens,
    dir,
    bin,
    logs: () => [...lines],
    stop: async () => {
      await stopChild(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Stops a child: SIGTERM, and SIGKILL if it has not exited within 10 s. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((res) => child.once("exit", () => res()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

/** A tool of the config file, executed by the client (the agent). */
export function clientTool(
  name: string,
  effect: "read" | "write",
  guarantees: { query?: boolean; dedup?: boolean; cancel?: boolean },
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    name,
    version: "1",
    effect,
    executor: "client",
    arguments_schema: { type: "object" },
    guarantees: { query: false, dedup: false, cancel: false, ...guarantees },
    timeout_ms: 30_000,
    ...extra,
  };
}

/** Resolves after ms milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** What an approver decides about the pending approvals it finds. */
export type Verdict = "approve" | "deny";

/**
 * Acts as a person with the approver's client: waits until the run has a
 * pending approval (polling GET /v1/approvals), and approves or denies it
 * for the digest it shows. Returns the action id decided.
 */
export async function decidePending(
  approver: {
    listApprovals(o?: { state?: string; limit?: number; cursor?: string }): Promise<{ approvals: Array<{ run_id: string; action_id: string; action_digest: string }>; next_cursor?: string }>;
    approve(actionId: string, digest: string, reason?: string): Promise<unknown>;
    deny(actionId: string, digest: string, reason?: string): Promise<unknown>;
  },
  runId: string,
  verdict: Verdict,
  timeoutMs = 15_000,
): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    let cursor: string | undefined;
    do {
      const page = await approver.listApprovals({ state: "pending", limit: 200, cursor });
      const mine = page.approvals.find((a) => a.run_id === runId);
      if (mine) {
        if (verdict === "approve") await approver.approve(mine.action_id, mine.action_digest, "looks right");
        else await approver.deny(mine.action_id, mine.action_digest, "not today");
        return mine.action_id;
      }
      cursor = page.next_cursor;
    } while (cursor);
    await sleep(50);
  }
  throw new Error(`no pending approval of ${runId} within ${timeoutMs} ms`);
}
