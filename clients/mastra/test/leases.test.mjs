// The lease contract (shared/CONTRACT.md L1-L19, C1) against a real Postgres,
// the races in several Node processes.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { InMemoryServerCache } from '@mastra/core/cache';
import { NoopLeaseProvider, isLeaseProvider, withCaching } from '@mastra/core/events';

import {
  InvalidInputError, MAX_TTL_MS, PgDurablePubSub, ProviderClosedError, SchemaVersionMismatchError,
} from '../dist/esm/index.js';
import { atBarrier, expire, freshDatabase, leaseRow, sql } from './helpers.mjs';

let db;
let p;
let admin;

before(async () => {
  db = await freshDatabase('leases');
  p = new PgDurablePubSub({ connectionString: db.dsn });
  admin = await sql(db.dsn);
});

after(async () => {
  await p?.close();
  await admin?.end();
  await db?.drop();
});

describe('lease provider: the five methods', () => {
  test('C1 isLeaseProvider is true (structural, against the real @mastra/core)', () => {
    assert.equal(isLeaseProvider(p), true);
    assert.notEqual(p, NoopLeaseProvider);
    for (const m of ['acquireLease', 'getLeaseOwner', 'releaseLease', 'renewLease', 'transferLease']) {
      assert.equal(typeof p[m], 'function');
    }
  });

  test('C2 Mastra\'s CachingPubSub wrapper exposes it through getLeaseProvider()', async () => {
    const cached = withCaching(p, new InMemoryServerCache());
    assert.equal(cached.getLeaseProvider(), p);
    assert.equal((await cached.getLeaseProvider().acquireLease('c2', 'a', 1000)).acquired, true);
  });

  test('L1 acquire on a free key: acquired, owner me, getLeaseOwner me', async () => {
    const g = await p.acquireLease('l1', 'me', 15_000);
    assert.equal(g.acquired, true);
    assert.equal(g.owner, 'me');
    assert.equal(g.token, 1);
    assert.equal(await p.getLeaseOwner('l1'), 'me');
    const row = await leaseRow(admin, 'l1');
    assert.equal(row.expires_at.getTime() - row.renewed_at.getTime(), 15_000); // database clock: expiry = the write's now + ttl
  });

  test('L2 a holds: b loses, names a, nothing changes', async () => {
    const a = await p.acquireLease('l2', 'a', 30_000);
    const before = await leaseRow(admin, 'l2');
    const b = await p.acquireLease('l2', 'b', 30_000);
    assert.deepEqual({ acquired: b.acquired, owner: b.owner, token: b.token },
                     { acquired: false, owner: 'a', token: a.token });
    assert.deepEqual(await leaseRow(admin, 'l2'), before);
  });

  test('L3 same owner re-acquires: TTL refreshed, token kept', async () => {
    const first = await p.acquireLease('l3', 'a', 10_000);
    const again = await p.acquireLease('l3', 'a', 60_000);
    assert.equal(again.acquired, true);
    assert.equal(again.token, first.token);
    assert.ok(again.expiresAt > first.expiresAt);
  });

  test('L4 after expiry: free, and the next owner gets a higher token', async () => {
    const a = await p.acquireLease('l4', 'a', 30_000);
    await expire(admin, 'l4');
    assert.equal(await p.getLeaseOwner('l4'), undefined);
    const b = await p.acquireLease('l4', 'b', 30_000);
    assert.equal(b.acquired, true);
    assert.ok(b.token > a.token);
  });

  test('L6 a expired, b acquired: a re-acquire loses and names b', async () => {
    await p.acquireLease('l6', 'a', 30_000);
    await expire(admin, 'l6');
    await p.acquireLease('l6', 'b', 30_000);
    const a = await p.acquireLease('l6', 'a', 30_000);
    assert.deepEqual([a.acquired, a.owner], [false, 'b']);
  });

  test('L8 release by a non-owner is a silent no-op', async () => {
    await p.acquireLease('l8', 'a', 30_000);
    assert.equal(await p.releaseLease('l8', 'b'), undefined);
    assert.equal(await p.getLeaseOwner('l8'), 'a');
    await p.releaseLease('l8', 'a');
    assert.equal(await p.getLeaseOwner('l8'), undefined);
    assert.equal((await leaseRow(admin, 'l8')).token, 1); // the row keeps its token
  });

  test('L9 a late release after expiry and takeover leaves b in place', async () => {
    await p.acquireLease('l9', 'a', 30_000);
    await expire(admin, 'l9');
    await p.acquireLease('l9', 'b', 30_000);
    await p.releaseLease('l9', 'a');
    assert.equal(await p.getLeaseOwner('l9'), 'b');
  });

  test('L10 renew while held: true, expiry = now + ttl', async () => {
    await p.acquireLease('l10', 'a', 5_000);
    assert.equal(await p.renewLease('l10', 'a', 90_000), true);
    const row = await leaseRow(admin, 'l10');
    assert.equal(row.expires_at.getTime() - row.renewed_at.getTime(), 90_000);
  });

  test('L11 renew after expiry: false, not resurrected', async () => {
    await p.acquireLease('l11', 'a', 30_000);
    await expire(admin, 'l11');
    assert.equal(await p.renewLease('l11', 'a', 30_000), false);
    assert.equal(await p.getLeaseOwner('l11'), undefined);
  });

  test('L12 renew after takeover: false, b\'s expiry unchanged', async () => {
    await p.acquireLease('l12', 'a', 30_000);
    await expire(admin, 'l12');
    await p.acquireLease('l12', 'b', 30_000);
    const before = await leaseRow(admin, 'l12');
    assert.equal(await p.renewLease('l12', 'a', 90_000), false);
    assert.deepEqual((await leaseRow(admin, 'l12')).expires_at, before.expires_at);
  });

  test('L13 transfer a->b while held: owner b, full fresh TTL, new token', async () => {
    const a = await p.acquireLease('l13', 'a', 5_000);
    assert.equal(await p.transferLease('l13', 'a', 'b', 90_000), true);
    const row = await leaseRow(admin, 'l13');
    assert.equal(row.owner, 'b');
    assert.equal(row.token, a.token + 1);
    assert.equal(row.expires_at.getTime() - row.acquired_at.getTime(), 90_000);
    assert.equal(await p.getLeaseOwner('l13'), 'b');
  });

  test('L14 transfer from an expired holder: false, key stays free', async () => {
    await p.acquireLease('l14', 'a', 30_000);
    await expire(admin, 'l14');
    assert.equal(await p.transferLease('l14', 'a', 'b', 30_000), false);
    assert.equal(await p.getLeaseOwner('l14'), undefined);
    assert.equal((await p.acquireLease('l14', 'b', 30_000)).acquired, true);
  });

  test('L15 transfer from a while c holds: false, c keeps it', async () => {
    await p.acquireLease('l15', 'c', 30_000);
    assert.equal(await p.transferLease('l15', 'a', 'b', 30_000), false);
    assert.equal(await p.getLeaseOwner('l15'), 'c');
  });

  test('L16 transfer a->a: true, TTL refreshed, token kept (documented)', async () => {
    const a = await p.acquireLease('l16', 'a', 5_000);
    assert.equal(await p.transferLease('l16', 'a', 'a', 60_000), true);
    const row = await leaseRow(admin, 'l16');
    assert.equal(row.token, a.token);
    assert.equal(row.expires_at.getTime() - row.renewed_at.getTime(), 60_000);
  });

  test('L17 a closed provider rejects with ProviderClosedError, never a false success', async () => {
    const q = new PgDurablePubSub({ connectionString: db.dsn });
    assert.equal((await q.acquireLease('l17', 'a', 30_000)).acquired, true);
    await q.close();
    for (const call of [() => q.acquireLease('l17b', 'a', 30_000), () => q.getLeaseOwner('l17'),
                        () => q.releaseLease('l17', 'a'), () => q.renewLease('l17', 'a', 1000),
                        () => q.transferLease('l17', 'a', 'b', 1000)]) {
      await assert.rejects(call, ProviderClosedError);
    }
    assert.equal(await p.getLeaseOwner('l17'), 'a');
    assert.equal(await p.getLeaseOwner('l17b'), undefined);
  });

  test('L18 client clocks skewed +-10 s change nothing: expiry is the database\'s', async () => {
    const realNow = Date.now;
    for (const skew of [10_000, -10_000]) {
      Date.now = () => realNow() + skew;
      try {
        const key = `l18${skew}`;
        await p.acquireLease(key, 'a', 30_000);
        const row = await leaseRow(admin, key);
        assert.equal(row.expires_at.getTime() - row.renewed_at.getTime(), 30_000);
        assert.equal((await p.acquireLease(key, 'b', 30_000)).acquired, false);
        assert.equal(await p.renewLease(key, 'a', 30_000), true);
      } finally {
        Date.now = realNow;
      }
    }
  });

  test('L19 arbitrary strings round-trip; one key never touches another', async () => {
    const names = ["it's", '100%', '"quoted"', '🦀 ünïcödé', 'x'.repeat(10_000), 'a\0b', '\0', 'user\0thread',
                   'back\\slash', '\\x00'];
    for (const [i, key] of names.entries()) {
      const owner = names[(i + 1) % names.length];
      const g = await p.acquireLease(key, owner, 30_000);
      assert.deepEqual([g.acquired, g.owner], [true, owner], key);
      assert.equal(await p.getLeaseOwner(key), owner);
      const loser = await p.acquireLease(key, 'other', 30_000);
      assert.equal(loser.owner, owner);
    }
    // 'a\0b' and 'a' are different keys; releasing one leaves the others.
    await p.releaseLease('a\0b', names[6]);
    assert.equal(await p.getLeaseOwner('a\0b'), undefined);
    assert.equal(await p.getLeaseOwner('\0'), names[7]);
    assert.equal(await p.getLeaseOwner('a'), undefined);
    const row = await leaseRow(admin, 'user\0thread');
    assert.equal(row.owner, 'back\\slash');
  });

  test('bad input is a TypeError/RangeError before any SQL, and changes nothing', async () => {
    await assert.rejects(() => p.acquireLease('', 'a', 1000), RangeError);
    await assert.rejects(() => p.acquireLease('k', '', 1000), RangeError);
    await assert.rejects(() => p.acquireLease(1, 'a', 1000), TypeError);
    await assert.rejects(() => p.acquireLease('k', null, 1000), TypeError);
    await assert.rejects(() => p.acquireLease('k\uD800', 'a', 1000), RangeError);
    await assert.rejects(() => p.acquireLease('k', 'a', 0), RangeError);
    await assert.rejects(() => p.acquireLease('k', 'a', MAX_TTL_MS + 1), RangeError);
    await assert.rejects(() => p.acquireLease('k', 'a', 1.5), TypeError);
    await assert.rejects(() => p.renewLease('k', 'a', -1), RangeError);
    await assert.rejects(() => p.transferLease('k', 'a', '', 1000), RangeError);
    const r = await admin.query("SELECT count(*)::int AS n FROM pgdurable.leases WHERE key = 'k'::bytea");
    assert.equal(r.rows[0].n, 0);
    // The database's own check (PD000) maps to InvalidInputError.
    await assert.rejects(() => admin.query("SELECT pgdurable.acquire_lease(''::bytea, 'a'::bytea, 10)"),
                         (err) => err.code === 'PD000');
    assert.ok(new InvalidInputError('x') instanceof Error);
  });

  test('an unmigrated database is a SchemaVersionMismatchError, not a silent failure', async () => {
    const empty = await freshDatabase('empty', { migrate: false });
    const q = new PgDurablePubSub({ connectionString: empty.dsn });
    try {
      await assert.rejects(() => q.acquireLease('k', 'a', 1000), SchemaVersionMismatchError);
      await assert.rejects(() => q.publish('t', { type: 't', runId: 'r', data: {} }), SchemaVersionMismatchError);
    } finally {
      await q.close();
      await empty.drop();
    }
  });

  test('a broken connection is retried once for idempotent calls', async () => {
    await p.acquireLease('retry', 'a', 30_000);
    await admin.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgdurable-mastra' AND pid <> pg_backend_pid()");
    assert.equal(await p.renewLease('retry', 'a', 30_000), true);
    assert.equal(await p.getLeaseOwner('retry'), 'a');
  });
});

