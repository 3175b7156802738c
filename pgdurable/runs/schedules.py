"""Schedules: cron and interval runs stored in Postgres, one run per tick.

A schedule is a row of ``pgdurable.schedules`` (``sql/0013_schedules.sql``):
a cadence (``cron`` in a ``timezone``, or a fixed ``every``), the task its
ticks start, a start ``state`` and ``queue``, an ``overlap`` and a ``catchup``
policy, ``paused``, and ``next_fire_at`` -- the next tick on the database
clock. Schedules are declared in code (:meth:`Durable.schedule`, upserted
when a worker starts), or made with the CLI (``pgdurable schedule add``) or
SQL (``pgdurable.upsert_schedule``); they work the same.

The split between Python and SQL:

* Python evaluates the cadence (:class:`Cadence`: cron parsed by ``cronsim``,
  time zones by ``zoneinfo``): which ticks are due and the tick after them.
* The database decides who fires a tick and that it fires once:
  ``pgdurable.fire_schedule(name, expected, ticks, next)`` runs in ONE
  transaction that locks the row ``FOR UPDATE SKIP LOCKED`` only while its
  ``next_fire_at`` still equals the value the plan was made from (the fence),
  starts each tick's run through ``start_run`` with the idempotency key
  (schedule, tick), applies the overlap policy and advances ``next_fire_at``.
  Two workers racing for a tick start one run; a worker killed mid-fire
  either committed (the tick is done) or did not (the next worker fires it).

Time zones and daylight saving (``cron`` only; ``every`` counts real time):
ticks are the cron's wall-clock times read in ``timezone`` with the *earlier*
UTC offset where a wall time is ambiguous or missing (``fold=0``):

* a wall time in a **skipped** hour (spring forward) fires once, one hour
  later on the wall clock (02:30 becomes 03:30); when that instant is also a
  tick of its own (03:30 of ``*/30``), it fires once, not twice;
* a wall time in a **repeated** hour (fall back) fires once, in its first
  occurrence (summer time); the second pass through that hour fires nothing.

Catch-up: a tick more than :data:`MISFIRE_GRACE` late counts as *missed*
(no worker was up). ``catchup="none"`` drops missed ticks, ``"latest"`` fires
only the newest due tick, ``"all"`` fires every missed tick, oldest first, at
most ``catchup_limit`` of them (the newest). Pausing stops a schedule; resuming
plans from now (ticks that fell in the pause are not caught up).

Workers: :class:`Ticker` is the worker's hook. The worker's idle query asks
``pgdurable.schedule_wakeup`` in the same statement as ``next_wakeup``, so an
idle worker sleeps until the next tick (no polling loop of its own); when a
tick is due it reads the due schedules of its queues and fires them.
"""

from __future__ import annotations

import logging
import time
import weakref
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from cronsim import CronSim, CronSimError

from ..foundation import jsonb as _json
from ..foundation import run_queries as q
from ..foundation.db import translated
from ..foundation.errors import PgDurableError, ScheduleNotFound
from ..foundation.queries import schedules as sq
from ..foundation.queries.clock import NOW
from ..foundation.queries.core import first, first_sync, many, many_sync, one, one_sync
from ..foundation.queries.schedules import DueSchedule, ScheduleInfo, StoredCadence

if TYPE_CHECKING:
    from ..foundation.ports import App

__all__ = [
    "CATCHUPS",
    "MISFIRE_GRACE",
    "OVERLAPS",
    "Cadence",
    "Schedule",
    "ScheduleInfo",
    "Ticker",
    "delete_schedule",
    "list_schedules",
    "list_schedules_on",
    "list_schedules_sync",
    "make_schedule",
    "pause_schedule",
    "resume_schedule",
    "resume_schedule_on",
    "resume_schedule_sync",
    "trigger_schedule",
    "upsert_schedule",
    "upsert_schedule_on",
    "upsert_schedule_sync",
]

log = logging.getLogger("pgdurable.schedules")

OVERLAPS = ("skip", "allow", "cancel_previous")
CATCHUPS = ("none", "latest", "all")
#: A tick later than this is "missed" (``catchup="none"`` drops it).
MISFIRE_GRACE = timedelta(minutes=1)
MAX_CATCHUP_LIMIT = 10_000
MAX_SCHEDULE_NAME_BYTES = 500
#: ``declared_by`` of schedules declared in code (``app.schedule``).
DECLARED_BY_CODE = "code"
# how far DST can move a wall clock (the reverse cron search starts this far ahead)
_DST_MARGIN = timedelta(hours=3)
_DUE_BATCH = 100
#: After a failed attempt to fire, a worker waits this long (seconds) before the next one.
ERROR_BACKOFF = 5.0

