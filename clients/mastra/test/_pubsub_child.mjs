// A publishing child process (see pubsub.test.mjs). Env: DSN, TOPIC, ROUNDS,
// CHILD_INDEX. Prints {"ready":true}, waits for a stdin line, publishes ROUNDS
// events in small concurrent bursts, prints {"result":{"published":n}}.
import { createInterface } from 'node:readline';

import { PgDurablePubSub } from '../dist/esm/index.js';

const { DSN, TOPIC, CHILD_INDEX } = process.env;
const rounds = Number(process.env.ROUNDS ?? '100');
const pubsub = new PgDurablePubSub({ connectionString: DSN, poolSize: 2 });
await pubsub.getLeaseOwner('warm-up');
console.log(JSON.stringify({ ready: true }));
await new Promise((res) => createInterface({ input: process.stdin }).once('line', res));
for (let i = 0; i < rounds; i += 5) {
  await Promise.all([0, 1, 2, 3, 4].filter((j) => i + j < rounds).map((j) =>
    pubsub.publish(TOPIC, { type: 'tick', runId: `child-${CHILD_INDEX}`, data: { src: Number(CHILD_INDEX), i: i + j } })));
}
console.log(JSON.stringify({ result: { published: rounds } }));
await pubsub.close();
process.exit(0);
