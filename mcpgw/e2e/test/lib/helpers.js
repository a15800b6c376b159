// Shared parts of the end-to-end tests: a temp directory with a config whose
// mcp section puts upstreams behind the gateway, the ledger binary run as
// real processes (ledger serve, ledger mcp, the simulator's upstream), and
// the approval a person gives through ledger serve's API.
import { spawn, execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import assert from 'node:assert/strict';

const run = promisify(execFile);

/** The ledger binary under test: $LEDGER_BIN, else bin/ledger of the repository. */
export const LEDGER_BIN =
  process.env.LEDGER_BIN || join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..', 'bin', 'ledger');

/** server-everything's entry point, installed by npm ci from the lock file. */
export const EVERYTHING = join(
  dirname(fileURLToPath(import.meta.url)),
  '..',
  '..',
  'node_modules',
  '@modelcontextprotocol',
  'server-everything',
  'dist',
  'index.js',
);

/** The _meta keys of the gateway's answers. */
export const META = {
  run: 'io.actionledger/run',
  action: 'io.actionledger/action',
  state: 'io.actionledger/state',
  digest: 'io.actionledger/digest',
  attempt: 'io.actionledger/attempt_id',
  replayed: 'io.actionledger/replayed',
};

/** The arguments of a cards_write call. */
export const WRITE_ARGS = { title: 'Go', cards: [{ front: 'chan', back: 'a pipe' }] };

const cleanups = new WeakMap();

/**
 * Runs fn when test t ends, after every function deferred later (last in,
 * first out: a client closes before the server it talks to stops, and the
 * directory goes last). node:test runs its own after hooks in the order
 * they were added.
 */
export function defer(t, fn) {
  let stack = cleanups.get(t);
  if (!stack) {
    stack = [];
    cleanups.set(t, stack);
    t.after(async () => {
      const errors = [];
      while (stack.length > 0) {
        const fn = stack.pop();
        try {
          await fn();
        } catch (err) {
          errors.push(err);
        }
      }
      if (errors.length > 0) throw errors[0];
    });
  }
  stack.push(fn);
}

/** An environment without the LEDGER_ variables of whoever runs the tests. */
export function cleanEnv(extra = {}) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith('LEDGER_')) env[k] = v;
  }
  return { ...env, ...extra };
}

/** Runs the ledger binary to completion; rejects with its stderr on a non-zero exit. */
export async function ledger(...args) {
  try {
    const { stdout } = await run(LEDGER_BIN, args, { env: cleanEnv(), maxBuffer: 16 << 20 });
    return stdout;
  } catch (err) {
    throw new Error(`ledger ${args.join(' ')}: ${err.message}\n${err.stderr ?? ''}`);
  }
}

/**
 * A directory with a ledger config (the simulator's MCP upstream "cards",
 * and server-everything as "everything" when asked), its database, the
 * upstream's effect store, and the tools confirmed in the lock file.
 */
export async function setup(t, { wait = '2s', everything = false } = {}) {
  const dir = await mkdtemp(join(tmpdir(), 'ledger-mcp-e2e-'));
  defer(t, () => rm(dir, { recursive: true, force: true }));
  const s = {
    dir,
    config: join(dir, 'ledger.yaml'),
    db: join(dir, 'ledger.db'),
    effects: join(dir, 'upstream.effects.db'),
    tokens: join(dir, 'tokens.json'),
  };
  let cfg = `schema_version: "1.0"
mcp:
  approval_wait: ${wait}
  upstreams:
    - name: cards
      command: [${JSON.stringify(LEDGER_BIN)}, simulator, mcp-upstream, --store, ${JSON.stringify(s.effects)}]
      tools:
        cards_write:
          effect: write
          guarantees: {query: true}
          query: {tool: cards_status}
        cards_count: {effect: read}
`;
  if (everything) {
    cfg += `    - name: everything
      command: [${JSON.stringify(process.execPath)}, ${JSON.stringify(EVERYTHING)}, stdio]
      tools:
        echo: {effect: read}
        get-sum: {effect: read}
`;
  }
  await writeFile(s.config, cfg);
  const names = ['cards__cards_write', 'cards__cards_count'];
  if (everything) names.push('everything__echo', 'everything__get-sum');
  const out = await ledger('mcp', 'tools', 'confirm', '--config', s.config, ...names);
  assert.match(out, new RegExp(`${names.length} tools confirmed`));
  return s;
}