# -- validation ------------------------------------------------------------------------
def _check_choice(value: object, choices: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_schedule_name(name: object) -> str:
    """A schedule name (non-empty str, at most 500 UTF-8 bytes), else TypeError/ValueError."""
    q.check_name(name, "schedule name")
    assert isinstance(name, str)
    if len(name.encode("utf-8")) > MAX_SCHEDULE_NAME_BYTES:
        raise ValueError(f"schedule name is longer than {MAX_SCHEDULE_NAME_BYTES} bytes (UTF-8)")
    return name


def _zone(name: object) -> zoneinfo.ZoneInfo:
    if not isinstance(name, str):
        raise TypeError(f"timezone must be a str (an IANA name), not {type(name).__name__}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as "
                         "'Europe/Berlin' or 'UTC')") from None


@dataclass(frozen=True)
class Cadence:
    """When a schedule ticks: ``cron`` read in ``timezone``, or every ``every``.

    Pure arithmetic on aware datetimes (no database): :meth:`after` is the
    first tick after an instant, :meth:`plan` the ticks to fire and the next
    one. Build it with :meth:`of`, which validates.
    """

    cron: str | None
    every: timedelta | None
    timezone: str

    @classmethod
    def of(cls, cron: object = None, every: object = None, timezone: object = "UTC") -> Cadence:
        """Validate and build; ValueError naming a bad cron, time zone or interval."""
        if (cron is None) == (every is None):
            raise ValueError("give exactly one of cron= and every= "
                             f"(got {'both' if cron is not None else 'neither'})")
        zone = _zone(timezone)
        if cron is not None:
            if not isinstance(cron, str):
                raise TypeError(f"cron must be a str, not {type(cron).__name__}")
            try:
                CronSim(cron, datetime(2000, 1, 1))
            except CronSimError as exc:
                raise ValueError(f"invalid cron expression {cron!r}: {exc}") from None
            return cls(cron, None, zone.key)
        if not isinstance(every, timedelta):
            raise TypeError(f"every must be a timedelta, not {type(every).__name__}")
        if every < timedelta(seconds=1):
            raise ValueError(f"every must be at least 1 second, got {every}")
        return cls(None, every, zone.key)

    # -- cron on the wall clock ---------------------------------------------------------
    def _instant(self, wall: datetime) -> datetime:
        """A naive wall time in the zone as a UTC instant (fold=0: the earlier offset)."""
        return wall.replace(tzinfo=zoneinfo.ZoneInfo(self.timezone)).astimezone(UTC)

    def _wall(self, instant: datetime) -> datetime:
        return instant.astimezone(zoneinfo.ZoneInfo(self.timezone)).replace(tzinfo=None)

    def after(self, instant: datetime) -> datetime:
        """The first tick strictly after ``instant`` (for ``every``: ``instant`` + every,
        on whole seconds)."""
        instant = instant.astimezone(UTC)
        if self.every is not None:
            return instant.replace(microsecond=0) + self.every
        assert self.cron is not None
        for wall in CronSim(self.cron, self._wall(instant)):
            t = self._instant(wall)
            if t > instant:
                return t
        raise ValueError(f"cron expression {self.cron!r} has no next tick")  # pragma: no cover

    def _latest(self, first: datetime, now: datetime, n: int) -> list[datetime]:
        """Up to ``n`` newest ticks in [first, now], ascending (first is a tick)."""
        if self.every is not None:
            k = (now - first) // self.every
            return [first + i * self.every for i in range(max(0, k - n + 1), k + 1)]
        assert self.cron is not None
        out: list[datetime] = []
        start = self._wall(now + _DST_MARGIN) + timedelta(seconds=1)
        for wall in CronSim(self.cron, start, reverse=True):
            t = self._instant(wall)
            if t < first:
                break
            if t <= now and (not out or t < out[-1]):
                out.append(t)
                if len(out) >= n:
                    break
        if not out:  # first itself is the only due tick (e.g. planned by an older cron)
            out.append(first)
        return out[::-1]

    def plan(self, first: datetime, now: datetime, catchup: str,
             limit: int) -> tuple[list[datetime], datetime]:
        """Which due ticks to fire and the next tick, for a schedule whose next
        tick ``first`` is due (``first <= now``) under ``catchup``."""
        first, now = first.astimezone(UTC), now.astimezone(UTC)
        if first > now:
            return [], first
        n = limit if catchup == "all" else 1
        ticks = self._latest(first, now, n)
        if self.every is not None:
            nxt = ticks[-1] + self.every
        else:
            nxt = self.after(max(now, ticks[-1]))
        if catchup == "none":
            ticks = [t for t in ticks if now - t <= MISFIRE_GRACE]
        return ticks, nxt


@dataclass(frozen=True)
class Schedule:
    """A validated schedule definition (what :meth:`Durable.schedule` declares)."""

    name: str
    task: str
    cadence: Cadence
    state: Any = None
    queue: str = "default"
    overlap: str = "skip"
    catchup: str = "latest"
    catchup_limit: int = 100
    revision: str = "1"
    max_attempts: int = 3

    def upsert_params(self, now: datetime, declared_by: str | None) -> tuple[Any, ...]:
        """Parameters of :data:`~pgdurable.foundation.queries.schedules.UPSERT`; the first
        tick is the first one after ``now``."""
        c = self.cadence
        return (self.name, c.cron, c.every, c.timezone, self.task, self.revision,
                _json.dumps({} if self.state is None else self.state, "state"), self.queue,
                self.max_attempts, self.overlap, self.catchup, self.catchup_limit,
                c.after(now), declared_by)


def make_schedule(
    name: object,
    *,
    task: object,
    cron: object = None,
    every: object = None,
    timezone: object = "UTC",
    state: object = None,
    queue: object = "default",
    overlap: object = "skip",
    catchup: object = "latest",
    catchup_limit: object = 100,
    revision: object = None,
    max_attempts: object = None,
    tasks: dict[str, Any] | None = None,
) -> Schedule:
    """Validate a schedule definition (before any SQL); TypeError/ValueError naming
    the bad argument. With ``tasks`` (an app's registry), an unknown task is a
    ValueError and the task's revision, ``max_attempts`` and state checks apply."""
    check_schedule_name(name)
    q.check_name(task, "task")
    q.check_name(queue, "queue")
    cadence = Cadence.of(cron, every, timezone)
    _check_choice(overlap, OVERLAPS, "overlap")
    _check_choice(catchup, CATCHUPS, "catchup")
    if (isinstance(catchup_limit, bool) or not isinstance(catchup_limit, int)
            or not 1 <= catchup_limit <= MAX_CATCHUP_LIMIT):
        raise ValueError(f"catchup_limit must be an int from 1 to {MAX_CATCHUP_LIMIT}, "
                         f"got {catchup_limit!r}")
    assert isinstance(name, str) and isinstance(task, str) and isinstance(queue, str)
    spec = None
    if tasks is not None:
        spec = tasks.get(task)
        if spec is None:
            raise ValueError(f"schedule {name!r}: unknown task {task!r} "
                             f"(registered: {sorted(tasks)})")
    rev = revision if revision is not None else (spec.revision if spec is not None else "1")
    q.check_name(rev, "revision")
    attempts = max_attempts if max_attempts is not None else (
        spec.max_attempts if spec is not None else 3)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"max_attempts must be an int >= 1, got {attempts!r}")
    if spec is not None and spec.revision == rev and spec.prepare_state is not None:
        state = spec.prepare_state(state)
    _json.dumps({} if state is None else state, "state")
    assert isinstance(rev, str)
    return Schedule(name, task, cadence, state, queue, str(overlap), str(catchup),
                    catchup_limit, rev, attempts)


