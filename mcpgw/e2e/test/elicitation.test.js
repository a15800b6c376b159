// Test 3: clients that take elicitations.
//
// The gateway asks for a person through an input-required result (a URL
// elicitation to the approval and an HMAC request state) only to a client
// that negotiated the 2026-07-28 revision and declared URL elicitation;
// every other client gets the waiting tool error of tests 1 and 2, and the
// gateway never sends it an elicitation/create request.
//
// - v1 (@modelcontextprotocol/sdk, 2025-11-25) with an elicitation handler
//   for form and url: the tool error; the handler is never called.
// - v2 (@modelcontextprotocol/client, 2026-07-28) over stdio, manual mode:
//   the input-required result; a tampered request state is refused; after
//   the approval, the retry with the request state runs the write once.
// - v2 over stdio, auto-fulfilment (its default): the SDK hands the URL
//   elicitation to the client's handler (here the person opens the URL and
//   approves), then retries with the request state itself: one callTool,
//   one effect.
// - v2 over streamable HTTP (/mcp of ledger serve): pinned to 2025-11-25 it
//   opens a session and gets the tool error; pinned to 2026-07-28 its
//   stateless requests get the input-required result with a URL
//   elicitation and a request state, and the retry with the state runs the
//   write once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport as StdioV1 } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { Client as ClientV2, StreamableHTTPClientTransport as HTTPV2 } from '@modelcontextprotocol/client';
import { StdioClientTransport as StdioV2 } from '@modelcontextprotocol/client/stdio';
import * as h from './lib/helpers.js';

/** A setup with ledger serve (tokens: alice approves, claude drives the gateway agent over HTTP). */
async function withServe(t) {
  const s = await h.setup(t);
  const alice = await h.newToken(s, { principal: 'alice', role: 'approver' });
  const claude = await h.newToken(s, { principal: 'claude', role: 'agent', agent: 'mcp' });
  const serve = await h.startServe(t, s, { tokens: true });
  return { s, alice, claude, serve };
}

/** A v2 client declaring form and URL elicitation; elicited collects what its handler saw. */
function clientV2(opts = {}) {
  const client = new ClientV2(
    { name: 'e2e-v2', version: '1.0.0' },
    { capabilities: { elicitation: { form: {}, url: {} } }, versionNegotiation: { mode: 'auto' }, ...opts },
  );
  return client;
}

/** A v2 stdio transport running ledger mcp; logs gives its stderr. */
function stdioV2(s, serve) {
  const transport = new StdioV2({ command: h.LEDGER_BIN, args: h.gatewayArgs(s, serve.url), env: h.gatewayEnv(), stderr: 'pipe' });
  return { transport, logs: h.keepStderr(transport) };
}

test('v1 client with an elicitation handler (form, url): the waiting tool error, never an elicitation', async (t) => {
  const { s, alice, serve } = await withServe(t);
  const client = new ClientV1({ name: 'e2e-v1-elicit', version: '1.0.0' }, { capabilities: { elicitation: { form: {}, url: {} } } });
  const elicited = [];
  client.setRequestHandler(ElicitRequestSchema, async (req) => {
    elicited.push(req.params);
    return { action: 'accept' };
  });
  const transport = new StdioV1({ command: h.LEDGER_BIN, args: h.gatewayArgs(s, serve.url), env: h.gatewayEnv(), stderr: 'pipe' });
  const logs = h.keepStderr(transport);
  await client.connect(transport);
  h.defer(t, () => client.close());
  await h.explained(
    () => h.readThenApprovedWrite(client, s, { serveURL: serve.url, approverToken: alice, approver: 'alice', principal: 'agent-1' }),
    { 'ledger mcp': logs },
  );
  assert.deepEqual(elicited, [], 'a 2025-11-25 client is never sent elicitation/create by the gateway');
});

test('v2 client over stdio, manual mode: input-required, a URL elicitation and a request state; the retry runs the write once', async (t) => {
  const { s, alice, serve } = await withServe(t);
  const client = clientV2({ inputRequired: { autoFulfill: false } });
  const { transport, logs } = stdioV2(s, serve);
  await client.connect(transport);
  h.defer(t, () => client.close());
  assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28');

  await h.explained(
    async () => {
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((x) => x.name).sort(), ['cards__cards_count', 'cards__cards_write']);
      const read = await client.callTool({ name: 'cards__cards_count', arguments: { title: 'Go' } });
      assert.ok(!read.isError, h.textOf(read));
      assert.equal(read._meta[h.META.state], 'succeeded');

      const first = await client.callTool({ name: 'cards__cards_write', arguments: h.WRITE_ARGS }, { allowInputRequired: true });
      assert.equal(first.resultType, 'input_required', JSON.stringify(first));
      const action = first._meta[h.META.action];
      const digest = first._meta[h.META.digest];
      assert.equal(first._meta[h.META.state], 'awaiting_approval');
      const el = first.inputRequests.approval;
      assert.equal(el.method, 'elicitation/create');
      assert.equal(el.params.mode, 'url');
      assert.equal(el.params.url, `${serve.url}/v1/actions/${action}`);
      assert.ok(el.params.message.includes(`ledger approve ${action} --digest ${digest}`), el.params.message);
      assert.ok(typeof first.requestState === 'string' && first.requestState.length > 0);
      assert.deepEqual(await h.effectsIn(s), []);

      // A request state the gateway did not give (its body changed under
      // the old MAC: a later expiry) is refused with a tool error.
      const [body, mac] = first.requestState.split('.');
      const st = JSON.parse(Buffer.from(body, 'base64url').toString());
      const forged = `${Buffer.from(JSON.stringify({ ...st, e: st.e + 3600 })).toString('base64url')}.${mac}`;
      const retry = (requestState) =>
        client.callTool(
          { name: 'cards__cards_write', arguments: h.WRITE_ARGS, inputResponses: { approval: { action: 'accept' } }, requestState },
          { allowInputRequired: true },
        );
      const refused = await retry(forged);
      assert.equal(refused.isError, true, JSON.stringify(refused));
      assert.match(h.textOf(refused), /request state is not one this gateway gave/);

      await h.approve(serve.url, action, digest, alice);

      const done = await retry(first.requestState);
      assert.ok(!done.isError, h.textOf(done));
      assert.notEqual(done.resultType, 'input_required');
      assert.equal(done._meta[h.META.action], action);
      assert.equal(done._meta[h.META.state], 'succeeded');
      // Joined, and called now: not an answer recorded earlier.
      assert.equal(done._meta[h.META.replayed], undefined, 'the write ran at this call');
      const effects = await h.effectsIn(s);
      assert.equal(effects.length, 1);
      const rec = await h.getJSON(serve.url, `/v1/actions/${action}`, alice);
      assert.equal(effects[0].dedup_key, rec.dedup_key);
      assert.equal(rec.attempts.length, 1);
    },
    { 'ledger mcp': logs, 'ledger serve': () => serve.logs },
  );
});

