// Interop with pgdurable's Python lease provider on the same database: the
// same rows serve both languages (keys and owners as UTF-8 bytea, NUL included).
import assert from 'node:assert/strict';
import { resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { PgDurablePubSub } from '../dist/esm/index.js';
import { Child, PACKAGE_DIR, freshDatabase, leaseRow, python, sql } from './helpers.mjs';

let db;
let ts;
let py;
let admin;

/** One request to the Python provider (a pgdurable.PostgresLeaseProvider in a child process). */
async function pyCall(op, ...args) {
  py.send({ op, args });
  const m = await py.next((x) => x.reply !== undefined);
  return m.reply;
}

before(async () => {
  db = await freshDatabase('interop');
  ts = new PgDurablePubSub({ connectionString: db.dsn });
  admin = await sql(db.dsn);
  py = new Child(python(), [resolve(PACKAGE_DIR, 'test', '_py_leases.py'), db.dsn]);
  await py.next((m) => m.ready === true);
});

after(async () => {
  py?.proc.stdin.end();
  await py?.exited;
  await ts?.close();
  await admin?.end();
  await db?.drop();
});

const KEY = 'resource-🦀\0thread "1" 100%';

describe('shared with Python', () => {
  test('a Python holder makes a TypeScript acquire lose and name the Python owner', async () => {
    const g = await pyCall('acquire', KEY, 'python-run\0attempt-1', 30_000);
    assert.equal(g.acquired, true);
    const t = await ts.acquireLease(KEY, 'ts-run', 30_000);
    assert.deepEqual([t.acquired, t.owner, t.token], [false, 'python-run\0attempt-1', g.token]);
    assert.equal(await ts.getLeaseOwner(KEY), 'python-run\0attempt-1');
    // A TypeScript release by the wrong owner is a no-op; the Python owner releases.
    await ts.releaseLease(KEY, 'ts-run');
    assert.equal((await pyCall('owner', KEY)).owner, 'python-run\0attempt-1');
    await pyCall('release', KEY, 'python-run\0attempt-1');
    assert.equal(await ts.getLeaseOwner(KEY), undefined);
  });

  test('a TypeScript holder makes a Python acquire lose and name the TypeScript owner', async () => {
    const key = 'user-1\0thread-ts';
    const t = await ts.acquireLease(key, 'ts-run ünï', 30_000);
    assert.equal(t.acquired, true);
    const g = await pyCall('acquire', key, 'python-run', 30_000);
    assert.deepEqual([g.acquired, g.owner, g.token], [false, 'ts-run ünï', t.token]);
    assert.equal((await pyCall('renew', key, 'python-run', 30_000)).renewed, false);
    assert.equal(await ts.renewLease(key, 'ts-run ünï', 30_000), true);
  });

  test('a TypeScript transfer is seen by Python with the new token', async () => {
    const key = 'user-2\0thread-transfer';
    const a = await ts.acquireLease(key, 'run-a', 30_000);
    assert.equal(await ts.transferLease(key, 'run-a', 'run-b\0py', 30_000), true);
    const seen = await pyCall('lease', key);
    assert.deepEqual(seen, { owner: 'run-b\0py', token: a.token + 1 });
    // and the new owner (in Python) can work with it: renew, then hand it back.
    assert.equal((await pyCall('renew', key, 'run-b\0py', 30_000)).renewed, true);
    assert.equal((await pyCall('transfer', key, 'run-b\0py', 'run-c', 30_000)).transferred, true);
    const c = await ts.acquireLease(key, 'run-c', 30_000); // same-owner re-acquire keeps the token
    assert.deepEqual([c.acquired, c.owner, c.token], [true, 'run-c', a.token + 2]);
    assert.equal((await leaseRow(admin, key)).owner, 'run-c');
  });

  test('a Python transfer is seen by TypeScript with the new token; the old owner is fenced', async () => {
    const key = 'user-3\0thread-py-transfer';
    const g = await pyCall('acquire', key, 'py-a', 30_000);
    assert.equal((await pyCall('transfer', key, 'py-a', 'ts-b', 30_000)).transferred, true);
    assert.equal(await ts.getLeaseOwner(key), 'ts-b');
    const b = await ts.acquireLease(key, 'ts-b', 30_000);
    assert.deepEqual([b.acquired, b.token], [true, g.token + 1]);
    assert.equal(await ts.transferLease(key, 'py-a', 'x', 30_000), false);
    assert.equal((await pyCall('renew', key, 'py-a', 30_000)).renewed, false);
  });
});
