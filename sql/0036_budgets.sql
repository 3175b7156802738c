-- 0036_budgets: spend control, a transactional budget ledger (issue 42).
-- (Assigned number 0038: on this branch it is 0036 because migration numbers
-- may have no gap; renumber with `git mv` when 0036/0037 land first.)
--
-- A BUDGET (pgdurable.budgets) has a key, limits per unit ({"usd": 50,
-- "tokens": 200000}), a window (none, fixed: calendar buckets of
-- window_length from 2000-01-01 UTC, or rolling: the last window_length) and a
-- policy when a reservation cannot be had (park: the run waits, holding no
-- worker, until the window refills or an operator raises the limit; fail: the
-- run fails with BudgetExceeded naming the budget). A run draws from the
-- budgets attached to it (pgdurable.run_budgets: named shared ones and its own
-- 'run:<id>'); a run with none draws from its nearest ancestor's (children
-- share their parent's tree budget unless given their own).
--
-- RESERVATIONS (pgdurable.budget_holds) are fenced by the lease: a hold
-- counts only while its run is 'leased' with the hold's token. A worker that
-- crashed or lost its run stops holding when the run is reclaimed (the claim
-- bumps the token) or ends; the claim itself does no budget work (it stays
-- one fast statement), and budget_reserve deletes the dead holds it meets.
-- THE LEDGER (pgdurable.budget_ledger) keeps every reserve, settle and
-- release; a (run, step, reservation key) is settled at most once per budget
-- and unit (a unique index), so a replayed step is never charged twice.
-- THE PRICES (pgdurable.budget_prices) turn tokens into USD when a settlement
-- names a model and gives no usd.

CREATE TABLE pgdurable.budgets (
  key text PRIMARY KEY CHECK (key <> '' AND length(key) <= 200),
  limits jsonb NOT NULL CHECK (jsonb_typeof(limits) = 'object'),
  window_kind text NOT NULL DEFAULT 'none' CHECK (window_kind IN ('none', 'fixed', 'rolling')),
  window_length interval,
  policy text NOT NULL DEFAULT 'fail' CHECK (policy IN ('park', 'fail')),
  run_id uuid,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  CHECK ((window_kind = 'none') = (window_length IS NULL)),
  CHECK (window_length IS NULL OR window_length > interval '0')
);
COMMENT ON TABLE pgdurable.budgets IS
  'Spend budgets: limits per unit, a window and a policy (pgdurable.budget_set; a run''s own: run:<id>).';
COMMENT ON COLUMN pgdurable.budgets.key IS
  'The budget''s name (tenant:acme, user:42, ...); a run''s own budget is run:<run id>.';
COMMENT ON COLUMN pgdurable.budgets.limits IS
  'Limit per unit: {"usd": 50, "tokens": 200000, "calls": 100}; units not named are not limited.';
COMMENT ON COLUMN pgdurable.budgets.window_kind IS
  'none (the limit is for all time), fixed (calendar buckets of window_length from 2000-01-01 UTC) '
  'or rolling (the last window_length).';
COMMENT ON COLUMN pgdurable.budgets.window_length IS 'The window''s length; NULL when window_kind = none.';
COMMENT ON COLUMN pgdurable.budgets.policy IS
  'When a reservation cannot be had: park (wait for the refill or a raised limit) or fail (BudgetExceeded).';
COMMENT ON COLUMN pgdurable.budgets.run_id IS 'The run whose own budget this is (run:<id>); NULL for a named budget.';
COMMENT ON COLUMN pgdurable.budgets.created_at IS 'When it was created (database clock).';
COMMENT ON COLUMN pgdurable.budgets.updated_at IS 'When its limits, window or policy were last set.';

CREATE TABLE pgdurable.run_budgets (
  run_id uuid NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  budget_key text NOT NULL REFERENCES pgdurable.budgets (key) ON DELETE CASCADE,
  PRIMARY KEY (run_id, budget_key)
);
CREATE INDEX run_budgets_budget_idx ON pgdurable.run_budgets (budget_key);
COMMENT ON TABLE pgdurable.run_budgets IS
  'The budgets a run draws from (start(budgets=..., budget=...)); a run with none draws from its '
  'nearest ancestor''s.';
COMMENT ON COLUMN pgdurable.run_budgets.run_id IS 'The run.';
COMMENT ON COLUMN pgdurable.run_budgets.budget_key IS 'A budget it draws from.';

CREATE TABLE pgdurable.budget_holds (
  run_id uuid NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  step integer NOT NULL,
  rkey text NOT NULL,
  budget_key text NOT NULL REFERENCES pgdurable.budgets (key) ON DELETE CASCADE,
  unit text NOT NULL,
  amount numeric NOT NULL CHECK (amount >= 0),
  token bigint NOT NULL,
  at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (run_id, step, rkey, budget_key, unit)
);
CREATE INDEX budget_holds_budget_idx ON pgdurable.budget_holds (budget_key, unit);
COMMENT ON TABLE pgdurable.budget_holds IS
  'Open reservations; one counts only while its run is leased with the hold''s token.';
