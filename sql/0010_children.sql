-- 0010_children: child runs (fan-out), waiting on them (fan-in), the run
-- tree, cancel propagation, and the terminal notification that app.result()
-- listens for.
--
-- THE TREE. A child run is started by its parent's step (start_child, fenced
-- by the parent's lease token) and records parent_run_id, root_run_id (the
-- parent's root, or the parent itself), child_key (unique per parent: one
-- child per (parent, key), whichever attempt asks) and parent_policy
-- ('cancel' | 'abandon': what happens to it when its parent ends first).
-- A child's deadline is capped by its parent's. Top-level runs keep
-- parent_run_id and root_run_id NULL.
--
-- FAN-IN. A parent parks on its children with park_children: the awaited
-- children that are not finished yet are listed in child_waits and the
-- number still needed is kept in child_wait_sets. A child's terminal
-- transition (trigger runs_child_end, same transaction) removes itself from
-- child_waits, decrements the counter and, when it reaches zero while the
-- parent still waits on its children, makes the parent runnable (one NOTIFY
-- pgdurable_wake): 1,000 children wake the parent once. When the parent
-- leaves the wait (woken, timed out, signalled) the BEFORE trigger
-- runs_children_wake writes wake.children = {id: {status, result, error}}.
--
-- LOCK ORDER (deadlock-free): a child's transaction may wait for its
-- PARENT's row (FOR KEY SHARE, which conflicts only with FOR UPDATE: the lock
-- of park_children, cancel_run and the fenced transitions), never the other
-- way round: a parent's transaction never waits for a child's row (its
-- cancel sweep uses SKIP LOCKED). A child skipped because another
-- transaction held it is caught by that transaction's own check
-- (runs_child_guard waits for the parent's lock, then sees the parent ended)
-- or, if that transaction did not change the child's status or lease (e.g.
-- signal_run storing a pending signal), at the child's next status change.
--
-- TERMINAL NOTIFY. Every run that becomes terminal NOTIFYs pgdurable_done
-- (payload = run id) in the same transaction: result() LISTENs on it.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN parent_run_id uuid;
ALTER TABLE pgdurable.runs ADD COLUMN root_run_id uuid;
ALTER TABLE pgdurable.runs ADD COLUMN child_key text CHECK (child_key <> '');
ALTER TABLE pgdurable.runs ADD COLUMN parent_policy text
  CHECK (parent_policy IN ('cancel', 'abandon'));
ALTER TABLE pgdurable.runs ADD CONSTRAINT runs_child_shape CHECK (
  (parent_run_id IS NULL) = (child_key IS NULL)
  AND (parent_run_id IS NULL) = (parent_policy IS NULL)
  AND (parent_run_id IS NULL) = (root_run_id IS NULL));
COMMENT ON COLUMN pgdurable.runs.parent_run_id IS
  'The run whose step started this run (start_child); NULL for a top-level run. Not a foreign '
  'key: retention may delete a parent before its children.';
COMMENT ON COLUMN pgdurable.runs.root_run_id IS
  'The top-level run of this run''s tree (the parent''s root, or the parent); NULL for a top-level run.';
COMMENT ON COLUMN pgdurable.runs.child_key IS
  'Key of this child within its parent: start_child with the same (parent, key) returns this run.';
COMMENT ON COLUMN pgdurable.runs.parent_policy IS
  'What happens to this child when its parent ends first (completed, failed, cancelled): '
  'cancel (default: it is cancelled, its own children in turn) or abandon (it runs on).';
-- exactly one child per (parent, key); also the index of "children of a run"
CREATE UNIQUE INDEX runs_parent_key_idx ON pgdurable.runs (parent_run_id, child_key)
  WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_root_idx ON pgdurable.runs (root_run_id) WHERE root_run_id IS NOT NULL;

CREATE TABLE pgdurable.child_waits (
  child_run_id  uuid PRIMARY KEY,
  parent_run_id uuid NOT NULL
);
CREATE INDEX child_waits_parent_idx ON pgdurable.child_waits (parent_run_id);
COMMENT ON TABLE pgdurable.child_waits IS
  'Children a parked parent waits on that had not finished when it parked (park_children); '
  'a child''s row goes when it finishes or the parent parks again or ends.';
COMMENT ON COLUMN pgdurable.child_waits.child_run_id IS 'The awaited child (a child has one parent).';
COMMENT ON COLUMN pgdurable.child_waits.parent_run_id IS 'The waiting parent.';

CREATE TABLE pgdurable.child_wait_sets (
  parent_run_id uuid    PRIMARY KEY,
  remaining     integer NOT NULL,
  ids           uuid[]  NOT NULL
);
COMMENT ON TABLE pgdurable.child_wait_sets IS
  'One row per parent parked on its children: how many more must finish before it wakes.';
COMMENT ON COLUMN pgdurable.child_wait_sets.parent_run_id IS 'The waiting parent.';
COMMENT ON COLUMN pgdurable.child_wait_sets.remaining IS
  'Awaited children that must still finish; the one that brings it to 0 wakes the parent.';
COMMENT ON COLUMN pgdurable.child_wait_sets.ids IS
  'Every child id of the wait (their outcomes make wake.children when the parent wakes).';
