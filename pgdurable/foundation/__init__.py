"""The foundation: connections, JSON, errors, SQL access (named queries), migrations, leases and the primitives that work on a bare pool."""
