/**
 * The five lease operations as calls to pgdurable's SQL functions
 * (sql/0002_leases.sql), shared with the Python provider (pgdurable/leases.py,
 * pgdurable/_leases_sql.py): the same functions, the same rows, the same
 * encoding. Everything that is not I/O lives here: SQL text, argument
 * validation and row parsing. A call is one statement (one round trip).
 *
 * Keys and owners are any non-empty string, stored as UTF-8 `bytea` so that
 * every string round-trips, NUL included (Mastra's thread keys are
 * `resourceId + "\0" + threadId`). Python encodes `str` to UTF-8 the same way,
 * so a key written by either language names the same row. A string with a
 * lone surrogate has no UTF-8 form and is refused (`RangeError`), as Python
 * refuses it.
 */

/** Longest TTL accepted (24 h); the SQL functions enforce the same bound. */
export const MAX_TTL_MS = 24 * 60 * 60 * 1000;

/** One validated SQL function call: a named prepared statement, its parameters, its parser. */
export interface LeaseCall<T> {
  readonly name: string;
  readonly text: string;
  readonly values: unknown[];
  readonly parse: (row: Record<string, unknown> | undefined) => T;
  /** Repeating it after a lost connection gives the same answer (all but transfer). */
  readonly retrySafe: boolean;
}

// -- one line each: the five operations, one SQL function call each (bytea originals).
// -- acquire: grant or the live holder -> (acquired, owner, token, expires_at)
const ACQUIRE = 'SELECT acquired, owner, token, expires_at FROM pgdurable.acquire_lease($1::bytea, $2::bytea, $3::bigint)';
// -- owner: the live holder or NULL
const GET_OWNER = 'SELECT pgdurable.get_lease_owner($1::bytea) AS owner';
// -- release if held -> released?
const RELEASE = 'SELECT pgdurable.release_lease($1::bytea, $2::bytea, NULL::bigint) AS released';
// -- renew if held -> renewed?
const RENEW = 'SELECT pgdurable.renew_lease($1::bytea, $2::bytea, $3::bigint, NULL::bigint) AS renewed';
// -- transfer if held -> new token or NULL
const TRANSFER = 'SELECT pgdurable.transfer_lease($1::bytea, $2::bytea, $3::bytea, $4::bigint, NULL::bigint) AS token';

/** A key or owner as UTF-8 bytes; `TypeError`/`RangeError` on bad input. */
export function encodeName(value: unknown, what: string): Buffer {
  if (typeof value !== 'string') {
    throw new TypeError(`lease ${what} must be a string, not ${value === null ? 'null' : typeof value}`);
  }
  if (value.length === 0) throw new RangeError(`lease ${what} must be a non-empty string`);
  if (!isWellFormed(value)) {
    throw new RangeError(`lease ${what} is not valid Unicode (it contains a lone surrogate)`);
  }
  return Buffer.from(value, 'utf8');
}

/** Bytes stored by {@link encodeName} back to the exact string. */
export function decodeName(value: unknown): string | undefined {
  if (value === null || value === undefined) return undefined;
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

/** A TTL in milliseconds: an integer in 1 .. 24 h. */
export function checkTtl(ttlMs: unknown): number {
  if (typeof ttlMs !== 'number' || !Number.isInteger(ttlMs)) {
    throw new TypeError(`ttlMs must be an integer number of milliseconds, not ${String(ttlMs)}`);
  }
  if (ttlMs <= 0) throw new RangeError(`ttlMs must be positive, got ${ttlMs}`);
  if (ttlMs > MAX_TTL_MS) throw new RangeError(`ttlMs must be at most ${MAX_TTL_MS} (24 h), got ${ttlMs}`);
  return ttlMs;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** False when `value` holds a lone surrogate (no UTF-8 form: pg would send U+FFFD instead). */
export function isWellFormed(value: string): boolean {
  return !LONE_SURROGATE.test(value);
}

/** The answer of `acquireLease`, with pgdurable's fencing token and expiry. */
export interface LeaseGrant {
  /** Whether the caller holds the lease now. */
  acquired: boolean;
  /** The holder: the caller when acquired, else the live holder to route work to. */
  owner?: string;
  /** The holder's fencing token (grows with every new owner of the key). */
  token?: number;
  /** When the holder's lease expires, on the database clock. */
  expiresAt?: Date;
}

function grant(row: Record<string, unknown> | undefined): LeaseGrant {
  if (!row) throw new Error('acquire_lease returned no row');
  const out: LeaseGrant = { acquired: row.acquired === true };
  const owner = decodeName(row.owner);
  if (owner !== undefined) out.owner = owner;
  if (row.token !== null && row.token !== undefined) out.token = Number(row.token);
  if (row.expires_at instanceof Date) out.expiresAt = row.expires_at;
  return out;
}

/** The validated `acquire_lease` call. */
export function acquireCall(key: string, owner: string, ttlMs: number): LeaseCall<LeaseGrant> {
  const values = [encodeName(key, 'key'), encodeName(owner, 'owner'), checkTtl(ttlMs)];
  return { name: 'pgdurable_mastra_acquire', text: ACQUIRE, values, parse: grant, retrySafe: true };
}

/** The validated `get_lease_owner` call. */
export function getOwnerCall(key: string): LeaseCall<string | undefined> {
  return {
    name: 'pgdurable_mastra_owner', text: GET_OWNER, values: [encodeName(key, 'key')],
    parse: (row) => decodeName(row?.owner), retrySafe: true,
  };
}

/** The validated `release_lease` call. */
export function releaseCall(key: string, owner: string): LeaseCall<void> {
  return {
    name: 'pgdurable_mastra_release', text: RELEASE,
    values: [encodeName(key, 'key'), encodeName(owner, 'owner')],
    parse: () => undefined, retrySafe: true,
  };
}

/** The validated `renew_lease` call. */
export function renewCall(key: string, owner: string, ttlMs: number): LeaseCall<boolean> {
  return {
    name: 'pgdurable_mastra_renew', text: RENEW,
    values: [encodeName(key, 'key'), encodeName(owner, 'owner'), checkTtl(ttlMs)],
    parse: (row) => row?.renewed === true, retrySafe: true,
  };
}

/** The validated `transfer_lease` call (not retried: a repeat would report false). */
export function transferCall(key: string, fromOwner: string, toOwner: string,
                             ttlMs: number): LeaseCall<boolean> {
  return {
    name: 'pgdurable_mastra_transfer', text: TRANSFER,
    values: [encodeName(key, 'key'), encodeName(fromOwner, 'fromOwner'),
             encodeName(toOwner, 'toOwner'), checkTtl(ttlMs)],
    parse: (row) => row?.token !== null && row?.token !== undefined, retrySafe: false,
  };
}