/** Makes a token with `ledger token new … --add-to` the setup's tokens file; returns the token. */
export async function newToken(s, { principal, tenant = 'default', role, agent }) {
  const args = ['token', 'new', '--principal', principal, '--tenant', tenant, '--role', role, '--add-to', s.tokens, '--json'];
  if (agent) args.push('--agent', agent);
  return JSON.parse(await ledger(...args)).token;
}

/**
 * A child process whose stdout and stderr are kept, killed when the test
 * ends.
 */
function startProcess(t, args) {
  const child = spawn(LEDGER_BIN, args, { env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
  const p = { child, logs: '', exited: null };
  child.stdout.setEncoding('utf8').on('data', (d) => (p.logs += d));
  child.stderr.setEncoding('utf8').on('data', (d) => (p.logs += d));
  p.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  defer(t, async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      await p.exited;
    }
  });
  return p;
}

/**
 * Starts `ledger serve` on a free loopback port over the setup's database
 * and config (with the tokens file if it exists) and resolves once it
 * listens, with its URL.
 */
export async function startServe(t, s, { tokens = false } = {}) {
  const args = ['serve', '--addr', '127.0.0.1:0', '--db', s.db, '--config', s.config, '--effects', join(s.dir, 'serve.effects.db')];
  if (tokens) args.push('--tokens', s.tokens);
  const p = startProcess(t, args);
  const deadline = Date.now() + 60_000;
  let exited = false;
  p.exited.then(() => (exited = true));
  for (;;) {
    for (const line of p.logs.split('\n')) {
      try {
        const l = JSON.parse(line);
        if (typeof l.msg === 'string' && l.msg.startsWith('listening on http://')) {
          p.url = l.url;
          return p;
        }
      } catch {
        // not a JSON log line
      }
    }
    if (exited) throw new Error(`ledger serve exited early:\n${p.logs}`);
    if (Date.now() > deadline) throw new Error(`ledger serve did not listen within 60s:\n${p.logs}`);
    await new Promise((r) => setTimeout(r, 50)); // polls serve's log for its listening line
  }
}

/**
 * Approves an action through ledger serve's API, as a person would, with
 * the digest the gateway named; token is an approver's (none in dev mode).
 */
export async function approve(url, action, digest, token) {
  const headers = { 'content-type': 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  const res = await fetch(`${url}/v1/actions/${action}/approve`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ action_digest: digest, reason: 'looks right' }),
  });
  const body = await res.text();
  assert.equal(res.status, 200, `approve ${action}: ${res.status} ${body}`);
  return JSON.parse(body);
}

/** GETs path of ledger serve's API as the holder of token (none in dev mode). */
export async function getJSON(url, path, token) {
  const res = await fetch(url + path, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  const body = await res.text();
  assert.equal(res.status, 200, `GET ${path}: ${res.status} ${body}`);
  return JSON.parse(body);
}

/** The effects the upstream's own store counts, through `ledger simulator effects --json`. */
export async function effectsIn(s) {
  if (!existsSync(s.effects)) return []; // the upstream has not started yet: no store, no effect
  const out = await ledger('simulator', 'effects', '--store', s.effects, '--json');
  return out
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l));
}

/** The text of a tool result's text content. */
export function textOf(res) {
  return (res.content ?? [])
    .filter((c) => c.type === 'text')
    .map((c) => c.text)
    .join('');
}

/**
 * Keeps the stderr of a stdio transport started with stderr: 'pipe' (ledger
 * mcp's logs), so that its pipe never fills; returns a function that
 * gives what was read.
 */
export function keepStderr(transport) {
  let logs = '';
  transport.stderr.on('data', (d) => (logs += d));
  return () => logs;
}

