// The examples run against a fresh migrated database.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { after, before, test } from 'node:test';

import { PACKAGE_DIR, freshDatabase } from './helpers.mjs';

let db;
before(async () => { db = await freshDatabase('examples'); });
after(async () => { await db?.drop(); });

test('examples/thread-owner.mjs: one of two Mastra instances owns the thread', () => {
  const r = spawnSync(process.execPath, [resolve(PACKAGE_DIR, 'examples', 'thread-owner.mjs')], {
    cwd: PACKAGE_DIR, env: { ...process.env, DATABASE_URL: db.dsn }, encoding: 'utf8', timeout: 120_000,
  });
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`);
  assert.match(r.stdout, /runs started: 1 \(expected 1\)/);
  assert.match(r.stdout, /: deliver -> run /);
});