test('v2 client over stdio, auto-fulfilment: the elicitation handler is where the person approves; one callTool, one effect', async (t) => {
  const { s, alice, serve } = await withServe(t);
  const client = clientV2();
  const elicited = [];
  client.setRequestHandler('elicitation/create', async (req) => {
    elicited.push(req.params);
    // The person opens the URL and approves the digest the message names.
    // (2026-07-28 dropped elicitationId from URL elicitations: the SDK
    // hands the handler mode, message and url only.)
    assert.equal(req.params.mode, 'url');
    assert.ok(req.params.url.startsWith(`${serve.url}/v1/actions/act_`), req.params.url);
    const action = req.params.url.split('/').pop();
    const digest = /digest (sha256:[0-9a-f]{64})/.exec(req.params.message)[1];
    assert.deepEqual(await h.effectsIn(s), [], 'nothing ran before the approval');
    await h.approve(serve.url, action, digest, alice);
    return { action: 'accept' };
  });
  const { transport, logs } = stdioV2(s, serve);
  await client.connect(transport);
  h.defer(t, () => client.close());
  assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28');

  await h.explained(
    async () => {
      const done = await client.callTool({ name: 'cards__cards_write', arguments: h.WRITE_ARGS });
      assert.ok(!done.isError, h.textOf(done));
      assert.equal(done._meta[h.META.state], 'succeeded');
      assert.equal(elicited.length, 1, 'one round: the approval');
      assert.equal(done._meta[h.META.action], elicited[0].url.split('/').pop());
      assert.equal((await h.effectsIn(s)).length, 1);
    },
    { 'ledger mcp': logs, 'ledger serve': () => serve.logs },
  );
});

test('v2 client over streamable HTTP in legacy mode (2025-11-25): a session, the waiting tool error, a write once after approval', async (t) => {
  const { s, alice, claude, serve } = await withServe(t);
  const client = clientV2({ versionNegotiation: { mode: 'legacy' } });
  const elicited = [];
  client.setRequestHandler('elicitation/create', async (req) => {
    elicited.push(req.params);
    return { action: 'decline' };
  });
  await client.connect(new HTTPV2(new URL(`${serve.url}/mcp`), { requestInit: { headers: { authorization: `Bearer ${claude}` } } }));
  h.defer(t, () => client.close());
  assert.equal(client.getNegotiatedProtocolVersion(), '2025-11-25');
  await h.explained(
    () => h.readThenApprovedWrite(client, s, { serveURL: serve.url, approverToken: alice, approver: 'alice', principal: 'claude' }),
    { 'ledger serve': () => serve.logs },
  );
  assert.deepEqual(elicited, []);
});

test(
  'v2 client over streamable HTTP pinned to 2026-07-28: input-required with a URL elicitation and a request state',
  async (t) => {
    const { s, alice, claude, serve } = await withServe(t);
    const client = clientV2({ versionNegotiation: { mode: { pin: '2026-07-28' } }, inputRequired: { autoFulfill: false } });
    await client.connect(new HTTPV2(new URL(`${serve.url}/mcp`), { requestInit: { headers: { authorization: `Bearer ${claude}` } } }));
    h.defer(t, () => client.close());
    const first = await client.callTool({ name: 'cards__cards_write', arguments: h.WRITE_ARGS }, { allowInputRequired: true });
    assert.equal(first.resultType, 'input_required', JSON.stringify(first));
    await h.approve(serve.url, first._meta[h.META.action], first._meta[h.META.digest], alice);
    const done = await client.callTool(
      { name: 'cards__cards_write', arguments: h.WRITE_ARGS, inputResponses: { approval: { action: 'accept' } }, requestState: first.requestState },
      { allowInputRequired: true },
    );
    assert.equal(done._meta[h.META.state], 'succeeded');
    assert.equal((await h.effectsIn(s)).length, 1);
  },
);
