/**
 * @pgdurable/mastra: Mastra's `PubSub` and `LeaseProvider` on pgdurable's
 * PostgreSQL tables and SQL functions, shared with pgdurable's Python library.
 *
 * ```ts
 * import { PgDurablePubSub } from '@pgdurable/mastra';
 * const pubsub = new PgDurablePubSub({ connectionString: process.env.DATABASE_URL });
 * const mastra = new Mastra({ pubsub, agents: { ... } });
 * ```
 */
export { PgDurablePubSub } from './pubsub.js';
export type { PgDurableLogger, PgDurablePubSubOptions } from './pubsub.js';
export { MAX_TTL_MS, checkTtl, decodeName, encodeName } from './leases.js';
export type { LeaseGrant } from './leases.js';
export {
  DatabaseUnavailableError, InvalidInputError, PgDurableError, ProviderClosedError,
  SchemaVersionMismatchError,
} from './errors.js';
