// Another schema (pgdurable's docs/schemas.md): `schema` (else $PGDURABLE_SCHEMA) makes
// every statement, prepared-statement name and the LISTEN channel the schema's, on a
// database that has no `pgdurable` schema at all; two schemas in one database share
// nothing (a topic of one is not the other's, a lease of one is not the other's).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';

import pg from 'pg';

import { InvalidInputError, PgDurablePubSub } from '../dist/esm/index.js';
import { REPO_DIR, freshDatabase, python, waitFor } from './helpers.mjs';

let db;
const opened = [];

function open(options) {
  const ps = new PgDurablePubSub({ connectionString: db.dsn, ...options });
  opened.push(ps);
  return ps;
}

before(async () => {
  db = await freshDatabase('schema', { migrate: false });
  for (const schema of ['tenant_m', 'tenant_n']) {
    const r = spawnSync(python(), ['-m', 'pgdurable', '--schema', schema, 'migrate', '--dsn', db.dsn],
      { cwd: REPO_DIR, encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
  }
});

after(async () => {
  for (const ps of opened) await ps.close();
  await db?.drop();
});

describe('PgDurablePubSub in a schema of its own', () => {
  test('publishes, subscribes and leases in its schema; the other schema sees none of it', async () => {
    const m = open({ schema: 'tenant_m' });
    const n = open({ schema: 'tenant_n' });
    const got = { m: [], n: [] };
    await m.subscribe('topic', (e) => got.m.push(e.data.i));
    await n.subscribe('topic', (e) => got.n.push(e.data.i));
    for (let i = 0; i < 3; i++) await m.publish('topic', { type: 't', runId: 'r', data: { i } });
    await n.publish('topic', { type: 't', runId: 'r', data: { i: 100 } });
    await waitFor(() => got.m.length === 3 && got.n.length === 1, 'both schemas\' events');
    assert.deepEqual(got, { m: [0, 1, 2], n: [100] });
    // the same lease key in both schemas: two leases
    assert.equal((await m.acquireLease('k', 'owner-m', 60_000)).acquired, true);
    assert.equal((await n.acquireLease('k', 'owner-n', 60_000)).acquired, true);
    assert.equal(await m.getLeaseOwner('k'), 'owner-m');
    assert.equal(await n.getLeaseOwner('k'), 'owner-n');
    const c = new pg.Client({ connectionString: db.dsn });
    await c.connect();
    try {
      const r = await c.query(`SELECT (SELECT count(*) FROM tenant_m.pubsub_events)::int AS m,
                                      (SELECT count(*) FROM tenant_n.pubsub_events)::int AS n,
                                      to_regnamespace('pgdurable') IS NULL AS no_default`);
      assert.deepEqual(r.rows[0], { m: 3, n: 1, no_default: true });
    } finally {
      await c.end();
    }
  });

  test('$PGDURABLE_SCHEMA is the default; a bad name is InvalidInputError before any SQL', async () => {
    process.env.PGDURABLE_SCHEMA = 'tenant_n';
    try {
      const ps = open({});
      await ps.publish('env', { type: 't', runId: 'r', data: {} });
      assert.equal((await ps.getHistory('env')).length, 1);
    } finally {
      delete process.env.PGDURABLE_SCHEMA;
    }
    for (const bad of ['Tenant', 'public', 'pg_x', 'a;drop', '', 'x'.repeat(49), 7]) {
      assert.throws(() => new PgDurablePubSub({ connectionString: db.dsn, schema: bad }), InvalidInputError);
    }
    // the default schema does not exist here: said, with the command that makes it
    const plain = open({});
    await assert.rejects(plain.publish('x', { type: 't', runId: 'r', data: {} }), /pgdurable migrate/);
  });
});
