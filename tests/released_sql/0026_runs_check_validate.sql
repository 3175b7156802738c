-- 0026_runs_check_validate: check every existing runs row against runs_check.
--
-- 0025 added runs_check NOT VALID, so that the scan happens here, in a
-- transaction of its own: VALIDATE CONSTRAINT takes a SHARE UPDATE EXCLUSIVE
-- lock, which lets starts, claims and checkpoints go on while it reads the
-- table (one function call per row). Every row met the 14 CHECKs that
-- runs_check replaced, so it fails only on a row written around them.
------------------------------------------------------------------------------

ALTER TABLE pgdurable.runs VALIDATE CONSTRAINT runs_check;
