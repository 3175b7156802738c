-- 0041_start_children: start_children (sql/functions/children.sql), a parent's
-- many children in one fenced statement (ctx.start_children), is called by the
-- app role (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.start_children(uuid,bigint,text[],text[],text[],jsonb[],text[],integer[],integer[],interval[],timestamptz[],numeric[],text[])', false);
