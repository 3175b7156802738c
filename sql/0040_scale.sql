-- 0040_scale: send_signals (sql/functions/signals.sql), many signals in one
-- statement and transaction, is called by the app role
-- (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.send_signals(text[],text[],jsonb[],text[],interval)', false);