# -- schedules declared in code, per app ---------------------------------------------
_DECLARED: weakref.WeakKeyDictionary[Any, dict[str, Schedule]] = weakref.WeakKeyDictionary()


def declared(app: App) -> dict[str, Schedule]:
    """The schedules ``app`` declares in code, by name."""
    return _DECLARED.setdefault(app, {})


def declare(app: App, name: str, **definition: Any) -> Schedule:
    """Validate a schedule against ``app``'s tasks and remember it (written at worker start)."""
    schedule = make_schedule(name, tasks=app.tasks, **definition)
    mine = declared(app)
    if name in mine and mine[name] != schedule:
        raise ValueError(f"schedule {name!r} is already declared differently")
    mine[name] = schedule
    return schedule


async def declare_all(app: App, queues: Sequence[str] = ()) -> float | None:
    """Upsert ``app``'s declared schedules and mark the ones of its tasks it no
    longer declares (one transaction; called when a worker starts). Returns the
    seconds until the next tick in ``queues`` (None: none)."""
    mine = sorted(declared(app).values(), key=lambda s: s.name)  # one lock order
    with translated():
        async with (await _pool(app)).connection() as conn, conn.transaction():
            await one(conn, sq.DECLARE_LOCK, (sq.DECLARE_LOCK_KEY,))
            now = await one(conn, NOW)
            for s in mine:
                await one(conn, sq.UPSERT, s.upsert_params(now, DECLARED_BY_CODE))
            await one(conn, sq.MARK_UNDECLARED, (DECLARED_BY_CODE, sorted(app.tasks),
                                                 [s.name for s in mine]))
            return await one(conn, sq.WAKEUP, (list(queues),))


