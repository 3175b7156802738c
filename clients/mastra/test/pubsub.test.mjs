// PubSub on pgdurable's tables: order and offsets, concurrent publishers in
// several processes, replay from an offset, a dropped LISTEN connection
// (pg_terminate_backend) replayed with no gap and no duplicate, groups,
// localOnly, clearTopic and retention.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { PubSub } from '@mastra/core/events';

import { PgDurablePubSub } from '../dist/esm/index.js';
import { atBarrier, freshDatabase, sql, waitFor } from './helpers.mjs';

let db;
let admin;
const opened = [];

function open(options = {}) {
  const ps = new PgDurablePubSub({ connectionString: db.dsn, ...options });
  opened.push(ps);
  return ps;
}

/** A subscriber that records events and fails on any gap or duplicate in `index`. */
function recorder() {
  const events = [];
  const problems = [];
  const cb = (e) => {
    const last = events.at(-1);
    if (last && e.index !== last.index + 1) problems.push(`index ${e.index} after ${last.index}`);
    events.push(e);
  };
  return { cb, events, problems };
}

before(async () => {
  db = await freshDatabase('pubsub');
  admin = await sql(db.dsn);
});

after(async () => {
  for (const ps of opened) await ps.close();
  await admin?.end();
  await db?.drop();
});

