/**
 * Errors of @pgdurable/mastra, named like pgdurable's Python errors
 * (pgdurable/errors.py) so logs read the same in both languages.
 *
 * Bad arguments are rejected before any SQL with the standard `TypeError`
 * (wrong type) or `RangeError` (empty string, lone surrogate, TTL out of
 * range); nothing changes then.
 */

/** Base class of every error raised by this package (other than bad-argument errors). */
export class PgDurableError extends Error {
  /** The PostgreSQL SQLSTATE, when the error came from the database. */
  readonly sqlstate: string | undefined;

  constructor(message: string, options?: { cause?: unknown; sqlstate?: string | undefined }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.sqlstate = options?.sqlstate;
  }
}

/** The provider was closed (or its pool ended): a lease call never reports a false success. */
export class ProviderClosedError extends PgDurableError {}

/** The database could not be reached, or the connection broke during a call that cannot be retried. */
export class DatabaseUnavailableError extends PgDurableError {}

/** The database refused the arguments (SQLSTATE PD000, pgdurable's InvalidInput). */
export class InvalidInputError extends PgDurableError {}

/** The database schema is missing the pgdurable migrations this package needs. */
export class SchemaVersionMismatchError extends PgDurableError {}

interface PgErrorLike {
  code?: unknown;
  message?: unknown;
}

const CONNECTION_SQLSTATES = new Set([
  '57P01', // admin_shutdown (pg_terminate_backend)
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
  '08000', '08003', '08006', '08001', '08004',
]);

/** True when `err` means the connection itself failed (server gone, backend terminated). */
export function connectionBroke(err: unknown): boolean {
  if (err instanceof ProviderClosedError) return false;
  const e = (err ?? {}) as PgErrorLike;
  if (typeof e.code === 'string') {
    return CONNECTION_SQLSTATES.has(e.code) || e.code === 'ECONNREFUSED' || e.code === 'ECONNRESET'
      || e.code === 'EPIPE' || e.code === 'ETIMEDOUT';
  }
  const message = typeof e.message === 'string' ? e.message : '';
  return /Connection terminated|connection (?:is )?closed|Client has encountered a connection error|timeout exceeded when trying to connect/i
    .test(message);
}

/** The error to raise for a database error: typed for PD000 and broken connections. */
export function translate(err: unknown): unknown {
  if (err instanceof PgDurableError) return err;
  const e = (err ?? {}) as PgErrorLike;
  const message = typeof e.message === 'string' ? e.message : String(err);
  if (e.code === 'PD000') return new InvalidInputError(message, { cause: err, sqlstate: 'PD000' });
  if (connectionBroke(err)) {
    return new DatabaseUnavailableError(`database connection lost: ${message.split('\n')[0]}`, {
      cause: err,
      sqlstate: typeof e.code === 'string' ? e.code : undefined,
    });
  }
  return err;
}
