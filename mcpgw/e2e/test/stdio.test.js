// Test 1: the official TypeScript SDK's v1 client (@modelcontextprotocol/sdk,
// protocol 2025-11-25), without an elicitation handler, runs `ledger mcp` as
// its stdio server, as Claude Desktop or VS Code would, beside `ledger
// serve` on the same database and config with a tokens file: the gateway
// calls as principal agent-1, and another principal, alice (role
// approver), approves: separation of duties.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import * as h from './lib/helpers.js';

test('v1 client over stdio: tools listed, a read at once, a write once after a person approves its digest', async (t) => {
  const s = await h.setup(t);
  const alice = await h.newToken(s, { principal: 'alice', role: 'approver' });
  const serve = await h.startServe(t, s, { tokens: true });

  const transport = new StdioClientTransport({
    command: h.LEDGER_BIN,
    args: h.gatewayArgs(s, serve.url, 'agent-1'),
    env: h.gatewayEnv(),
    stderr: 'pipe',
  });
  const gatewayLogs = h.keepStderr(transport);
  const client = new Client({ name: 'e2e-v1-stdio', version: '1.0.0' });
  await client.connect(transport);
  h.defer(t, () => client.close());
  assert.equal(client.getServerVersion()?.name, 'ledger');

  await h.explained(
    async () => {
      const { waiting, done, action } = await h.readThenApprovedWrite(client, s, {
        serveURL: serve.url,
        approverToken: alice,
        approver: 'alice',
        principal: 'agent-1',
      });
      assert.ok(h.textOf(waiting).includes(`POST ${serve.url}/v1/actions/${action}/approve`), 'the answer names the approve URL of --api-url');

      // Its outcome was delivered: the same call again is a new action,
      // which waits for a person in its turn; the upstream still counts
      // one effect.
      const again = await client.callTool({ name: 'cards__cards_write', arguments: h.WRITE_ARGS });
      assert.equal(again.isError, true);
      assert.notEqual(again._meta[h.META.action], done._meta[h.META.action]);
      assert.equal(again._meta[h.META.state], 'awaiting_approval');
      assert.equal((await h.effectsIn(s)).length, 1);
    },
    { 'ledger mcp': gatewayLogs, 'ledger serve': () => serve.logs },
  );
});