async def _pool(app: App) -> Any:
    """The app's pool, opened (the schema checked) on first use."""
    await app.open()
    return app.pool


# -- operations (async on an app; sync twins on a connection for the CLI) -------------
async def upsert_schedule(app: App, schedule: Schedule, *,
                          declared_by: str | None = None) -> str:
    """Create or update ``schedule`` (``'created'``, ``'updated'`` or ``'unchanged'``)."""
    with translated():
        async with (await _pool(app)).connection() as conn:
            return await upsert_schedule_on(conn, schedule, declared_by=declared_by)


async def pause_schedule(app: App, name: str) -> bool:
    """Pause; False if it was paused already (:class:`ScheduleNotFound` if unknown)."""
    return await one(app, sq.PAUSE, (check_schedule_name(name),))


def _resume_plan(stored: StoredCadence | None, name: str) -> datetime:
    if stored is None:
        raise ScheduleNotFound(f"no schedule {name}")
    # ValueError for a bad cron written by SQL
    return Cadence.of(stored.cron, stored.every, stored.timezone).after(stored.now)


async def resume_schedule(app: App, name: str) -> bool:
    """Resume from the next tick after now (ticks missed while paused are not
    caught up); False if it was not paused (:class:`ScheduleNotFound` if unknown)."""
    check_schedule_name(name)
    with translated():
        async with (await _pool(app)).connection() as conn:
            return await resume_schedule_on(conn, name)


async def delete_schedule(app: App, name: str) -> bool:
    """Delete (its runs stay); False if there was none."""
    return await one(app, sq.DELETE, (check_schedule_name(name),))


async def trigger_schedule(app: App, name: str) -> str:
    """Start a run now, outside the cadence; its id (:class:`ScheduleNotFound` if unknown)."""
    return await one(app, sq.TRIGGER, (check_schedule_name(name),))


async def list_schedules(app: App, name: str | None = None) -> list[ScheduleInfo]:
    """Every schedule (or the one named), by name."""
    return await many(app, sq.LIST, (name, name))


# On an open autocommit connection: ``X_on`` (async: the dashboard's pool) and its
# generated twin ``X_sync`` (the command line's connection).
# async-to-sync: source
async def upsert_schedule_on(conn: psycopg.AsyncConnection[Any], schedule: Schedule, *,
                             declared_by: str | None = None) -> str:
    """:func:`upsert_schedule` on an open autocommit connection."""
    with translated():
        async with conn.transaction():
            now = await one(conn, NOW)
            return await one(conn, sq.UPSERT, schedule.upsert_params(now, declared_by))


async def resume_schedule_on(conn: psycopg.AsyncConnection[Any], name: str) -> bool:
    """:func:`resume_schedule` on an open autocommit connection."""
    check_schedule_name(name)
    with translated():
        async with conn.transaction():
            nxt = _resume_plan(await first(conn, sq.CADENCE_FOR_UPDATE, (name,)), name)
            return await one(conn, sq.RESUME, (name, nxt))


async def list_schedules_on(conn: psycopg.AsyncConnection[Any],
                            name: str | None = None) -> list[ScheduleInfo]:
    """:func:`list_schedules` on an open autocommit connection."""
    with translated():
        return await many(conn, sq.LIST, (name, name))
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def upsert_schedule_sync(conn: psycopg.Connection[Any], schedule: Schedule, *,
                         declared_by: str | None = None) -> str:
    """:func:`upsert_schedule` on an open autocommit connection."""
    with translated():
        with conn.transaction():
            now = one_sync(conn, NOW)
            return one_sync(conn, sq.UPSERT, schedule.upsert_params(now, declared_by))


def resume_schedule_sync(conn: psycopg.Connection[Any], name: str) -> bool:
    """:func:`resume_schedule` on an open autocommit connection."""
    check_schedule_name(name)
    with translated():
        with conn.transaction():
            nxt = _resume_plan(first_sync(conn, sq.CADENCE_FOR_UPDATE, (name,)), name)
            return one_sync(conn, sq.RESUME, (name, nxt))


