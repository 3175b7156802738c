"""What the pytest plugin and the test helpers send (:mod:`pgdurable.ops.testing`): busy
queues, firing timers early, the test clock, the databases of a test session. Test-only:
never against a production database."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from .core import Query, Row, scalar, statement

__all__ = ["BUSY", "CREATE_DATABASE", "DROP_DATABASE", "FIRE", "PING", "TEMPLATE", "TEST_CLOCK",
           "Fired"]


@dataclass(frozen=True, slots=True)
class Fired:
    """Timers made due: how many runs are due now, how many queues were notified."""

    due: int
    notified: int


def _fired(r: Row) -> Fired:
    due, notified = r
    return Fired(int(due), int(notified))


# -- names of the app's task pairs' queues with work a worker would take now:
# -- runnable and available, leased (held or expired), or parked with a due timer
BUSY = scalar("""
SELECT DISTINCT r.queue FROM pgdurable.runs r
 WHERE (r.task, r.revision) IN (SELECT u.t, u.v FROM unnest(%(tasks)s::text[], %(revs)s::text[]) AS u(t, v))
   AND (%(queues)s::text[] IS NULL OR r.queue = ANY (%(queues)s::text[]))
   AND ((r.status = 'runnable' AND r.available_at <= pgdurable.now())
        OR r.status = 'leased'
        OR (r.status = 'waiting' AND r.wake_at <= pgdurable.now()))
""", str)

# -- TEST-ONLY: shift future timers (wake_at of parked runs, available_at of
# -- retry backoffs) back by %(advance)s, or to now when it is NULL; NOTIFY
# -- pgdurable_wake once per queue with a run now due; one Fired (how many are due,
# -- how many queues were notified)
FIRE = Query("""
WITH moved AS (
  UPDATE pgdurable.runs r
     SET wake_at = CASE WHEN r.status = 'waiting'
                        THEN coalesce(r.wake_at - %(advance)s::interval, pgdurable.now())
                        ELSE r.wake_at END,
         available_at = CASE WHEN r.status = 'runnable'
                             THEN coalesce(r.available_at - %(advance)s::interval, pgdurable.now())
                             ELSE r.available_at END
   WHERE (r.status = 'waiting' AND r.wake_at > pgdurable.now())
      OR (r.status = 'runnable' AND r.available_at > pgdurable.now())
  RETURNING r.queue,
            (CASE WHEN r.status = 'waiting' THEN r.wake_at ELSE r.available_at END)
              <= pgdurable.now() AS due
), woken AS (
  SELECT pg_notify('pgdurable_wake', m.queue) FROM (SELECT DISTINCT queue FROM moved WHERE due) m
)
SELECT (SELECT count(*) FROM moved WHERE due), (SELECT count(*) FROM woken)
""", _fired)
# -- make pgdurable.now() honour SET [LOCAL] pgdurable.now (owner or superuser only; 0009)
TEST_CLOCK = statement("SELECT pgdurable.set_test_clock(%s)")
# -- is the server there (any answer will do)?
PING = statement("SELECT 1")
# -- commands (no rows), composed with the database's name (an identifier)
CREATE_DATABASE = sql.SQL("CREATE DATABASE {}")
TEMPLATE = sql.SQL("{} TEMPLATE {}")  # CREATE_DATABASE from a template database
DROP_DATABASE = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
