-- 0027_run_end_trigger: one trigger at a run's end instead of three.
--
-- Until now three AFTER UPDATE OF status triggers on pgdurable.runs fired
-- when a run ended, each its own PL/pgSQL call with its own trigger event:
--   * runs_child_end (0010, 0023): NOTIFY pgdurable_done while a listener is
--     present, count the run down for its waiting parent, apply its
--     children's policy;
--   * runs_flow_slot_freed_trg (0016): a run of a limited queue leaving
--     leased wakes the workers of that queue;
--   * runs_stream_end (0006, 0018, 0022): the final stream event of a run
--     that has a thread or emitted events.
-- They fired in that order (by name). runs_end does the same work, in the same
-- order, as one trigger; a run leaving leased for a live status (parked,
-- released) does only the freed-slot part, as before. A completion pays one
-- trigger event and one function call instead of three (benchmarks/RESULTS.md,
-- "One trigger at a run's end").
------------------------------------------------------------------------------
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

DROP TRIGGER IF EXISTS runs_child_end ON pgdurable.runs;
DROP TRIGGER IF EXISTS runs_flow_slot_freed_trg ON pgdurable.runs;
DROP TRIGGER IF EXISTS runs_stream_end ON pgdurable.runs;
DROP FUNCTION IF EXISTS pgdurable._runs_child_end();
DROP FUNCTION IF EXISTS pgdurable._flow_slot_freed();
DROP FUNCTION IF EXISTS pgdurable._runs_stream_end();
