"""The app and its clients: :class:`~pgdurable.app.durable.Durable` (async) and :class:`~pgdurable.app.client.DurableClient` (sync)."""