/** Runs fn; a failure gets the logs appended (each a function that returns text). */
export async function explained(fn, logs) {
  try {
    return await fn();
  } catch (err) {
    err.message += Object.entries(logs)
      .map(([name, text]) => `\n--- ${name}:\n${text()}`)
      .join('');
    throw err;
  }
}

/** The environment for `ledger mcp` run by a client's stdio transport. */
export function gatewayEnv() {
  return cleanEnv();
}

/** The arguments of `ledger mcp` over the setup, naming ledger serve's URL. */
export function gatewayArgs(s, apiURL, principal = 'agent-1') {
  return ['mcp', '--config', s.config, '--db', s.db, '--api-url', apiURL, '--principal', principal];
}

/**
 * The flow every client goes through: the confirmed tools are listed; a
 * read runs at once; a write comes back as the tool error that names the
 * action, its digest and how to approve it, and reaches nobody; a person
 * approves that digest; the same call again runs the write, once. Returns
 * the waiting answer and the final one.
 */
export async function readThenApprovedWrite(client, s, { serveURL, approverToken, approver, principal, expectTools }) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((x) => x.name).sort(), expectTools ?? ['cards__cards_count', 'cards__cards_write']);
  const write = tools.find((x) => x.name === 'cards__cards_write');
  assert.equal(write.annotations?.destructiveHint, true, 'a write is shown as destructive, by its profile');
  assert.equal(tools.find((x) => x.name === 'cards__cards_count').annotations?.readOnlyHint, true);

  const read = await client.callTool({ name: 'cards__cards_count', arguments: { title: 'Go' } });
  assert.ok(!read.isError, textOf(read));
  assert.equal(read._meta[META.state], 'succeeded');
  assert.deepEqual(read.structuredContent, { count: 0, title: 'Go' });
  assert.ok(existsSync(s.effects), 'the upstream is up: its effect store exists, so an empty list below means no effect');

  const waiting = await client.callTool({ name: 'cards__cards_write', arguments: WRITE_ARGS });
  assert.equal(waiting.isError, true, 'the write waits for a person');
  assert.equal(waiting._meta[META.state], 'awaiting_approval');
  const action = waiting._meta[META.action];
  const digest = waiting._meta[META.digest];
  assert.match(action, /^act_/);
  assert.match(digest, /^sha256:[0-9a-f]{64}$/);
  assert.ok(textOf(waiting).includes(`ledger approve ${action} --digest ${digest}`), textOf(waiting));
  assert.deepEqual(await effectsIn(s), [], 'nothing reaches the upstream before a person approves');

  await approve(serveURL, action, digest, approverToken);

  const done = await client.callTool({ name: 'cards__cards_write', arguments: WRITE_ARGS });
  assert.ok(!done.isError, textOf(done));
  assert.equal(done._meta[META.action], action, 'the second call joined the approved action');
  assert.equal(done._meta[META.state], 'succeeded');
  assert.match(done._meta[META.attempt], /^att_/);
  const effects = await effectsIn(s);
  assert.equal(effects.length, 1, `one effect: ${JSON.stringify(effects)}`);
  assert.equal(effects[0].tool, 'cards.write');

  // The ledger's record, read through ledger serve: the run is the
  // gateway agent's, made by the gateway's principal; the one approval
  // was the approver's, of this digest; one attempt; the effect the
  // upstream counts carries the action's dedup key.
  const rec = await getJSON(serveURL, `/v1/actions/${action}`, approverToken);
  assert.equal(rec.state, 'succeeded');
  assert.equal(rec.tool, 'cards.cards_write');
  assert.equal(rec.attempts.length, 1);
  assert.deepEqual(
    rec.approvals.map((a) => [a.state, a.decided_by, a.action_digest]),
    [['granted', approver, digest]],
  );
  assert.equal(effects[0].dedup_key, rec.dedup_key);
  const run = await getJSON(serveURL, `/v1/runs/${rec.run_id}`, approverToken);
  assert.equal(run.agent, 'mcp');
  assert.equal(run.submitted_by, principal);
  return { waiting, done, action, digest, effects, record: rec };
}
