// Lease ops/s from Node through PgDurablePubSub (driven by benchmarks/mastra_leases.py).
// Usage: node bench/leases.mjs <dsn> <acquire|renew> <clients> <seconds>
// Prints {"ops_per_s": n}. Same keys and owners as benchmarks/leases.py:
// client c works on keys bench-<c>-<0..99> as owner client-<c>, TTL 1 h.
import { PgDurablePubSub } from '../dist/esm/index.js';

const [dsn, op, clientsArg, secondsArg] = process.argv.slice(2);
const clients = Number(clientsArg);
const seconds = Number(secondsArg);
const TTL = 3_600_000;
const KEYS = 100;
const p = new PgDurablePubSub({ connectionString: dsn, poolSize: clients });

const call = (c) => {
  const key = `bench-${c}-${Math.floor(Math.random() * KEYS)}`;
  const owner = `client-${c}`;
  return op === 'acquire' ? p.acquireLease(key, owner, TTL) : p.renewLease(key, owner, TTL);
};

let running = true;
let started = false;
const counts = new Array(clients).fill(0);
async function client(c) {
  for (let i = 0; i < 10; i++) await call(c); // warm-up: connections open, statements prepared
  while (!started) await new Promise((r) => setTimeout(r, 5));
  while (running) {
    await call(c);
    counts[c]++;
  }
}

const loops = Array.from({ length: clients }, (_, c) => client(c));
await new Promise((r) => setTimeout(r, 500));
started = true;
const t0 = performance.now();
await new Promise((r) => setTimeout(r, seconds * 1000));
running = false;
await Promise.all(loops);
const elapsed = (performance.now() - t0) / 1000;
console.log(JSON.stringify({ ops_per_s: counts.reduce((a, b) => a + b, 0) / elapsed }));
await p.close();