describe('PgDurablePubSub events', () => {
  test('is a Mastra PubSub with offsets; publish -> subscribe in order with index, createdAt, data', async () => {
    const ps = open();
    assert.ok(ps instanceof PubSub);
    assert.equal(ps.supportsOffsets, true);
    assert.deepEqual(ps.supportedModes, ['pull']);
    const r = recorder();
    await ps.subscribe('basic', r.cb);
    const data = { text: 'a\0b "q" 100% 🦀', nested: { list: [1, null, true] } };
    for (let i = 0; i < 5; i++) await ps.publish('basic', { type: 'step', runId: 'run\0key', data: { ...data, i } });
    await waitFor(() => r.events.length === 5, '5 events');
    assert.deepEqual(r.events.map((e) => e.index), [0, 1, 2, 3, 4]);
    assert.deepEqual(r.events.map((e) => e.data.i), [0, 1, 2, 3, 4]);
    assert.equal(r.events[0].runId, 'run\0key');
    assert.equal(r.events[0].data.text, data.text);
    assert.deepEqual(r.events[0].data.nested, data.nested);
    assert.ok(r.events[0].createdAt instanceof Date);
    assert.equal(r.events[0].deliveryAttempt, 1);
    assert.equal(new Set(r.events.map((e) => e.id)).size, 5);
    await ps.unsubscribe('basic', r.cb);
    await ps.publish('basic', { type: 'step', runId: 'r', data: {} });
    await ps.flush();
    assert.equal(r.events.length, 5);
  });

  test('publishers in 3 processes: every reader gets all offsets, no gap, no duplicate', async () => {
    const reader = open();
    const r = recorder();
    await reader.subscribe('race', r.cb, { startFrom: 'latest' });
    const children = await atBarrier('_pubsub_child.mjs', 3, { DSN: db.dsn, TOPIC: 'race', ROUNDS: '100' });
    await Promise.all(children.map((c) => c.next((m) => m.result)));
    await waitFor(() => r.events.length >= 300, '300 events');
    await reader.flush();
    assert.deepEqual(r.problems, []);
    assert.equal(r.events.length, 300);
    assert.deepEqual(r.events.map((e) => e.index), Array.from({ length: 300 }, (_, i) => i));
    for (const src of [0, 1, 2]) {
      const mine = r.events.filter((e) => e.data.src === src).map((e) => e.data.i);
      assert.deepEqual(mine, Array.from({ length: 100 }, (_, i) => i), `source ${src} in its order`);
    }
    // a late reader replaying from an offset sees the same sequence
    const late = recorder();
    await open().subscribeFromOffset('race', 250, late.cb);
    await waitFor(() => late.events.length === 50, 'replay from 250');
    assert.deepEqual(late.events.map((e) => e.index), Array.from({ length: 50 }, (_, i) => 250 + i));
  });

  test('offsets commit in order: a second publisher waits for the first one\'s transaction', async () => {
    const a = await sql(db.dsn);
    const b = await sql(db.dsn);
    const reader = open();
    const ev = (id) => [JSON.stringify({ id, type: 't', runId: 'r', data: {} })];
    try {
      await a.query('BEGIN');
      const first = await a.query('SELECT pgdurable.pubsub_publish($1, $2::json[]) AS o', ['ordered', ev('a')]);
      assert.equal(Number(first.rows[0].o), 0);
      const bPid = (await b.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      const second = b.query('SELECT pgdurable.pubsub_publish($1, $2::json[]) AS o', ['ordered', ev('b')]);
      // b must queue behind a's uncommitted offset (on the topic's counter row), not
      // take offset 1 and commit first: a reader past 1 would then never see 0.
      for (;;) {
        const w = await admin.query('SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1', [bPid]);
        if (w.rows[0]?.wait_event_type === 'Lock') break;
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.deepEqual(await reader.getHistory('ordered'), []);
      await a.query('COMMIT');
      assert.equal(Number((await second).rows[0].o), 1);
      assert.deepEqual((await reader.getHistory('ordered')).map((e) => [e.index, e.id]), [[0, 'a'], [1, 'b']]);
    } finally {
      await a.end();
      await b.end();
    }
  });

  test('concurrent publishes to a topic share one statement and one NOTIFY', async () => {
    const listener = await sql(db.dsn);
    const notes = [];
    listener.on('notification', (n) => { if (n.payload?.endsWith(' burst')) notes.push(n.payload); });
    await listener.query('LISTEN pgdurable_pubsub');
    const ps = open();
    await Promise.all(Array.from({ length: 100 }, (_, i) => ps.publish('burst', { type: 't', runId: 'r', data: { i } })));
    await listener.query('SELECT 1'); // notifications of committed publishes have arrived before this reply
    await waitFor(() => notes.length >= 1, 'a notification');
    assert.ok(notes.length <= 2, `${notes.length} notifications for 100 events`);
    assert.equal(notes.at(-1), '99 burst'); // the payload is a position: last offset + topic
    assert.equal((await ps.getHistory('burst')).length, 100);
    await listener.end();
  });

  test('getHistory, subscribeWithReplay and subscribeFromOffset: replay then live, no gap, no duplicate', async () => {
    const ps = open();
    for (let i = 0; i < 10; i++) await ps.publish('hist', { type: 't', runId: 'r', data: { i } });
    assert.deepEqual((await ps.getHistory('hist')).map((e) => e.index), [...Array(10).keys()]);
    assert.deepEqual((await ps.getHistory('hist', 7)).map((e) => e.data.i), [7, 8, 9]);
    assert.deepEqual(await ps.getHistory('nothing-here'), []);
    const all = recorder();
    const from6 = recorder();
    await ps.subscribeWithReplay('hist', all.cb);
    await ps.subscribeFromOffset('hist', 6, from6.cb);
    await Promise.all([10, 11, 12].map((i) => ps.publish('hist', { type: 't', runId: 'r', data: { i } })));
    await waitFor(() => all.events.length === 13 && from6.events.length === 7, 'replay + live');
    assert.deepEqual(all.problems, []);
    assert.deepEqual(from6.events.map((e) => e.index), [6, 7, 8, 9, 10, 11, 12]);
    const latest = recorder();
    await ps.subscribe('hist', latest.cb, { startFrom: 'latest' });
    await ps.publish('hist', { type: 't', runId: 'r', data: { i: 13 } });
    await waitFor(() => latest.events.length === 1, 'latest');
    assert.equal(latest.events[0].index, 13);
  });

  test('a dropped LISTEN connection (pg_terminate_backend): the reader replays from its position', async () => {
    const reader = open({ applicationName: 'pgdm-dropped', pollIntervalMs: 0, reconnectDelayMs: 1500 });
    const writer = open();
    const r = recorder();
    await reader.subscribe('dropped', r.cb);
    for (let i = 0; i < 5; i++) await writer.publish('dropped', { type: 't', runId: 'r', data: { i } });
    await waitFor(() => r.events.length === 5, 'first 5');
    const killed = await admin.query(
      "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgdm-dropped-listener'");
    assert.deepEqual(killed.rows.map((x) => x.ok), [true]);
    // Published while the listener is gone (it waits 1.5 s before reconnecting, and
    // polling is off): these NOTIFYs reach nobody; only the replay can deliver them.
    for (let i = 5; i < 15; i++) await writer.publish('dropped', { type: 't', runId: 'r', data: { i } });
    await waitFor(() => r.events.length >= 15, 'replayed events');
    await reader.flush();
    assert.deepEqual(r.problems, []);
    assert.deepEqual(r.events.map((e) => e.data.i), [...Array(15).keys()]);
    assert.equal(reader.listenerReconnects, 1);
    // and it is live again
    await writer.publish('dropped', { type: 't', runId: 'r', data: { i: 15 } });
    await waitFor(() => r.events.length === 16, 'live after reconnect');
  });

  test('groups: each event goes to exactly one member across instances; a nack redelivers', async () => {
    const a = open();
    const b = open();
    const got = [];
    const member = (name) => (e, ack) => { got.push([name, e.data.i]); return ack?.(); };
    await a.subscribe('jobs', member('a'), { group: 'workers' });
    await b.subscribe('jobs', member('b'), { group: 'workers' });
    const pub = open();
    await Promise.all(Array.from({ length: 60 }, (_, i) => pub.publish('jobs', { type: 'job', runId: 'r', data: { i } })));
    await waitFor(() => got.length >= 60, '60 jobs');
    await a.flush();
    await b.flush();
    assert.equal(got.length, 60);
    assert.deepEqual(got.map(([, i]) => i).sort((x, y) => x - y), [...Array(60).keys()]);

    const attempts = [];
    const flaky = async (e, _ack, nack) => {
      attempts.push(e.deliveryAttempt);
      if (e.deliveryAttempt < 3) await nack();
    };
    await a.subscribe('flaky', flaky, { group: 'g' });
    await pub.publish('flaky', { type: 'job', runId: 'r', data: {} });
    await waitFor(() => attempts.length === 3, 'three attempts');
    assert.deepEqual(attempts, [1, 2, 3]);
  });

  test('localOnly events stay in the process and are not stored', async () => {
    const here = open();
    const there = open();
    const mine = recorder();
    const theirs = recorder();
    await here.subscribe('local', mine.cb);
    await there.subscribe('local', theirs.cb);
    await here.publish('local', { type: 'live-value', runId: 'r', data: { fn: () => 1 } }, { localOnly: true });
    assert.equal(mine.events.length, 1);
    assert.equal(typeof mine.events[0].data.fn, 'function');
    await here.publish('local', { type: 'stored', runId: 'r', data: {} });
    await waitFor(() => theirs.events.length === 1, 'the stored event');
    assert.equal(theirs.events[0].type, 'stored');
    assert.deepEqual((await here.getHistory('local')).map((e) => e.type), ['stored']);
  });

  test('clearTopic deletes a topic\'s events (offsets keep growing); prune removes abandoned topics', async () => {
    const ps = open();
    for (let i = 0; i < 3; i++) await ps.publish('finished-run', { type: 't', runId: 'r', data: { i } });
    await ps.clearTopic('finished-run');
    assert.deepEqual(await ps.getHistory('finished-run'), []);
    await ps.publish('finished-run', { type: 't', runId: 'r', data: { i: 3 } });
    assert.deepEqual((await ps.getHistory('finished-run')).map((e) => e.index), [3]);
    await ps.clearTopic(''); // best effort: never throws
    await ps.publish('abandoned', { type: 't', runId: 'r', data: {} });
    await ps.publish('fresh', { type: 't', runId: 'r', data: {} });
    await admin.query("UPDATE pgdurable.pubsub_topics SET updated_at = pgdurable.now() - interval '8 days' WHERE topic = 'abandoned'");
    const deleted = await ps.prune(7 * 24 * 3600 * 1000, 1);
    assert.equal(deleted, 2); // its event, then the topic row
    const left = await admin.query("SELECT topic FROM pgdurable.pubsub_topics WHERE topic IN ('abandoned', 'fresh')");
    assert.deepEqual(left.rows.map((x) => x.topic), ['fresh']);
    assert.equal((await ps.getHistory('fresh')).length, 1);
  });

  test('bad input is refused before any SQL', async () => {
    const ps = open();
    const ev = { type: 't', runId: 'r', data: {} };
    await assert.rejects(() => ps.publish('', ev), RangeError);
    await assert.rejects(() => ps.publish('a\0b', ev), RangeError);
    await assert.rejects(() => ps.publish(3, ev), TypeError);
    await assert.rejects(() => ps.subscribe('t', 'not a function'), TypeError);
    await assert.rejects(() => ps.subscribe('t', () => {}, { group: '' }), RangeError);
    await assert.rejects(() => ps.subscribeFromOffset('t', -1, () => {}), RangeError);
    await assert.rejects(() => ps.getHistory('t', 1.5), RangeError);
    await assert.rejects(() => ps.prune(-1), RangeError);
    assert.deepEqual(await ps.getHistory('t'), []);
  });

  test('a topic or group with a lone surrogate is a RangeError: three such topics were one (U+FFFD)', async () => {
    // pg encodes a string to UTF-8 with U+FFFD for a lone surrogate, so these three
    // different topics were one row: each read the others' events
    const ps = open();
    const ev = { type: 't', runId: 'r', data: {} };
    for (const topic of ['lone\uD800', 'lone\uDBFF', 'lone\uDC00']) {
      await assert.rejects(() => ps.publish(topic, ev), RangeError);
      await assert.rejects(() => ps.subscribe(topic, () => {}), RangeError);
      await assert.rejects(() => ps.subscribeWithReplay(topic, () => {}), RangeError);
      await assert.rejects(() => ps.subscribeFromOffset(topic, 0, () => {}), RangeError);
      await assert.rejects(() => ps.getHistory(topic), RangeError);
      await assert.rejects(() => ps.subscribe('t', () => {}, { group: `g${topic}` }), RangeError);
    }
    await ps.clearTopic('lone\uD800'); // best effort: never throws (and deletes nothing)
    const stored = await admin.query("SELECT count(*)::int AS n FROM pgdurable.pubsub_topics WHERE topic LIKE 'lone%'");
    assert.equal(stored.rows[0].n, 0, 'nothing stored');
    // a well-formed pair is one character, not a lone surrogate: accepted
    await ps.publish('pair\uD83D\uDE00', ev);
    assert.equal((await ps.getHistory('pair\u{1F600}')).length, 1);
  });
});
