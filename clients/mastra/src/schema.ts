/**
 * The schema pgdurable lives in: `pgdurable` unless told otherwise (`schema` option, else
 * `$PGDURABLE_SCHEMA`), as in pgdurable's Python library (`pgdurable/foundation/schemas.py`,
 * docs/schemas.md): several apps or tenants of one database each have their own.
 *
 * This package's statements name the schema `pgdurable`; for another one the name is
 * replaced the way the library replaces it: the word `pgdurable` and the prefix of its
 * channels (`pgdurable_pubsub`), not the session settings and wake kinds that stay global.
 */
import { InvalidInputError } from './errors.js';

export const DEFAULT_SCHEMA = 'pgdurable';
/** The longest schema name (its channels must fit PostgreSQL's 63 bytes). */
export const MAX_SCHEMA_LENGTH = 48;

const CHANNELS = ['wake', 'cancel', 'events', 'steps', 'done', 'text', 'mcp', 'threads', 'pubsub'];
const KEPT = ['now', 'live_steps', 'cell', 'budget', 'acquire'];
const WORD = new RegExp(
  `(?<![A-Za-z0-9_$])pgdurable(?![A-Za-z0-9$])(?!_(?!(?:${CHANNELS.join('|')})\\b))`
  + `(?!\\.(?:${KEPT.join('|')})\\b(?!\\s*\\())`, 'g');

/** `schema` if it is a usable schema name (else `$PGDURABLE_SCHEMA`, else `pgdurable`). */
export function checkSchema(schema: unknown = undefined): string {
  const name = schema ?? (process.env.PGDURABLE_SCHEMA || DEFAULT_SCHEMA);
  if (typeof name !== 'string') {
    throw new InvalidInputError(`schema must be a string, not ${typeof name}`);
  }
  if (!/^[a-z_][a-z0-9_]*$/.test(name)) {
    throw new InvalidInputError(`schema must be a lower-case identifier ([a-z_][a-z0-9_]*), not ${JSON.stringify(name)}`);
  }
  if (name.length > MAX_SCHEMA_LENGTH) {
    throw new InvalidInputError(`schema name ${JSON.stringify(name)} is longer than ${MAX_SCHEMA_LENGTH} characters`);
  }
  if (/^(public|information_schema|pg_.*)$/.test(name)) {
    throw new InvalidInputError(`schema ${JSON.stringify(name)} is not allowed: pgdurable needs a schema of its own`);
  }
  return name;
}

/** `sql` (naming schema `pgdurable`) for `schema`. */
export function inSchema(sql: string, schema: string): string {
  return schema === DEFAULT_SCHEMA ? sql : sql.replace(WORD, schema);
}

/** A prepared statement's name for `schema` (one pool may serve several schemas). */
export function statementName(name: string, schema: string): string {
  return schema === DEFAULT_SCHEMA ? name : `${name}@${schema}`;
}
