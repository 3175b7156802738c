// A real Mastra app in a child process (see mastra.test.mjs): one agent backed by
// Mastra's mock language model, Mastra's pubsub = PgDurablePubSub. At the barrier
// it sends MESSAGE to thread (RESOURCE, THREAD) with agent.sendMessage and reports
// what Mastra's signals runtime decided. Its first model call waits for a
// {"release":true} line, so the run is still active when the other process's
// message arrives. Every model call is reported with the user texts it saw.
import { createInterface } from 'node:readline';

import { Mastra } from '@mastra/core';
import { Agent } from '@mastra/core/agent';
import { MastraLanguageModelV2Mock } from '@mastra/core/test-utils/llm-mock';

import { PgDurablePubSub } from '../dist/esm/index.js';

const { DSN, RESOURCE, THREAD, CHILD_INDEX } = process.env;
const MESSAGE = process.env.MESSAGE ?? `message from process ${CHILD_INDEX}`;
const report = (msg) => console.log(JSON.stringify(msg));
const lines = createInterface({ input: process.stdin });
const inbox = [];
const waiting = [];
lines.on('line', (l) => {
  const m = JSON.parse(l);
  const w = waiting.find((x) => x.pred(m));
  if (w) {
    waiting.splice(waiting.indexOf(w), 1);
    w.resolve(m);
  } else inbox.push(m);
});
function nextLine(pred) {
  const i = inbox.findIndex(pred);
  if (i >= 0) return Promise.resolve(inbox.splice(i, 1)[0]);
  return new Promise((resolve) => waiting.push({ pred, resolve }));
}

function userTexts(prompt) {
  const out = [];
  for (const m of prompt) {
    if (m.role !== 'user') continue;
    for (const part of Array.isArray(m.content) ? m.content : [{ type: 'text', text: m.content }]) {
      if (part.type === 'text') out.push(part.text);
    }
  }
  return out;
}

let modelCalls = 0;
const model = new MastraLanguageModelV2Mock({
  doStream: async (options) => {
    modelCalls++;
    report({ modelCall: userTexts(options.prompt) });
    if (modelCalls === 1) await nextLine((m) => m.release === true);
    return {
      stream: new ReadableStream({
        start(c) {
          for (const part of [
            { type: 'stream-start', warnings: [] },
            { type: 'response-metadata', id: `resp-${modelCalls}`, modelId: 'mock', timestamp: new Date(0) },
            { type: 'text-start', id: 't' },
            { type: 'text-delta', id: 't', delta: `answer ${modelCalls}` },
            { type: 'text-end', id: 't' },
            { type: 'finish', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 1, totalTokens: 2 } },
          ]) c.enqueue(part);
          c.close();
        },
      }),
    };
  },
});

const pubsub = new PgDurablePubSub({ connectionString: DSN });
const agent = new Agent({ id: 'chat', name: 'chat', instructions: 'Answer briefly.', model });
const mastra = new Mastra({ agents: { chat: agent }, pubsub, logger: false });
const chat = mastra.getAgent('chat');

// Watch the thread's topic as any subscriber would: report the routed follow-ups.
const topic = `agent.thread-stream.${encodeURIComponent(`${RESOURCE}\0${THREAD}`)}`;
await pubsub.subscribe(topic, (e) => {
  if (e.type === 'signal-enqueued') report({ enqueued: { runId: e.runId, from: e.data?.sourceId } });
}, { startFrom: 'latest' });
report({ ready: true });
await nextLine((m) => m.go === true);

const sent = chat.sendMessage(MESSAGE, { resourceId: RESOURCE, threadId: THREAD });
const accepted = await sent.accepted;
report({ accepted: { action: accepted.action, runId: accepted.runId } });
if (accepted.output) {
  const text = await accepted.output.text;
  report({ firstRunText: text });
}
await nextLine((m) => m.finish === true);
await mastra.pubsub.flush();
report({ done: { modelCalls } });
await pubsub.close();
process.exit(0);
