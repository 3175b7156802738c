// Compile-time checks against the real @mastra/core declarations (npm run typecheck):
// PgDurablePubSub is a Mastra PubSub, a LeaseProvider, and what `new Mastra({ pubsub })` takes.
import { Mastra } from '@mastra/core';
import { PubSub, isLeaseProvider } from '@mastra/core/events';
import type { LeaseProvider } from '@mastra/core/events';

import { PgDurablePubSub } from '../src/index.js';

const pubsub = new PgDurablePubSub({ connectionString: 'postgresql://localhost/db' });
const asPubSub: PubSub = pubsub;
const asLeases: LeaseProvider = pubsub;
const mastra = new Mastra({ pubsub, logger: false });
const narrowed: boolean = isLeaseProvider(asPubSub);
const grant: Promise<{ acquired: boolean; owner?: string }> = asLeases.acquireLease('k', 'o', 1000);
void [mastra, narrowed, grant];
