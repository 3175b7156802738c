"""The engine: the worker and its parts, one module per job.

``worker`` (:class:`~pgdurable.engine.worker.Worker`) holds its parts as fields,
River's producer being the model: the ``claim`` loop (``Claimer``), the
``listener`` (LISTEN and wake), the ``heartbeat`` (lease renewal), the executor of
runs' steps (``execute``), ``step_effects`` (``ctx.effect``), ``park`` (park, fail,
release), ``batch_writer`` (batched, fenced step writes) and ``presence``, sharing one
small ``state`` object and the ``settings``. Periodic duties are plug-in ``services``
the engine does not import. The engine takes a narrow database object (one statement
on the app's pool) and the task registry, never the app object: see
``docs/architecture.md``.
"""
