"""The engine: the worker and its parts, one module per job.

``worker`` (the orchestrator) composes ``claim`` (the claim loop),
``listener`` (LISTEN and wake), ``heartbeat`` (lease renewal), ``execute``
(running a run's steps), ``step_effects`` (``ctx.effect``), ``park`` (park,
fail, release) and ``batch_writer`` (batched, fenced step writes) over the
shared state of ``base``. The engine takes the small protocols of
:mod:`pgdurable.foundation.ports`, never the app object: see ``docs/architecture.md``.
"""