def list_schedules_sync(conn: psycopg.Connection[Any],
                        name: str | None = None) -> list[ScheduleInfo]:
    """:func:`list_schedules` on an open autocommit connection."""
    with translated():
        return many_sync(conn, sq.LIST, (name, name))
# async-to-sync: end


# -- the worker's hook -----------------------------------------------------------------
class Ticker:
    """Fires the due ticks of the schedules in a worker's queues: a worker's loop
    service (:class:`pgdurable.engine.services.LoopService`), plugged in by
    ``Durable.worker()``.

    The worker (1) calls :meth:`start` (:meth:`declare`) when it starts, (2) hands the
    column its :attr:`probe` adds to its idle query (``schedule_wakeup`` next to
    ``next_wakeup``) to :meth:`note`, (3) bounds its sleep with :meth:`timeout` and
    (4) calls :meth:`on_wake` (:meth:`fire_if_due`) whenever it wakes. Errors of the
    last three are logged, never raised: a database hiccup must not stop the worker.
    """

    #: The idle query's column of the ticker: seconds until the next tick in the
    #: worker's queues (NULL: none).
    probe: str | None = sq.WAKEUP_PROBE

    def __init__(self, app: App, queues: Sequence[str]) -> None:
        self.app = app
        self.queues = list(queues)
        self._due_at: float | None = None  # monotonic time of the next known tick
        self._quiet_until = 0.0  # no firing before this (monotonic) after an error
        self.fire_count = 0  # fire_schedule calls (tests, metrics)

    async def start(self, worker_id: str) -> None:
        """The worker starts: :meth:`declare` (raises: the worker does not start)."""
        await self.declare()

    async def stop(self, worker_id: str) -> None:
        """The worker stops: nothing to undo."""

    async def on_wake(self) -> None:
        """The claim loop woke: :meth:`fire_if_due`."""
        await self.fire_if_due()

    async def declare(self) -> None:
        """Upsert the app's declared schedules and learn the next tick (worker start:
        a worker whose slots fill at once still fires the ticks it knows of)."""
        self.note(await declare_all(self.app, self.queues))

    def note(self, seconds: float | None, min_delay: float = 0.0) -> None:
        """The next tick is due in ``seconds`` (database clock; None: no schedule)."""
        if seconds is None:
            self._due_at = None
        else:
            delay = seconds + 0.001 if seconds > 0 else min_delay
            self._due_at = time.monotonic() + delay

    def timeout(self, timeout: float) -> float:
        """``timeout`` shortened to the next known tick."""
        if self._due_at is None:
            return timeout
        due = max(self._due_at, self._quiet_until)
        return min(timeout, max(0.0, due - time.monotonic()))

    async def fire_if_due(self) -> None:
        """Fire due ticks if the next known tick has come (no query otherwise)."""
        now = time.monotonic()
        if self._due_at is not None and now >= self._due_at and now >= self._quiet_until:
            await self.fire_due()

    async def fire_due(self) -> None:
        """Fire every due schedule of these queues once, then learn the next tick."""
        try:
            for due in await many(self.app, sq.DUE, (self.queues, _DUE_BATCH)):
                await self._fire(due)
            more = await one(self.app, sq.WAKEUP, (self.queues,))
        except (PgDurableError, psycopg.Error, OSError) as exc:
            # back off: a persistent error must not turn the claim loop into a busy loop
            log.warning("firing schedules failed (retrying in %.0f s): %s", ERROR_BACKOFF, exc)
            self._quiet_until = time.monotonic() + ERROR_BACKOFF
            return
        # still due: another worker holds it (SKIP LOCKED) or more are due; look again soon
        self.note(more, min_delay=0.05)

    async def _fire(self, due: DueSchedule) -> None:
        name, at = due.name, due.next_fire_at
        try:
            ticks, nxt = Cadence.of(due.cron, due.every, due.timezone).plan(
                at, due.db_now, due.catchup, due.catchup_limit)
        except (ValueError, TypeError, CronSimError) as exc:
            log.error("schedule %r cannot be planned, pausing it: %s", name, exc)
            await one(self.app, sq.DISABLE, (name, at, str(exc)))
            return
        self.fire_count += 1
        for fired in await many(self.app, sq.FIRE, (name, at, ticks, nxt)):
            log.info("schedule %r tick %s: %s %s", name, fired.tick.isoformat(), fired.outcome,
                     fired.run_id or "")
