/**
 * `PgDurablePubSub`: Mastra's `PubSub` and `LeaseProvider` on pgdurable's
 * PostgreSQL tables, so a Mastra app needs no Redis.
 *
 * Leases
 * ======
 * `acquireLease`, `getLeaseOwner`, `releaseLease`, `renewLease` and
 * `transferLease` are each ONE call to pgdurable's SQL lease functions
 * (sql/0002_leases.sql), the ones the Python provider uses, on the same rows:
 * an atomic acquire that names the live holder to the loser, owner-checked
 * release and renew (a renew never resurrects), a transfer that never frees
 * the key in between (a -> a refreshes the TTL), and time from the database
 * clock only. A closed provider rejects with {@link ProviderClosedError},
 * never a false success. A connection that broke is retried once on a fresh
 * connection for the idempotent calls (all but transfer, whose repeat would
 * wrongly report false); otherwise {@link DatabaseUnavailableError}.
 *
 * Events
 * ======
 * `publish` appends to a topic's log (`pgdurable.pubsub_publish`): offsets
 * 0, 1, 2, ... per topic, committed in order. Concurrent publishes to one
 * topic from this process are coalesced into one statement, which sends ONE
 * `NOTIFY pgdurable_pubsub` carrying a position (topic + last offset), never
 * the event. One dedicated LISTEN connection per instance receives it; each
 * subscriber keeps its own position and reads the events after it in batches
 * (`pgdurable.pubsub_read`). After the listener reconnects (or on the slow
 * safety poll) every subscriber reads on from its position: no gap, no
 * duplicate. Each delivered event carries its offset as `index`.
 *
 * `subscribe(topic, cb, { startFrom })` starts at the oldest retained event
 * (`'earliest'`, Mastra's documented default) or after the current end
 * (`'latest'`). `subscribeFromOffset(topic, n, cb)` replays from offset n
 * then follows live; `subscribeWithReplay` is offset 0; `getHistory` reads.
 * `{ group }` subscribers share a cursor per (topic, group) in the database
 * (`pgdurable.pubsub_claim`): each event goes to one member, across
 * processes (at most once per group; a nack, or a rejected callback,
 * republishes the event with `deliveryAttempt + 1`, up to
 * `maxDeliveryAttempts`). `localOnly` publishes never leave the process.
 * `clearTopic` deletes a topic's events; `prune()` (SQL
 * `pgdurable.prune_pubsub`) deletes topics idle for longer than a cut-off.
 */
import { createHash, randomUUID } from 'node:crypto';

import { PubSub } from '@mastra/core/events';
import type { Event, EventCallback, LeaseProvider, PubSubDeliveryMode, SubscribeOptions } from '@mastra/core/events';
import pg from 'pg';

import {
  ProviderClosedError, SchemaVersionMismatchError, connectionBroke, translate,
} from './errors.js';
import { DEFAULT_SCHEMA, checkSchema, inSchema, statementName } from './schema.js';
import {
  acquireCall, getOwnerCall, isWellFormed, releaseCall, renewCall, transferCall,
  type LeaseCall, type LeaseGrant,
} from './leases.js';

/** Minimal logger (Mastra's `IMastraLogger` fits). */
export interface PgDurableLogger {
  debug?: (message: string, ...args: unknown[]) => void;
  warn?: (message: string, ...args: unknown[]) => void;
  error?: (message: string, ...args: unknown[]) => void;
}

/** Options of {@link PgDurablePubSub}. */
export interface PgDurablePubSubOptions {
  /** PostgreSQL URL or conninfo (default: `$DATABASE_URL`). Ignored when `pool` is given. */
  connectionString?: string;
  /** A `pg.Pool` to use for queries (not ended by `close()`); LISTEN still gets its own connection. */
  pool?: pg.Pool;
  /** Size of the owned pool (default 4). */
  poolSize?: number;
  /** Events read per statement (default 500, at most 10,000). */
  batchSize?: number;
  /** Safety poll of every subscribed topic, in ms (default 5,000; 0 disables). NOTIFY is a hint. */
  pollIntervalMs?: number;
  /** First delay before re-opening a broken LISTEN connection (default 100 ms, doubling to 5 s). */
  reconnectDelayMs?: number;
  /** Deliveries of one event to a group before a nack drops it (default 5). */
  maxDeliveryAttempts?: number;
  /** `application_name` of this package's connections (default `pgdurable-mastra`). */
  applicationName?: string;
  /** Where suppressed errors go (default: nowhere). */
  logger?: PgDurableLogger;
  /**
   * The schema pgdurable lives in (default: `$PGDURABLE_SCHEMA`, else `pgdurable`):
   * apps or tenants sharing a database each have their own (pgdurable's docs/schemas.md).
   */
  schema?: string;
}

