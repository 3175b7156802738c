-- 0020_checkpoint_owner: what the dashboard's run timeline and schedules page
-- need that the schema did not keep or did not show to the read-only role.
--
-- * checkpoints.owner: the lease owner (worker id) under which a checkpoint
--   was written, next to the lease token it already recorded. Taken from the
--   fence the write already passes (write_steps: p_owner, which the fence
--   compares with runs.lease_owner; _checkpoint, used by park_run and the
--   children park: the locked run's lease_owner): no trigger, no extra read,
--   one short text per checkpoint. Rows written before this migration, and
--   the history a fork copies (token 0), have owner NULL.
-- * run_steps gains owner and step_name. The step name is read from what a
--   workflow records in its checkpoint (state.workflow.name, as the
--   workflow_steps view does): an @app.task has a single step function and no
--   step names (its steps are numbered, runs.step), so nothing is stored.
-- * run_effects gains step (the 0-based index of the running step when the
--   effect was recorded, 0017), so the timeline can put an effect under the
--   checkpoint that followed it.
-- * schedule_list and schedule_run_list: schedules and the runs their ticks
--   started, without the start state, so the read-only role can see them.
--
-- MERGE NOTE: write_steps and _checkpoint are redefined here in full from
-- their 0003_runs text; the only change is the owner column in their INSERT
-- into pgdurable.checkpoints.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.checkpoints ADD COLUMN owner text;
COMMENT ON COLUMN pgdurable.checkpoints.owner IS
  'Lease owner (worker id) that wrote the checkpoint under token; NULL for checkpoints '
  'written before migration 0020 and for history copied by fork_run.';
-- the existing partitions got the column without its comment (new ones copy
-- it: _history_partition creates them LIKE the parent INCLUDING COMMENTS)
DO $$
DECLARE
  p regclass;
BEGIN
  FOR p IN SELECT i.inhrelid::regclass FROM pg_inherits i
            WHERE i.inhparent = 'pgdurable.checkpoints'::regclass LOOP
    EXECUTE format('COMMENT ON COLUMN %s.owner IS %L', p,
                   col_description('pgdurable.checkpoints'::regclass,
                                   (SELECT a.attnum FROM pg_attribute a
                                     WHERE a.attrelid = 'pgdurable.checkpoints'::regclass
                                       AND a.attname = 'owner')));
  END LOOP;
END
$$;
