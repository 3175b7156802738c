// A lease-racing child process (see leases.test.mjs). Env: DSN, MODE, KEY,
// CHILD_INDEX, ROUNDS, OWNER. Prints {"ready":true}, waits for a stdin line,
// then races and prints one JSON result line.
import { createInterface } from 'node:readline';

import { PgDurablePubSub } from '../dist/esm/index.js';

const { DSN, MODE, KEY, CHILD_INDEX } = process.env;
const rounds = Number(process.env.ROUNDS ?? '1');
const owner = process.env.OWNER ?? `p${CHILD_INDEX}`;
const provider = new PgDurablePubSub({ connectionString: DSN, poolSize: 1 });
await provider.getLeaseOwner('warm-up'); // connect before the barrier
console.log(JSON.stringify({ ready: true }));
await new Promise((res) => createInterface({ input: process.stdin }).once('line', res));

if (MODE === 'acquire') {
  const r = await provider.acquireLease(KEY, owner, 60_000);
  console.log(JSON.stringify({ result: { acquired: r.acquired, owner: r.owner ?? null, token: r.token ?? null } }));
} else if (MODE === 'churn') {
  // Acquire, and release when granted, over and over: a loser must always name a holder.
  let won = 0;
  let lostWithoutOwner = 0;
  for (let i = 0; i < rounds; i++) {
    const r = await provider.acquireLease(KEY, owner, 60_000);
    if (r.acquired) {
      won++;
      await provider.releaseLease(KEY, owner);
    } else if (r.owner === undefined) {
      lostWithoutOwner++;
    }
  }
  console.log(JSON.stringify({ result: { won, lostWithoutOwner } }));
} else if (MODE === 'hammer') {
  // Try to slip into a key that is being transferred between other owners.
  let won = 0;
  const seen = new Set();
  for (let i = 0; i < rounds; i++) {
    const r = await provider.acquireLease(KEY, owner, 60_000);
    if (r.acquired) won++;
    else seen.add(r.owner ?? '<none>');
  }
  console.log(JSON.stringify({ result: { won, seen: [...seen] } }));
}
await provider.close();
process.exit(0);