type StoredEvent = Pick<Event, 'type' | 'id' | 'data' | 'runId'> & { deliveryAttempt?: number };

interface Row {
  offset: string;
  event: StoredEvent;
  created_at: Date;
}

interface FanoutSub {
  cb: EventCallback;
  /** Offset of the last event delivered to this subscriber (-1: none). */
  position: number;
  /** Not yet positioned (a 'latest' subscriber is positioned at the end first). */
  ready: boolean;
}

interface GroupState {
  name: string;
  fromLatest: boolean;
  members: EventCallback[];
  next: number;
}

interface TopicState {
  topic: string;
  fanout: FanoutSub[];
  groups: Map<string, GroupState>;
  /** A read/claim pass is running; `again` asks it to run once more. */
  running: Promise<void> | undefined;
  again: boolean;
}

interface PendingPublish {
  json: string;
  resolve: () => void;
  reject: (err: unknown) => void;
}

const CHANNEL = 'pgdurable_pubsub';
const LONG_TOPIC_BYTES = 7000;
// -- the pubsub statements (sql/0009 pubsub); one line of contract each.
// -- append events, one NOTIFY -> first offset
const PUBLISH = 'SELECT pgdurable.pubsub_publish($1::text, $2::json[]) AS first';
// -- events after an offset, in order
const READ = 'SELECT "offset", event, created_at FROM pgdurable.pubsub_read($1::text, $2::bigint, $3::integer)';
// -- claim the next events for one member of a group
const CLAIM = 'SELECT "offset", event, created_at FROM pgdurable.pubsub_claim($1::text, $2::text, $3::integer, $4::boolean)';
// -- the topic's last offset (-1: none)
const LAST = 'SELECT pgdurable.pubsub_last_offset($1::text) AS last';
// -- delete a topic's events -> count
const CLEAR = 'SELECT pgdurable.pubsub_clear($1::text) AS deleted';
// -- retention: one batch -> rows deleted
const PRUNE = 'SELECT pgdurable.prune_pubsub(make_interval(secs => $1::double precision / 1000), $2::integer) AS deleted';
// -- are the lease and pubsub functions there?
const SCHEMA = "SELECT to_regprocedure('pgdurable.pubsub_publish(text,json[])') IS NOT NULL AND to_regprocedure('pgdurable.acquire_lease(bytea,bytea,bigint)') IS NOT NULL AS ok";

/**
 * A topic (or group) name: a non-empty string PostgreSQL text can hold. A lone
 * surrogate has no UTF-8 form (pg would send U+FFFD, so different names would
 * share one topic and read each other's events) and is refused, as lease keys are.
 */
function checkTopic(topic: unknown, what = 'topic'): string {
  if (typeof topic !== 'string') throw new TypeError(`${what} must be a string, not ${typeof topic}`);
  if (topic.length === 0) throw new RangeError(`${what} must be a non-empty string`);
  if (topic.includes('\0')) throw new RangeError(`${what} must not contain NUL (PostgreSQL text cannot hold it)`);
  if (!isWellFormed(topic)) {
    throw new RangeError(`${what} is not valid Unicode (it contains a lone surrogate)`);
  }
  return topic;
}

function md5(text: string): string {
  return createHash('md5').update(text, 'utf8').digest('hex');
}

/**
 * Mastra `PubSub` + `LeaseProvider` on pgdurable's tables (see the module docs).
 *
 * ```ts
 * const pubsub = new PgDurablePubSub({ connectionString: process.env.DATABASE_URL });
 * const mastra = new Mastra({ pubsub, agents: { ... } });
 * ```
 */
