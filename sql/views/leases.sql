-- views/leases.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- active_leases: the live leases, readable.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.active_leases AS
  SELECT pgdurable.lease_display(l.key)    AS key,
         pgdurable.lease_display(l.owner)  AS owner,
         l.token,
         l.acquired_at,
         l.expires_at,
         l.expires_at - pgdurable.now()     AS ttl_remaining,
         l.key                              AS key_bytes,
         l.owner                            AS owner_bytes
    FROM pgdurable.leases l
   WHERE l.owner IS NOT NULL AND l.expires_at > pgdurable.now();
COMMENT ON VIEW pgdurable.active_leases IS
  'Live leases (owner set, expires_at > pgdurable.now()) with key and owner shown readably.';
COMMENT ON COLUMN pgdurable.active_leases.key IS
  'Lease key as text: UTF-8 decoded, NUL shown as ␀ (display only; key_bytes is exact).';
COMMENT ON COLUMN pgdurable.active_leases.owner IS
  'Holder as text: UTF-8 decoded, NUL shown as ␀ (display only; owner_bytes is exact).';
COMMENT ON COLUMN pgdurable.active_leases.token IS 'Fencing token of the current grant.';
COMMENT ON COLUMN pgdurable.active_leases.acquired_at IS
  'When the current owner was granted the lease (acquire or transfer).';
COMMENT ON COLUMN pgdurable.active_leases.expires_at IS 'When the grant lapses (database clock).';
COMMENT ON COLUMN pgdurable.active_leases.ttl_remaining IS
  'Time left before expiry: expires_at - pgdurable.now().';
COMMENT ON COLUMN pgdurable.active_leases.key_bytes IS 'The exact key (UTF-8 bytes).';
COMMENT ON COLUMN pgdurable.active_leases.owner_bytes IS 'The exact owner (UTF-8 bytes).';