COMMENT ON COLUMN pgdurable.budget_holds.run_id IS 'The run that reserved.';
COMMENT ON COLUMN pgdurable.budget_holds.step IS 'The step index it reserved in.';
COMMENT ON COLUMN pgdurable.budget_holds.rkey IS 'The reservation''s key within the step (r0, r1, ... or the caller''s).';
COMMENT ON COLUMN pgdurable.budget_holds.budget_key IS 'The budget it holds capacity of.';
COMMENT ON COLUMN pgdurable.budget_holds.unit IS 'The unit (usd, tokens, tokens_in, tokens_out, calls).';
COMMENT ON COLUMN pgdurable.budget_holds.amount IS 'The amount held.';
COMMENT ON COLUMN pgdurable.budget_holds.token IS 'The lease token it was reserved under (the fence of its liveness).';
COMMENT ON COLUMN pgdurable.budget_holds.at IS 'When it was reserved (database clock).';

CREATE TABLE pgdurable.budget_ledger (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id uuid NOT NULL,
  step integer NOT NULL,
  rkey text NOT NULL,
  budget_key text NOT NULL REFERENCES pgdurable.budgets (key) ON DELETE CASCADE,
  unit text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('reserve', 'settle', 'release')),
  amount numeric NOT NULL CHECK (amount >= 0),
  token bigint NOT NULL,
  model text,
  at timestamptz NOT NULL DEFAULT pgdurable.now()
);
CREATE INDEX budget_ledger_settled_idx ON pgdurable.budget_ledger (budget_key, unit, at)
  WHERE kind = 'settle';
CREATE UNIQUE INDEX budget_ledger_settle_once_idx
  ON pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit) WHERE kind = 'settle';
CREATE INDEX budget_ledger_run_idx ON pgdurable.budget_ledger (run_id);
COMMENT ON TABLE pgdurable.budget_ledger IS
  'Every reservation, settlement and release of a budget (append-only; settled once per run, step, '
  'reservation key, budget and unit). Not a foreign key to runs: retention keeps the spend.';
COMMENT ON COLUMN pgdurable.budget_ledger.id IS 'Order of writing.';
COMMENT ON COLUMN pgdurable.budget_ledger.run_id IS 'The run charged.';
COMMENT ON COLUMN pgdurable.budget_ledger.step IS 'The step index.';
COMMENT ON COLUMN pgdurable.budget_ledger.rkey IS 'The reservation''s key within the step.';
COMMENT ON COLUMN pgdurable.budget_ledger.budget_key IS 'The budget.';
COMMENT ON COLUMN pgdurable.budget_ledger.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_ledger.kind IS
  'reserve (capacity held), settle (the actual spend) or release (held capacity returned).';
COMMENT ON COLUMN pgdurable.budget_ledger.amount IS 'The amount (>= 0).';
COMMENT ON COLUMN pgdurable.budget_ledger.token IS 'The lease token of the writer.';
COMMENT ON COLUMN pgdurable.budget_ledger.model IS 'The model a settlement named (price table), else NULL.';
COMMENT ON COLUMN pgdurable.budget_ledger.at IS 'When (database clock): windows count settlements by it.';

CREATE TABLE pgdurable.budget_prices (
  model text PRIMARY KEY CHECK (model <> '' AND length(model) <= 200),
  usd_per_token_in numeric NOT NULL CHECK (usd_per_token_in >= 0),
  usd_per_token_out numeric NOT NULL CHECK (usd_per_token_out >= 0),
  updated_at timestamptz NOT NULL DEFAULT pgdurable.now()
);
COMMENT ON TABLE pgdurable.budget_prices IS
  'Model prices: a settlement naming a model, with tokens_in/tokens_out and no usd, is charged '
  'tokens_in * usd_per_token_in + tokens_out * usd_per_token_out.';
COMMENT ON COLUMN pgdurable.budget_prices.model IS 'The model''s name, as settlements name it.';
COMMENT ON COLUMN pgdurable.budget_prices.usd_per_token_in IS 'USD per input token.';
COMMENT ON COLUMN pgdurable.budget_prices.usd_per_token_out IS 'USD per output token.';
COMMENT ON COLUMN pgdurable.budget_prices.updated_at IS 'When the price was last set.';

-- The app role calls them (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.budget_set(text,jsonb,text,interval,text)', false),
  ('pgdurable.budget_price_set(text,numeric,numeric)', false),
  ('pgdurable.budget_started_run(uuid,text[],jsonb)', false),
  ('pgdurable.budget_reserve(uuid,bigint,text,integer,text,jsonb)', false),
  ('pgdurable.budget_settle(uuid,bigint,text,integer,text,jsonb,text)', false),
  ('pgdurable.budget_release(uuid,bigint,text,integer,text)', false);