export class PgDurablePubSub extends PubSub implements LeaseProvider {
  readonly #pool: pg.Pool;
  readonly #ownsPool: boolean;
  readonly #clientConfig: pg.ClientConfig;
  readonly #batch: number;
  readonly #pollMs: number;
  readonly #reconnectMs: number;
  readonly #maxAttempts: number;
  readonly #logger: PgDurableLogger | undefined;
  readonly #schema: string;
  readonly #channel: string;
  #closed = false;
  #schemaOk = false;
  #schemaChecked: Promise<void> | undefined;

  readonly #topics = new Map<string, TopicState>();
  readonly #md5Topics = new Map<string, string>();
  readonly #localCallbacks = new Map<string, Set<EventCallback>>();
  readonly #publishQueues = new Map<string, PendingPublish[]>();
  readonly #publishing = new Map<string, Promise<void>>();
  readonly #inFlight = new Set<Promise<unknown>>();

  #listener: pg.Client | undefined;
  #listening: Promise<void> | undefined;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #pollTimer: NodeJS.Timeout | undefined;
  #reconnects = 0;

  constructor(options: PgDurablePubSubOptions = {}) {
    super();
    this.#schema = checkSchema(options.schema);
    this.#channel = inSchema(CHANNEL, this.#schema);
    const applicationName = options.applicationName ?? 'pgdurable-mastra';
    if (options.pool) {
      this.#pool = options.pool;
      this.#ownsPool = false;
      const o = options.pool.options as pg.PoolConfig;
      this.#clientConfig = { ...o, application_name: `${applicationName}-listener` };
    } else {
      const connectionString = options.connectionString ?? process.env.DATABASE_URL;
      if (!connectionString) {
        throw new TypeError('PgDurablePubSub needs connectionString (or $DATABASE_URL) or a pool');
      }
      this.#clientConfig = { connectionString, application_name: `${applicationName}-listener` };
      this.#pool = new pg.Pool({
        connectionString, max: options.poolSize ?? 4, application_name: applicationName,
      });
      this.#ownsPool = true;
    }
    // An idle pooled connection whose backend dies emits 'error' on the pool: log it, the
    // pool drops that connection and the next call gets a fresh one.
    this.#pool.on('error', (err) => this.#logger?.debug?.('pgdurable-mastra: idle connection lost', err));
    const batch = options.batchSize ?? 500;
    if (!Number.isInteger(batch) || batch < 1 || batch > 10_000) {
      throw new RangeError(`batchSize must be an integer in 1..10000, got ${batch}`);
    }
    this.#batch = batch;
    this.#pollMs = options.pollIntervalMs ?? 5000;
    this.#reconnectMs = options.reconnectDelayMs ?? 100;
    this.#maxAttempts = options.maxDeliveryAttempts ?? 5;
    this.#logger = options.logger;
  }

  // ------------------------------------------------------------------ capabilities

  /** Pull: Mastra runs its OrchestrationWorker as a `group` subscriber (one handler per event). */
  override get supportedModes(): ReadonlyArray<PubSubDeliveryMode> {
    return ['pull'];
  }

  /** Events have offsets: `subscribeFromOffset`, `subscribeWithReplay` and `getHistory` replay them. */
  override get supportsOffsets(): boolean {
    return true;
  }

  /** Times the LISTEN connection was re-opened after it broke (for monitoring and tests). */
  get listenerReconnects(): number {
    return this.#reconnects;
  }

  // ------------------------------------------------------------------ leases

  /**
   * Atomically claim `key` for `owner` for `ttlMs` ms, or learn the live holder.
   *
   * `{ acquired: true, owner }` when granted (a same-owner re-acquire refreshes
   * the TTL and keeps the token); otherwise `{ acquired: false, owner }` naming
   * the holder, read in the same statement (never `undefined` while the key is
   * held). Also returns pgdurable's fencing `token` and `expiresAt`.
   */
  async acquireLease(key: string, owner: string, ttlMs: number): Promise<LeaseGrant> {
    return this.#lease(acquireCall(key, owner, ttlMs));
  }

  /** The live holder of `key`, `undefined` when it is free, released or expired. */
  async getLeaseOwner(key: string): Promise<string | undefined> {
    return this.#lease(getOwnerCall(key));
  }

  /** Release `key` if `owner` holds it now; otherwise a silent no-op. */
  async releaseLease(key: string, owner: string): Promise<void> {
    return this.#lease(releaseCall(key, owner));
  }

  /** Extend `owner`'s live lease to now + `ttlMs`; false when it was lost (never resurrected). */
  async renewLease(key: string, owner: string, ttlMs: number): Promise<boolean> {
    return this.#lease(renewCall(key, owner, ttlMs));
  }

  /**
   * Hand `fromOwner`'s live lease to `toOwner` in one UPDATE (the key is never
   * free in between) with a fresh TTL and a new token; false when `fromOwner`
   * does not hold it (nothing changes; acquire afresh). `a -> a` is true and
   * refreshes the TTL, keeping the token.
   */
  async transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number): Promise<boolean> {
    return this.#lease(transferCall(key, fromOwner, toOwner, ttlMs));
  }

  async #lease<T>(call: LeaseCall<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      if (this.#closed) throw new ProviderClosedError('the lease provider is closed');
      try {
        if (!this.#schemaOk) await this.#checkSchema();
        const result = await this.#pool.query(this.#statement(call.name, call.text, call.values));
        return call.parse(result.rows[0] as Record<string, unknown> | undefined);
      } catch (err) {
        if (this.#closed || /Cannot use a pool after calling end/.test(String(err))) {
          throw new ProviderClosedError('the lease provider is closed', { cause: err });
        }
        if (connectionBroke(err) && attempt === 0 && call.retrySafe) continue;
        throw translate(err);
      }
    }
  }

  /** A named statement of this package, for this instance's schema. */
  #statement(name: string, text: string, values: unknown[]): pg.QueryConfig {
    return { name: statementName(name, this.#schema), text: inSchema(text, this.#schema), values };
  }

  /** Check once that the migrations this package needs are applied (`pgdurable migrate`). */
  #checkSchema(): Promise<void> {
    this.#schemaChecked ??= this.#pool.query(inSchema(SCHEMA, this.#schema)).then((r) => {
      if (r.rows[0]?.ok !== true) {
        const migrate = this.#schema === DEFAULT_SCHEMA ? 'pgdurable migrate'
          : `pgdurable --schema ${this.#schema} migrate`;
        throw new SchemaVersionMismatchError(
          `the ${this.#schema} schema lacks the lease/pubsub functions: run \`${migrate}\``);
      }
      this.#schemaOk = true;
    }).catch((err: unknown) => {
      this.#schemaChecked = undefined;
      throw err;
    });
    return this.#schemaChecked;
  }

  // ------------------------------------------------------------------ publish

  /**
   * Append `event` to `topic` (resolves once it is committed). Concurrent
   * publishes to one topic share one statement and one NOTIFY. `localOnly`
   * events are delivered to this process's subscribers only, never stored.
   */
  async publish(topic: string, event: Omit<Event, 'id' | 'createdAt'>,
                options?: { localOnly?: boolean }): Promise<void> {
    checkTopic(topic);
    if (this.#closed) throw new ProviderClosedError('PgDurablePubSub is closed');
    const stored: StoredEvent = {
      id: randomUUID(), type: event.type, runId: event.runId, data: event.data,
      deliveryAttempt: event.deliveryAttempt ?? 1,
    };
    if (options?.localOnly) {
      this.#deliverLocal(topic, { ...stored, createdAt: new Date() } as Event);
      return;
    }
    const json = JSON.stringify(stored);
    const done = new Promise<void>((resolve, reject) => {
      const queue = this.#publishQueues.get(topic) ?? [];
      queue.push({ json, resolve, reject });
      this.#publishQueues.set(topic, queue);
    });
    if (!this.#publishing.has(topic)) {
      const run = this.#drainPublishes(topic).finally(() => this.#publishing.delete(topic));
      this.#publishing.set(topic, run);
      this.#track(run);
    }
    return done;
  }

  async #drainPublishes(topic: string): Promise<void> {
    for (;;) {
      const queue = this.#publishQueues.get(topic);
      if (!queue || queue.length === 0) {
        this.#publishQueues.delete(topic);
        return;
      }
      const batch = queue.splice(0, 1000);
      try {
        await this.#checkSchema();
        await this.#pool.query(this.#statement('pgdurable_mastra_publish', PUBLISH, [topic, batch.map((p) => p.json)]));
        for (const p of batch) p.resolve();
        this.#kick(topic);
      } catch (err) {
        const e = this.#closed ? new ProviderClosedError('PgDurablePubSub is closed', { cause: err }) : translate(err);
        for (const p of batch) p.reject(e);
      }
    }
  }

  #deliverLocal(topic: string, event: Event): void {
    for (const cb of this.#localCallbacks.get(topic) ?? []) this.#invoke(topic, cb, event, undefined);
  }

  // ------------------------------------------------------------------ subscribe

  /**
   * Deliver `topic`'s events to `cb`, in offset order. Without `group`: from the
   * oldest retained event (`startFrom: 'earliest'`, the default) or after the
   * current end (`'latest'`), then live. With `group`: each event goes to one
   * member of the group across processes. Subscribing the same `cb` to the
   * same topic twice is a no-op.
   */
  async subscribe(topic: string, cb: EventCallback, options?: SubscribeOptions): Promise<void> {
    checkTopic(topic);
    if (typeof cb !== 'function') throw new TypeError('cb must be a function');
    if (options?.group !== undefined) {
      if (typeof options.group !== 'string' || options.group === '') {
        throw new RangeError('group must be a non-empty string');
      }
      checkTopic(options.group, 'group');
      return this.#subscribeGroup(topic, cb, options.group, options.startFrom === 'latest');
    }
    return this.#subscribeAt(topic, cb, options?.startFrom === 'latest' ? 'latest' : -1);
  }

  /** Replay `topic` from offset 0, then follow it live (no gap, no duplicate). */
  override async subscribeWithReplay(topic: string, cb: EventCallback): Promise<void> {
    return this.subscribeFromOffset(topic, 0, cb);
  }

  /** Replay `topic` from `offset` (0-based, an event's `index`), then follow it live. */
  override async subscribeFromOffset(topic: string, offset: number, cb: EventCallback): Promise<void> {
    checkTopic(topic);
    if (typeof cb !== 'function') throw new TypeError('cb must be a function');
    if (!Number.isInteger(offset) || offset < 0) {
      throw new RangeError(`offset must be a non-negative integer, got ${offset}`);
    }
    return this.#subscribeAt(topic, cb, offset - 1);
  }

  async #subscribeAt(topic: string, cb: EventCallback, after: number | 'latest'): Promise<void> {
    if (this.#closed) throw new ProviderClosedError('PgDurablePubSub is closed');
    const state = this.#topic(topic);
    if (state.fanout.some((s) => s.cb === cb)) return;
    this.#addLocal(topic, cb);
    const sub: FanoutSub = { cb, position: typeof after === 'number' ? after : -1, ready: after !== 'latest' };
    state.fanout.push(sub);
    try {
      await this.#ensureListening();
      if (after === 'latest') {
        await this.#checkSchema();
        const r = await this.#pool.query(this.#statement('pgdurable_mastra_last', LAST, [topic]));
        sub.position = Number(r.rows[0]?.last ?? -1);
        sub.ready = true;
      }
    } catch (err) {
      this.#removeFanout(topic, cb);
      throw translate(err);
    }
    await this.#pass(state);
  }

  async #subscribeGroup(topic: string, cb: EventCallback, group: string, fromLatest: boolean): Promise<void> {
    if (this.#closed) throw new ProviderClosedError('PgDurablePubSub is closed');
    const state = this.#topic(topic);
    let g = state.groups.get(group);
    if (!g) {
      g = { name: group, fromLatest, members: [], next: 0 };
      state.groups.set(group, g);
    }
    if (g.members.includes(cb)) return;
    g.members.push(cb);
    this.#addLocal(topic, cb);
    try {
      await this.#ensureListening();
    } catch (err) {
      await this.unsubscribe(topic, cb);
      throw translate(err);
    }
    await this.#pass(state);
  }

  /** Stop delivering `topic` to `cb` (every subscription of `cb` to `topic`). */
  async unsubscribe(topic: string, cb: EventCallback): Promise<void> {
    const state = this.#topics.get(topic);
    this.#localCallbacks.get(topic)?.delete(cb);
    if (this.#localCallbacks.get(topic)?.size === 0) this.#localCallbacks.delete(topic);
    if (!state) return;
    state.fanout = state.fanout.filter((s) => s.cb !== cb);
    for (const [name, g] of state.groups) {
      g.members = g.members.filter((m) => m !== cb);
      if (g.members.length === 0) state.groups.delete(name);
    }
    this.#forgetIfEmpty(state);
  }

  #removeFanout(topic: string, cb: EventCallback): void {
    const state = this.#topics.get(topic);
    if (!state) return;
    state.fanout = state.fanout.filter((s) => s.cb !== cb);
    this.#localCallbacks.get(topic)?.delete(cb);
    this.#forgetIfEmpty(state);
  }

  #forgetIfEmpty(state: TopicState): void {
    if (state.fanout.length === 0 && state.groups.size === 0 && this.#topics.get(state.topic) === state) {
      this.#topics.delete(state.topic);
      if (Buffer.byteLength(state.topic, 'utf8') > LONG_TOPIC_BYTES) this.#md5Topics.delete(md5(state.topic));
    }
  }

  #addLocal(topic: string, cb: EventCallback): void {
    const set = this.#localCallbacks.get(topic) ?? new Set<EventCallback>();
    set.add(cb);
    this.#localCallbacks.set(topic, set);
  }

  #topic(topic: string): TopicState {
    let state = this.#topics.get(topic);
    if (!state) {
      state = { topic, fanout: [], groups: new Map(), running: undefined, again: false };
      this.#topics.set(topic, state);
      if (Buffer.byteLength(topic, 'utf8') > LONG_TOPIC_BYTES) this.#md5Topics.set(md5(topic), topic);
    }
    return state;
  }

  // ------------------------------------------------------------------ reading

  /** Ask for a read pass on `topic` (a NOTIFY, a publish, a reconnect or the poll). */
  #kick(topic: string): void {
    const state = this.#topics.get(topic);
    if (state) this.#track(this.#pass(state));
  }

  /** Run read passes on `state` until nothing asked for another; one pass at a time per topic. */
  #pass(state: TopicState): Promise<void> {
    if (state.running) {
      state.again = true;
      return state.running;
    }
    const run = (async () => {
      do {
        state.again = false;
        try {
          await this.#readFanout(state);
          for (const g of [...state.groups.values()]) await this.#claimGroup(state, g);
        } catch (err) {
          if (this.#closed) return;
          this.#logger?.warn?.(`pgdurable-mastra: reading topic ${state.topic} failed (retried on the next notification or poll)`, err);
          return;
        }
      } while (state.again && !this.#closed);
    })().finally(() => {
      state.running = undefined;
    });
    state.running = run;
    return run;
  }

  async #readFanout(state: TopicState): Promise<void> {
    for (;;) {
      const subs = state.fanout.filter((s) => s.ready);
      if (subs.length === 0 || this.#closed) return;
      const from = Math.min(...subs.map((s) => s.position));
      const r = await this.#pool.query<Row>(this.#statement('pgdurable_mastra_read', READ, [state.topic, from, this.#batch]));
      for (const row of r.rows) {
        const offset = Number(row.offset);
        for (const sub of subs) {
          if (sub.position >= offset || !state.fanout.includes(sub)) continue;
          sub.position = offset;
          this.#invoke(state.topic, sub.cb, this.#toEvent(row), undefined);
        }
      }
      if (r.rows.length < this.#batch) return;
    }
  }

  async #claimGroup(state: TopicState, g: GroupState): Promise<void> {
    for (;;) {
      if (g.members.length === 0 || this.#closed || state.groups.get(g.name) !== g) return;
      const r = await this.#pool.query<Row>(this.#statement('pgdurable_mastra_claim', CLAIM, [state.topic, g.name, this.#batch, g.fromLatest]));
      for (const row of r.rows) {
        const member = g.members[g.next++ % Math.max(g.members.length, 1)];
        const event = this.#toEvent(row);
        if (member) this.#invoke(state.topic, member, event, g);
        else await this.#redeliver(state.topic, event, false);
      }
      if (r.rows.length < this.#batch) return;
    }
  }

  #toEvent(row: Row): Event {
    const e = row.event;
    return {
      type: e.type, id: e.id, data: e.data, runId: e.runId, createdAt: row.created_at,
      index: Number(row.offset), deliveryAttempt: e.deliveryAttempt ?? 1,
    };
  }

  /**
   * Call a subscriber; its promise is not awaited before the next event (Mastra's
   * EventCallback contract) but is tracked by `flush()`. For a group, a nack or a
   * rejection republishes the event (deliveryAttempt + 1) until `maxDeliveryAttempts`.
   */
  #invoke(topic: string, cb: EventCallback, event: Event, group: GroupState | undefined): void {
    let settled = false;
    const ack = async (): Promise<void> => {
      settled = true;
    };
    const nack = async (): Promise<void> => {
      if (settled) return;
      settled = true;
      if (group) await this.#redeliver(topic, event, true);
    };
    try {
      const result = cb(event, ack, nack);
      if (result && typeof (result as Promise<void>).then === 'function') {
        this.#track(Promise.resolve(result).catch(async (err: unknown) => {
          this.#logger?.warn?.(`pgdurable-mastra: subscriber of ${topic} failed`, err);
          await nack();
        }));
      }
    } catch (err) {
      this.#logger?.warn?.(`pgdurable-mastra: subscriber of ${topic} failed`, err);
      this.#track(nack());
    }
  }

  async #redeliver(topic: string, event: Event, failed: boolean): Promise<void> {
    const attempt = (event.deliveryAttempt ?? 1) + (failed ? 1 : 0);
    if (attempt > this.#maxAttempts) {
      this.#logger?.warn?.(`pgdurable-mastra: dropping event ${event.id} of ${topic} after ${attempt - 1} attempts`);
      return;
    }
    await this.publish(topic, { type: event.type, data: event.data, runId: event.runId,
                                deliveryAttempt: attempt }).catch((err: unknown) => {
      this.#logger?.warn?.(`pgdurable-mastra: could not redeliver event ${event.id} of ${topic}`, err);
    });
  }

  /** The retained events of `topic` from `offset` (0-based) on, in order. */
  override async getHistory(topic: string, offset = 0): Promise<Event[]> {
    checkTopic(topic);
    if (!Number.isInteger(offset) || offset < 0) {
      throw new RangeError(`offset must be a non-negative integer, got ${offset}`);
    }
    if (this.#closed) throw new ProviderClosedError('PgDurablePubSub is closed');
    const out: Event[] = [];
    let after = offset - 1;
    try {
      await this.#checkSchema();
      for (;;) {
        const r = await this.#pool.query<Row>(this.#statement('pgdurable_mastra_read', READ, [topic, after, this.#batch]));
        for (const row of r.rows) out.push(this.#toEvent(row));
        if (r.rows.length < this.#batch) return out;
        after = Number(r.rows[r.rows.length - 1]!.offset);
      }
    } catch (err) {
      throw translate(err);
    }
  }

  // ------------------------------------------------------------------ LISTEN

  #ensureListening(): Promise<void> {
    if (this.#listener) return Promise.resolve();
    this.#listening ??= this.#listen().finally(() => {
      this.#listening = undefined;
    });
    return this.#listening;
  }

  async #listen(): Promise<void> {
    await this.#checkSchema();
    const client = new pg.Client(this.#clientConfig);
    client.on('error', (err) => this.#listenerLost(client, err));
    client.on('end', () => this.#listenerLost(client, undefined));
    client.on('notification', (msg) => this.#onNotify(msg.payload));
    try {
      await client.connect();
      await client.query(`LISTEN ${this.#channel}`);
    } catch (err) {
      client.removeAllListeners('end');
      client.on('error', () => {});
      await client.end().catch(() => {});
      throw err;
    }
    if (this.#closed) {
      await client.end().catch(() => {});
      return;
    }
    this.#listener = client;
    this.#startPoll();
  }

  #onNotify(payload: string | undefined): void {
    if (!payload) return;
    const space = payload.indexOf(' ');
    if (space < 0) return;
    const name = payload.slice(space + 1);
    const topic = name.startsWith('#') && name.length === 33 ? this.#md5Topics.get(name.slice(1)) ?? name : name;
    this.#kick(topic);
  }

  #listenerLost(client: pg.Client, err: unknown): void {
    if (this.#listener !== client) return;
    this.#listener = undefined;
    client.removeAllListeners('notification');
    client.on('error', () => {});
    if (this.#closed) return;
    this.#logger?.warn?.('pgdurable-mastra: LISTEN connection lost, reconnecting', err);
    this.#reconnect(this.#reconnectMs);
  }

  #reconnect(delay: number): void {
    if (this.#closed || this.#reconnectTimer) return;
    this.#reconnectTimer = setTimeout(() => {
      this.#reconnectTimer = undefined;
      if (this.#closed || this.#listener || this.#topics.size === 0) return;
      this.#ensureListening().then(() => {
        this.#reconnects++;
        // Notifications sent while we were away are gone: every subscriber reads on
        // from its own position, which replays exactly what it missed.
        for (const topic of this.#topics.keys()) this.#kick(topic);
      }, (err: unknown) => {
        this.#logger?.warn?.('pgdurable-mastra: LISTEN reconnect failed', err);
        this.#reconnect(Math.min(delay * 2, 5000));
      });
    }, delay);
    this.#reconnectTimer.unref();
  }

  #startPoll(): void {
    if (this.#pollMs <= 0 || this.#pollTimer) return;
    this.#pollTimer = setInterval(() => {
      for (const topic of this.#topics.keys()) this.#kick(topic);
      if (!this.#listener && !this.#listening && this.#topics.size > 0) this.#reconnect(0);
    }, this.#pollMs);
    this.#pollTimer.unref();
  }

  // ------------------------------------------------------------------ lifecycle

  #track(p: Promise<unknown>): void {
    const t = p.catch(() => {});
    this.#inFlight.add(t);
    void t.finally(() => this.#inFlight.delete(t));
  }

  /** Wait for pending publishes, read passes and subscriber promises to settle. */
  async flush(): Promise<void> {
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
  }

  /**
   * Delete `topic`'s events and groups (a finished run's stream). Best effort, as
   * Mastra expects: a failure is logged, never thrown. Offsets keep growing.
   */
  override async clearTopic(topic: string): Promise<void> {
    try {
      checkTopic(topic);
      if (this.#closed) return;
      await this.#publishing.get(topic);
      await this.#checkSchema();
      await this.#pool.query(this.#statement('pgdurable_mastra_clear', CLEAR, [topic]));
    } catch (err) {
      this.#logger?.warn?.(`pgdurable-mastra: clearTopic(${String(topic)}) failed`, err);
    }
  }

  /**
   * Retention: delete topics nobody published to for `olderThanMs`, batch by
   * batch (`pgdurable.prune_pubsub`); returns the rows deleted.
   */
  async prune(olderThanMs: number, batch = 1000): Promise<number> {
    if (typeof olderThanMs !== 'number' || !Number.isFinite(olderThanMs) || olderThanMs < 0) {
      throw new RangeError(`olderThanMs must be a non-negative number, got ${olderThanMs}`);
    }
    if (!Number.isInteger(batch) || batch < 1 || batch > 100_000) {
      throw new RangeError(`batch must be an integer in 1..100000, got ${batch}`);
    }
    if (this.#closed) throw new ProviderClosedError('PgDurablePubSub is closed');
    let total = 0;
    try {
      await this.#checkSchema();
      for (;;) {
        const r = await this.#pool.query(inSchema(PRUNE, this.#schema), [olderThanMs, batch]);
        const n = Number(r.rows[0]?.deleted ?? 0);
        total += n;
        if (n === 0) return total;
      }
    } catch (err) {
      throw translate(err);
    }
  }

  /**
   * Stop listening and polling, wait for in-flight work, end the pool when
   * owned. Later lease calls reject with {@link ProviderClosedError}.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    await Promise.allSettled([...this.#publishing.values()]);
    this.#closed = true;
    if (this.#reconnectTimer) clearTimeout(this.#reconnectTimer);
    if (this.#pollTimer) clearInterval(this.#pollTimer);
    this.#reconnectTimer = undefined;
    this.#pollTimer = undefined;
    await this.#listening?.catch(() => {});
    const listener = this.#listener;
    this.#listener = undefined;
    this.#topics.clear();
    this.#localCallbacks.clear();
    await Promise.allSettled([...this.#inFlight]);
    if (listener) await listener.end().catch(() => {});
    if (this.#ownsPool) await this.#pool.end().catch(() => {});
  }
}

