// A real Mastra app in two Node processes sharing one database through
// PgDurablePubSub: both receive a message on the same thread at once. Mastra's
// signals runtime (AgentThreadStreamRuntime in @mastra/core) elects the owner
// with our LeaseProvider: exactly one process runs the thread, the other routes
// its message to the owner's run, and the owner's model sees it.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { PgDurablePubSub } from '../dist/esm/index.js';
import { atBarrier, freshDatabase } from './helpers.mjs';

let db;
let observer;
let children = [];

before(async () => {
  db = await freshDatabase('mastra');
  observer = new PgDurablePubSub({ connectionString: db.dsn });
});

after(async () => {
  for (const c of children) c.kill();
  await observer?.close();
  await db?.drop();
});

test('two Mastra processes, one thread, messages at once: one owner runs it, the follow-up is routed to it',
  { timeout: 120_000 }, async () => {
    const RESOURCE = 'user-1';
    const THREAD = 'thread-1';
    children = await atBarrier('_mastra_app.mjs', 2, { DSN: db.dsn, RESOURCE, THREAD });
    const accepted = await Promise.all(children.map((c) => c.next((m) => m.accepted).then((m) => m.accepted)));

    const wakes = accepted.filter((a) => a.action === 'wake');
    assert.equal(wakes.length, 1, `exactly one process starts the run: ${JSON.stringify(accepted)}`);
    const winnerIndex = accepted.findIndex((a) => a.action === 'wake');
    const winner = children[winnerIndex];
    const loser = children[1 - winnerIndex];
    const runId = accepted[winnerIndex].runId;
    assert.deepEqual(accepted[1 - winnerIndex], { action: 'deliver', runId },
                     'the other process routes its message to the owner\'s run');

    // The thread lease (key resourceId + "\0" + threadId) is held by the owner's run.
    assert.equal(await observer.getLeaseOwner(`${RESOURCE}\0${THREAD}`), runId);

    // The routed follow-up reaches the owner's process through the database...
    const enqueued = await winner.next((m) => m.enqueued);
    assert.equal(enqueued.enqueued.runId, runId);
    // ...and the owner's model sees it, while the first model call is still running.
    const first = await winner.next((m) => m.modelCall);
    assert.deepEqual(first.modelCall, [`message from process ${winnerIndex}`]);
    winner.send({ release: true });
    const followUp = await winner.next((m) => m.modelCall
      && m.modelCall.includes(`message from process ${1 - winnerIndex}`));
    assert.ok(followUp);

    for (const c of children) c.send({ finish: true });
    const [wDone, lDone] = await Promise.all([winner.next((m) => m.done), loser.next((m) => m.done)]);
    assert.ok(wDone.done.modelCalls >= 2);
    assert.equal(lDone.done.modelCalls, 0, 'the other process never ran the agent');
    assert.equal(loser.lines.filter((m) => m.modelCall).length, 0);
  });
