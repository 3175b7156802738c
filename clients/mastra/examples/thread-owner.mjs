// Two Mastra instances (think: two servers) share one thread through pgdurable's
// Postgres. Both receive a message on the same thread at once: one becomes the
// thread's owner and runs the agent, the other routes its message to that run.
//
//   pgdurable migrate --dsn "$DATABASE_URL"      # once, from the Python package
//   DATABASE_URL=postgresql://... node examples/thread-owner.mjs
//
// (In one process here for brevity: Mastra keeps its thread state per PubSub
// instance, so two instances behave like two processes. The model is Mastra's
// mock; swap in a real one.)
import { Mastra } from '@mastra/core';
import { Agent } from '@mastra/core/agent';
import { createMockModel } from '@mastra/core/test-utils/llm-mock';

import { PgDurablePubSub } from '@pgdurable/mastra'; // the package itself (its build)

const connectionString = process.env.DATABASE_URL ?? process.env.PGDURABLE_DSN;

function server(name) {
  const pubsub = new PgDurablePubSub({ connectionString });
  const seen = [];
  const model = createMockModel({ mockText: `hello from ${name}`, spyStream: (call) => seen.push(call) });
  const agent = new Agent({ id: 'chat', name: 'chat', instructions: 'Answer briefly.', model });
  const mastra = new Mastra({ agents: { chat: agent }, pubsub, logger: false });
  return { name, pubsub, seen, chat: mastra.getAgent('chat') };
}

const servers = [server('server-a'), server('server-b')];
const thread = { resourceId: 'user-42', threadId: `support-${Date.now()}` };

const results = await Promise.all(servers.map((s) =>
  s.chat.sendMessage(`question via ${s.name}`, thread).accepted));
for (const [i, r] of results.entries()) {
  console.log(`${servers[i].name}: ${r.action} -> run ${r.runId}`);
  if (r.output) console.log(`  ${servers[i].name} answered: ${await r.output.text}`);
}
const owner = await servers[0].pubsub.getLeaseOwner(`${thread.resourceId}\0${thread.threadId}`);
console.log(`thread lease held by run: ${owner ?? '(released after the run)'}`);
const wakes = results.filter((r) => r.action === 'wake').length;
console.log(`runs started: ${wakes} (expected 1)`);
for (const s of servers) await s.pubsub.close();
process.exit(wakes === 1 ? 0 : 1);