describe('lease races in several Node processes', () => {
  test('L5 N processes acquire a free key at once: exactly one wins, every loser names it', async () => {
    for (let round = 0; round < 3; round++) {
      const key = `l5-${round}`;
      const children = await atBarrier('_lease_child.mjs', 6, { DSN: db.dsn, MODE: 'acquire', KEY: key });
      const results = await Promise.all(children.map((c) => c.next((m) => m.result).then((m) => m.result)));
      const winners = results.filter((r) => r.acquired);
      assert.equal(winners.length, 1, JSON.stringify(results));
      const winner = winners[0].owner;
      for (const r of results.filter((x) => !x.acquired)) assert.equal(r.owner, winner);
      assert.equal(await p.getLeaseOwner(key), winner);
    }
  });

  test('L7 under acquire/release churn a loser never sees owner=undefined', async () => {
    const children = await atBarrier('_lease_child.mjs', 4,
                                     { DSN: db.dsn, MODE: 'churn', KEY: 'l7', ROUNDS: '150' });
    const results = await Promise.all(children.map((c) => c.next((m) => m.result).then((m) => m.result)));
    assert.ok(results.reduce((n, r) => n + r.won, 0) > 0);
    for (const r of results) assert.equal(r.lostWithoutOwner, 0, JSON.stringify(results));
  });

  test('L13 hammering acquire(c) during many transfers never lets c in', async () => {
    await p.acquireLease('l13h', 'o0', 60_000);
    const children = await atBarrier('_lease_child.mjs', 3,
                                     { DSN: db.dsn, MODE: 'hammer', KEY: 'l13h', ROUNDS: '200', OWNER: 'c' });
    const done = Promise.all(children.map((c) => c.next((m) => m.result).then((m) => m.result)));
    let i = 0;
    let finished = false;
    void done.then(() => { finished = true; });
    while (!finished || i < 50) {
      assert.equal(await p.transferLease('l13h', `o${i}`, `o${i + 1}`, 60_000), true);
      i++;
    }
    const results = await done;
    for (const r of results) {
      assert.equal(r.won, 0);
      assert.ok(!r.seen.includes('<none>'));
    }
    assert.equal(await p.getLeaseOwner('l13h'), `o${i}`);
    assert.equal((await leaseRow(admin, 'l13h')).token, 1 + i);
  });
});
