// Test 2: the v1 client (@modelcontextprotocol/sdk, 2025-11-25) over
// streamable HTTP against /mcp of `ledger serve`, behind the API's tokens:
// the client's bearer token is principal claude's, role agent for the
// gateway's agent (mcp); another principal, alice, approves. Requests
// without a token, with a bad one, or with a token that does not drive the
// agent are refused (401).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import * as h from './lib/helpers.js';

function httpClient(url, token) {
  const transport = new StreamableHTTPClientTransport(new URL(`${url}/mcp`), {
    requestInit: token ? { headers: { authorization: `Bearer ${token}` } } : {},
  });
  return { client: new Client({ name: 'e2e-v1-http', version: '1.0.0' }), transport };
}

/** An initialize request, as a client sends it first. */
const initialize = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } },
});

test('v1 client over streamable HTTP with an agent token', async (t) => {
  const s = await h.setup(t);
  const claude = await h.newToken(s, { principal: 'claude', role: 'agent', agent: 'mcp' });
  const alice = await h.newToken(s, { principal: 'alice', role: 'approver' });
  const serve = await h.startServe(t, s, { tokens: true });
  const logs = { 'ledger serve': () => serve.logs };

  await t.test('refused without a token, with a bad one, or one that does not drive the gateway agent', async () => {
    for (const [why, token] of [
      ['no token', undefined],
      ['bad token', 'not-a-token'],
      ['approver token', alice],
    ]) {
      const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' };
      if (token) headers.authorization = `Bearer ${token}`;
      const res = await fetch(`${serve.url}/mcp`, { method: 'POST', headers, body: initialize });
      await res.arrayBuffer();
      assert.equal(res.status, 401, why);
    }
    // The SDK's client gets the same refusal when it connects.
    const { client, transport } = httpClient(serve.url, 'not-a-token');
    await assert.rejects(client.connect(transport), /401|Unauthorized/i);
  });

  await t.test('tools listed, a read at once, a write once after a person approves its digest', async (st) => {
    const { client, transport } = httpClient(serve.url, claude);
    await client.connect(transport);
    h.defer(st, () => client.close());
    assert.equal(transport.protocolVersion, '2025-11-25');
    assert.ok(transport.sessionId, 'a stateful session');
    const { waiting, action, digest } = await h.explained(
      () => h.readThenApprovedWrite(client, s, { serveURL: serve.url, approverToken: alice, approver: 'alice', principal: 'claude' }),
      logs,
    );

    // Separation of duties: the agent's own token cannot approve.
    const res = await fetch(`${serve.url}/v1/actions/${action}/approve`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${claude}` },
      body: JSON.stringify({ action_digest: digest, reason: 'self' }),
    });
    await res.arrayBuffer();
    assert.equal(res.status, 403);

    await st.test(
      'the waiting answer names the approve URL of the address serve listens on',
      () => {
        assert.ok(h.textOf(waiting).includes(`POST ${serve.url}/v1/actions/${action}/approve`), h.textOf(waiting));
      },
    );
  });
});
