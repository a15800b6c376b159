// Test 4: an upstream nobody here wrote, @modelcontextprotocol/server-everything
// (stdio), beside the simulator's: its echo and get-sum, profiled as reads
// and confirmed, are listed as everything__echo and everything__get-sum and
// run at once; its other tools (get-env, which would hand the gateway's
// environment to the client, among them) were never confirmed and are
// neither listed nor callable. Reads need no person, so no ledger serve runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import * as h from './lib/helpers.js';

test('server-everything as a second upstream: its confirmed reads listed and run at once', async (t) => {
  const s = await h.setup(t, { everything: true });

  // ledger mcp tools list sees every tool of both upstreams, and which are confirmed.
  const status = JSON.parse(await h.ledger('mcp', 'tools', 'list', '--config', s.config, '--json'));
  const byName = Object.fromEntries(status.map((x) => [x.name, x]));
  assert.equal(byName['everything__echo'].status, 'confirmed');
  assert.equal(byName['everything__get-sum'].status, 'confirmed');
  assert.equal(byName['everything__get-env'].status, 'unconfirmed');

  const transport = new StdioClientTransport({
    command: h.LEDGER_BIN,
    args: ['mcp', '--config', s.config, '--db', s.db, '--principal', 'agent-1'],
    env: h.gatewayEnv(),
    stderr: 'pipe',
  });
  const gatewayLogs = h.keepStderr(transport);
  const client = new Client({ name: 'e2e-v1-everything', version: '1.0.0' });
  await client.connect(transport);
  h.defer(t, () => client.close());
  const why = () => `\nledger mcp stderr:\n${gatewayLogs()}`;

  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((x) => x.name).sort(), [
    'cards__cards_count',
    'cards__cards_write',
    'everything__echo',
    'everything__get-sum',
  ]);
  const echoDef = tools.find((x) => x.name === 'everything__echo');
  assert.equal(echoDef.annotations?.readOnlyHint, true);
  assert.deepEqual(echoDef.inputSchema.required, ['message']);

  const echo = await client.callTool({ name: 'everything__echo', arguments: { message: 'hello ledger' } });
  assert.ok(!echo.isError, h.textOf(echo) + why());
  assert.equal(h.textOf(echo), 'Echo: hello ledger');
  assert.equal(echo._meta[h.META.state], 'succeeded');
  assert.match(echo._meta[h.META.action], /^act_/);

  const sum = await client.callTool({ name: 'everything__get-sum', arguments: { a: 2, b: 3 } });
  assert.ok(!sum.isError, h.textOf(sum) + why());
  assert.equal(h.textOf(sum), 'The sum of 2 and 3 is 5.');

  // Arguments the upstream's schema refuses are refused by the ledger
  // before the upstream is called.
  const bad = await client.callTool({ name: 'everything__get-sum', arguments: { a: 'two', b: 3 } });
  assert.equal(bad.isError, true);
  assert.match(h.textOf(bad), /^invalid_arguments: .*everything\.get_sum.* at \/a$/);

  // A tool never confirmed does not exist for the client.
  await assert.rejects(client.callTool({ name: 'everything__get-env', arguments: {} }), /-32602: unknown tool "everything__get-env"/);
});
