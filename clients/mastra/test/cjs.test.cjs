// The CommonJS build: require() works and is a LeaseProvider for the CJS copy of @mastra/core.
const assert = require('node:assert/strict');
const { test } = require('node:test');

test('require("@pgdurable/mastra") (dist/cjs) gives a Mastra PubSub and LeaseProvider', () => {
  const { PgDurablePubSub, ProviderClosedError } = require('../dist/cjs/index.js');
  const { PubSub, isLeaseProvider } = require('@mastra/core/events');
  const ps = new PgDurablePubSub({ connectionString: 'postgresql://127.0.0.1:1/never-connected' });
  assert.ok(ps instanceof PubSub);
  assert.equal(isLeaseProvider(ps), true);
  assert.equal(typeof ProviderClosedError, 'function');
  return ps.close();
});
