// Test helpers: a fresh database per test file, migrated by the repo's own
// Python `pgdurable migrate`; child Node/Python processes started at a barrier.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';

import pg from 'pg';

export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_DIR = resolve(PACKAGE_DIR, '..', '..');

/** The server to test against (a database is created on it per test file). */
export const BASE_DSN = process.env.PGDURABLE_TEST_DSN ?? process.env.DATABASE_URL
  ?? 'postgresql://postgres@127.0.0.1:5432/postgres';

/** The Python that has pgdurable installed: $PGDURABLE_PYTHON or the repo's .venv. */
export function python() {
  const p = process.env.PGDURABLE_PYTHON ?? resolve(REPO_DIR, '.venv', 'bin', 'python');
  if (!existsSync(p)) throw new Error(`no Python with pgdurable at ${p}: run \`make install\` or set PGDURABLE_PYTHON`);
  return p;
}

function withDatabase(dsn, name) {
  const url = new URL(dsn);
  url.pathname = `/${name}`;
  return url.toString();
}

let counter = 0;

/**
 * Create a fresh database, migrate it with `python -m pgdurable migrate` (unless
 * `migrate: false`),
 * return `{ dsn, drop }`. Names include the pid (parallel runs are fine).
 */
export async function freshDatabase(label = 'db', { migrate = true } = {}) {
  const name = `pgdm_${label}_${process.pid}_${Date.now() % 100000}_${counter++}`;
  const admin = new pg.Client({ connectionString: BASE_DSN });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const dsn = withDatabase(BASE_DSN, name);
  const drop = async () => {
    const c = new pg.Client({ connectionString: BASE_DSN });
    await c.connect();
    try {
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    } finally {
      await c.end();
    }
  };
  if (migrate) {
    // Migrating is idempotent; on a shared server another suite may terminate our
    // connection (pg_terminate_backend), so a migration that lost it runs again.
    for (let attempt = 1; ; attempt++) {
      const r = spawnSync(python(), ['-m', 'pgdurable', 'migrate', '--dsn', dsn], {
        cwd: REPO_DIR, encoding: 'utf8',
      });
      if (r.status === 0) break;
      const lost = /database went away|terminating connection|connection.*(closed|lost)/i.test(r.stderr + r.stdout);
      if (!lost || attempt === 3) {
        await drop();
        throw new Error(`pgdurable migrate failed: ${r.stderr}${r.stdout}`);
      }
    }
  }
  return { dsn, drop };
}

/** A connected pg.Client on `dsn` (close with `.end()`). */
export async function sql(dsn) {
  const c = new pg.Client({ connectionString: dsn });
  await c.connect();
  return c;
}

/** Seed an expiry: the lease on `key` lapsed `by` ago on the database clock. */
export async function expire(client, key, by = '1 second') {
  await client.query(
    "UPDATE pgdurable.leases SET expires_at = pgdurable.now() - $2::interval WHERE key = $1 AND owner IS NOT NULL",
    [Buffer.from(key, 'utf8'), by]);
}

/** The raw lease row of `key` ({owner (string), token (number), expires_at, acquired_at, renewed_at}). */
export async function leaseRow(client, key) {
  const r = await client.query(
    'SELECT owner, token, expires_at, acquired_at, renewed_at FROM pgdurable.leases WHERE key = $1',
    [Buffer.from(key, 'utf8')]);
  const row = r.rows[0];
  if (!row) return undefined;
  return { ...row, owner: row.owner === null ? null : row.owner.toString('utf8'), token: Number(row.token) };
}

/**
 * A child process speaking JSON lines: it prints one `{"ready":true}` line when
 * set up, waits for a line on stdin (the barrier), then prints its results.
 */
export class Child {
  constructor(command, args, env = {}) {
    this.proc = spawn(command, args, { cwd: PACKAGE_DIR, env: { ...process.env, ...env },
                                       stdio: ['pipe', 'pipe', 'pipe'] });
    this.lines = [];
    this.waiters = [];
    this.stderr = '';
    this.proc.stderr.on('data', (d) => { this.stderr += d; });
    createInterface({ input: this.proc.stdout }).on('line', (line) => {
      let msg;
      try { msg = JSON.parse(line); } catch { msg = { text: line }; }
      this.lines.push(msg);
      for (const w of this.waiters.splice(0)) w();
    });
    this.exited = new Promise((res) => this.proc.on('exit', (code, signal) => res({ code, signal })));
  }

  /** The first message for which `pred` holds (waits for it; rejects if the child exits first). */
  async next(pred = () => true) {
    for (;;) {
      const found = this.lines.find(pred);
      if (found) {
        this.lines.splice(this.lines.indexOf(found), 1);
        return found;
      }
      const exited = await Promise.race([
        new Promise((res) => this.waiters.push(() => res(false))),
        this.exited.then(() => true),
      ]);
      if (exited && !this.lines.find(pred)) {
        throw new Error(`child exited without the expected message; stderr:\n${this.stderr}`);
      }
    }
  }

  send(obj) {
    this.proc.stdin.write(`${JSON.stringify(obj)}\n`);
  }

  kill() {
    if (this.proc.exitCode === null) this.proc.kill('SIGKILL');
  }
}

/** Start `n` children of `script` (a file in test/), wait until all are ready, release them at once. */
export async function atBarrier(script, n, env, argsFor = () => []) {
  const children = Array.from({ length: n }, (_, i) => new Child(process.execPath,
    [resolve(PACKAGE_DIR, 'test', script), ...argsFor(i)], { ...env, CHILD_INDEX: String(i) }));
  try {
    await Promise.all(children.map((c) => c.next((m) => m.ready === true)));
  } catch (err) {
    for (const c of children) c.kill();
    throw err;
  }
  for (const c of children) c.send({ go: true });
  return children;
}

/** Wait until `pred()` holds (checked every 20 ms; fails after `ms`, a generous bound, never a measurement). */
export async function waitFor(pred, what, ms = 30_000) {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
