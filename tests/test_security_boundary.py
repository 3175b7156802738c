"""The database boundary (issue 12): pinned search_path, NOTIFY as a hint, the
role model, the test clock, migrate adoption, (task, revision) pairs.

Attackers are real separate roles on their own connections; every role is
named uniquely (pid + uuid) and dropped at teardown.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _released import migrate_released
from _roles import as_role, cli, grant, roles
from _waiting import finished, running, until
from psycopg import sql

import pgdurable
from pgdurable import Continue, Done, Durable, RunContext, Wait
from pgdurable.foundation import migrations
from pgdurable.foundation.errors import (
    InvalidInput,
    LeaseLost,
    MigrationError,
    SchemaVersionMismatch,
)

PINNED = "search_path=pg_catalog, pgdurable, pg_temp"

RUNS_CHECK = ("pgdurable._runs_check(text,text,text,integer,integer,integer,integer,integer,"
              "numeric,text,text,text,uuid,uuid,integer)")

# the names other test modules import from here (test_dashboard, test_integration_seams)
_as = as_role
_grant = grant
__all__ = ["_as", "_grant", "roles"]


# ---------------------------------------------------------------------------------------
# 1. search_path pinned; shadow functions in public never run
# ---------------------------------------------------------------------------------------

def test_every_function_pins_search_path_or_is_an_allowed_inlinable_helper(
    conn: psycopg.Connection[Any],
) -> None:
    """Fails when any function of schema pgdurable (this or a later migration's)
    lacks the pinned search_path, or a state transition is not SECURITY DEFINER."""
    rows = conn.execute("""
        SELECT p.oid::regprocedure::text, l.lanname, p.prosecdef, p.proconfig,
               p.oid IN (SELECT * FROM pgdurable.security_inlinable()),
               p.oid IN (SELECT * FROM pgdurable.security_invoker())
          FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
         WHERE p.pronamespace = 'pgdurable'::regnamespace ORDER BY 1""").fetchall()
    assert len(rows) > 50
    unpinned = [r[0] for r in rows if not r[4] and PINNED not in (r[3] or [])]
    assert unpinned == []
    not_definer = [r[0] for r in rows if not r[4] and not r[5] and not r[2]]
    assert not_definer == []
    # the allow-list holds only tiny inlinable SQL helpers and the runs CHECK's
    # PL/pgSQL function: no SET, invoker rights
    allowed = [r for r in rows if r[4]]
    assert {r[0] for r in allowed} >= {"pgdurable.now()", "pgdurable.wait_lock_key(text,text)"}
    assert all(r[3] is None and not r[2] for r in allowed), allowed
    assert [r[0] for r in allowed if r[1] != "sql"] == [RUNS_CHECK], allowed


def test_inlinable_helpers_call_only_schema_qualified_builtins(conn: psycopg.Connection[Any]) -> None:
    """Static check of the allow-list: every function call is qualified
    (pg_catalog. or pgdurable.) and no bare operator is used (only
    OPERATOR(pg_catalog.x) or a pg_catalog function), so nothing resolves
    through the caller's search_path."""
    rows = conn.execute("SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p "
                        "WHERE p.oid IN (SELECT * FROM pgdurable.security_inlinable())").fetchall()
    assert RUNS_CHECK in {r[0] for r in rows}
    for name, src in rows:
        body = re.sub(r"E?'(?:[^']|'')*'", "''", src)  # string literals out
        body = re.sub(r"::\s*pg_catalog\.\w+", "", body)  # qualified casts out
        body = re.sub(r"--[^\n]*", "", body)  # comments out
        if name == RUNS_CHECK:  # PL/pgSQL: its assignment and RAISE options are not SQL
            body = re.sub(r"\bUSING\b[^;]*;", ";", body).replace(":=", "")
        ops = re.sub(r"OPERATOR\(pg_catalog\.[^)]*\)", "", body)  # qualified operators out
        calls = re.findall(r"(?<![.\w])(\w+)\s*\(", ops)
        assert set(calls) <= {"coalesce", "SELECT", "select", "NOT", "ANY"}, (name, calls)
        assert not re.search(r"::\s*(?!pg_catalog\.)\w", body), (name, "unqualified cast")
        assert not re.search(r"[<>=~!+*/|&^%-]", ops), (name, ops)


_SHADOWS = """
CREATE TABLE public.tripwire (what text, by_role text DEFAULT current_user);
GRANT INSERT, SELECT ON public.tripwire TO PUBLIC;
CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('hashtextextended'); RETURN 1; END $$;
CREATE FUNCTION public.hashtextextended(text, bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('hashtextextended8'); RETURN 1; END $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('now'); RETURN '2100-01-01'; END $$;
CREATE FUNCTION public.current_setting(text, boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('current_setting'); RETURN NULL; END $$;
CREATE FUNCTION public.textcat(text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('textcat'); RETURN $1; END $$;
CREATE FUNCTION public.format(text, numeric, numeric) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('format_nn'); RETURN $1; END $$;
CREATE FUNCTION public.format(text, timestamptz) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('format_ts'); RETURN $1; END $$;
CREATE FUNCTION public.texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('texteq'); RETURN pg_catalog.texteq($1, $2); END $$;
CREATE FUNCTION public.shadow_concat(text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('operator ||'); RETURN pg_catalog.textcat($1, $2); END $$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = public.shadow_concat);
CREATE FUNCTION public.shadow_numgt(numeric, numeric) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('operator >'); RETURN pg_catalog.numeric_gt($1, $2); END $$;
CREATE OPERATOR public.> (LEFTARG = numeric, RIGHTARG = numeric, FUNCTION = public.shadow_numgt);
CREATE FUNCTION public.int4lt(integer, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('int4lt'); RETURN pg_catalog.int4lt($1, $2); END $$;
CREATE FUNCTION public.shadow_texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('operator ='); RETURN pg_catalog.texteq($1, $2); END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.shadow_texteq);
CREATE FUNCTION public.shadow_textne(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.tripwire (what) VALUES ('operator <>'); RETURN pg_catalog.textne($1, $2); END $$;
CREATE OPERATOR public.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = public.shadow_textne);
"""


def _plant_shadows(dsn: str, attacker: str) -> None:
    """The attacker owns the database (PG 15+: may CREATE in public) and plants shadows."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
            sql.Identifier(c.info.dbname), sql.Identifier(attacker)))
        c.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(attacker)))
    with psycopg.connect(as_role(dsn, attacker), autocommit=True) as c:
        c.execute(_SHADOWS)


def _tripped(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as c:
        return [(r[0], r[1]) for r in c.execute("SELECT what, by_role FROM public.tripwire").fetchall()]


async def test_shadow_functions_in_public_never_run_for_a_superuser(dsn: str) -> None:
    with roles(dsn, "LOGIN") as (attacker,):
        _plant_shadows(dsn, attacker)
        # the superuser's CLI: pgdurable signal (wait_lock_key -> hashtextextended)
        r = cli("signal", "ci", "build-1", "--dsn", dsn)
        assert r.returncode == 0, r.stderr
        # a whole lifecycle through the library, as the superuser, default search_path
        app = Durable(dsn)

        @app.task("shadowed", revision="1")
        async def shadowed(ctx: RunContext, state: dict[str, Any]) -> Any:
            if ctx.step == 0:
                return Wait(signal=("approval", state["ref"]), timeout=timedelta(hours=1))
            return Done({"wake": ctx.wake is not None})

        try:
            rid = await app.start("shadowed", {"ref": "r1"}, budget=10)
            async with running(app.worker(poll_interval=0.2)):
                async def parked() -> bool:
                    return (await app.get_run(rid)).status == "waiting"

                await until(parked, "the run to park")
                await app.signal("approval", "r1", {"ok": True})
                info = await finished(app, rid)
            assert info.status == "completed", info.error
            other = await app.start("shadowed", {"ref": "r2"})
            assert await app.cancel(other) == "cancelled"
        finally:
            await app.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT * FROM pgdurable.acquire_lease('k', 'o', 10000)")
            c.execute("SELECT pgdurable.release_lease('k', 'o')")
        assert _tripped(dsn) == []


def test_inlinable_helpers_resolve_no_builtin_through_the_callers_search_path(
    dsn: str,
) -> None:
    """Called directly from a session whose search_path puts public FIRST (so an
    unqualified built-in would be the attacker's), the allow-listed helpers run
    none of the shadows: every built-in in them is schema-qualified."""
    with roles(dsn, "LOGIN") as (attacker,):
        _plant_shadows(dsn, attacker)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO pgdurable.runs (task, revision, budget, spent, deadline_at) "
                      "VALUES ('t', '1', 1, 5, pg_catalog.now())")
            c.execute("SET search_path = public, pg_catalog")
            c.execute("""SELECT pgdurable.now(), pgdurable.wait_lock_key('a', 'b'),
                                pgdurable.task_lock_key('x'), pgdurable.is_thread_key('a\\0b'),
                                pgdurable._error('a', 'b')""")
            row = c.execute("SELECT pgdurable._verdict(r, 1, true) FROM pgdurable.runs r").fetchone()
            assert row is not None and row[0]["type"] == "BudgetExceeded"
            # the runs CHECK's function, on a direct write (a superuser's, this path)
            c.execute("INSERT INTO pgdurable.runs (task, revision, thread_key) "
                      "VALUES ('t2', '1', 'k')")
            c.execute("UPDATE pgdurable.runs SET step = 1")
            with pytest.raises(psycopg.errors.CheckViolation) as broken:
                c.execute("UPDATE pgdurable.runs SET status = 'nonsense'")
            assert broken.value.diag.constraint_name == "runs_status_check"
            # the test clock's definition too
            c.execute("SELECT pgdurable.set_test_clock(true)")
            with c.transaction():
                c.execute("SET LOCAL pgdurable.now = '2031-01-01 00:00:00+00'")
                clock = c.execute("SELECT pgdurable.now()").fetchone()
            assert clock is not None and clock[0].year == 2031
            # unchanged keys: old and new code serialise on the same advisory locks
            keys = c.execute("SELECT pgdurable.wait_lock_key('a', 'b'), "
                             "pg_catalog.hashtextextended('a' OPERATOR(pg_catalog.||) E'\\x1f' "
                             "OPERATOR(pg_catalog.||) 'b', 0::bigint)").fetchone()
            assert keys is not None and keys[0] == keys[1]
        assert _tripped(dsn) == []


# ---------------------------------------------------------------------------------------
# 2. NOTIFY is a hint
# ---------------------------------------------------------------------------------------

def test_ack_cancel_refuses_a_run_nobody_asked_to_cancel(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, "
                 "NULL, NULL, NULL)")
    rid, token = conn.execute(
        "SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', '{1}', 1, "
        "'1 min')").fetchone() or (None, None)
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT pgdurable.ack_cancel(%s, %s, 'w')", (rid, token))
    assert e.value.sqlstate == InvalidInput.sqlstate
    row = conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row == ("leased",)
    conn.execute("SELECT pgdurable.cancel_run(%s)", (rid,))
    assert conn.execute("SELECT pgdurable.ack_cancel(%s, %s, 'w')", (rid, token)).fetchone() == (
        "cancelled",)


async def test_forged_cancel_notify_from_another_role_cancels_nothing(dsn: str) -> None:
    app = Durable(dsn)
    started = asyncio.Event()
    release = asyncio.Event()

    @app.task("victim", revision="1")
    async def victim(ctx: RunContext, state: Any) -> Any:
        started.set()
        await release.wait()
        return Done("finished")

    with roles(dsn, "LOGIN") as (stranger,):
        try:
            rid = await app.start("victim", {})
            worker = app.worker(poll_interval=60)
            async with running(worker):
                await asyncio.wait_for(started.wait(), 60)
                before = worker.claim_count
                async with await psycopg.AsyncConnection.connect(
                    as_role(dsn, stranger), autocommit=True
                ) as evil:
                    await evil.execute("SELECT pg_notify('pgdurable_cancel', %s)", (rid,))
                    # a wake-up after it: once the worker claimed for it, it has
                    # read the forged cancel (one listener, commit order)
                    await evil.execute("NOTIFY pgdurable_wake, 'default'")

                async def read_both() -> bool:
                    pending = worker.listener.checks_pending  # checks in flight
                    return worker.claim_count > before and not pending

                await until(read_both, "the worker to read the forged notifications")
                release.set()
                info = await finished(app, rid)
            assert info.status == "completed" and info.result == "finished", info.error
        finally:
            await app.close()


async def test_real_cancel_still_stops_a_running_step(dsn: str) -> None:
    app = Durable(dsn)
    started = asyncio.Event()

    @app.task("long", revision="1")
    async def long(ctx: RunContext, state: Any) -> Any:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        return Done(None)

    try:
        rid = await app.start("long", {})
        async with running(app.worker(poll_interval=60, lease_ttl=60)):
            await asyncio.wait_for(started.wait(), 60)
            await app.cancel(rid)
            info = await finished(app, rid)
        assert info.status == "cancelled"
    finally:
        await app.close()


async def test_a_flood_of_forged_wake_notifications_costs_bounded_claims(dsn: str) -> None:
    """2,000 wake-ups from a stranger: the idle worker claims at most at its wake
    limiter's rate (burst + rate x elapsed), not once per notification."""
    app = Durable(dsn)

    @app.task("idle", revision="1")
    async def idle(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    with roles(dsn, "LOGIN") as (stranger,):
        try:
            worker = app.worker(poll_interval=600)
            async with running(worker):
                await until(lambda: _true(worker.claim_count >= 1), "the first claim")
                burst = float(worker.listener.wake_limit.burst)
                rate = float(worker.listener.wake_limit.rate)
                async with await psycopg.AsyncConnection.connect(
                    as_role(dsn, stranger), autocommit=True
                ) as evil:
                    await evil.execute("SELECT 1")
                    base = worker.claim_count
                    t0 = time.monotonic()
                    for _ in range(2000):
                        await evil.execute("NOTIFY pgdurable_wake, 'default'")
                    await until(lambda: _true(worker.claim_count > base), "a claim")
                    claims = worker.claim_count - base
                    elapsed = time.monotonic() - t0
            # a bound that holds at any instant, whatever the machine's speed
            assert claims <= burst + rate * elapsed + 1, (claims, elapsed)
            # and real work still gets claimed at once (a start's wake-up is not lost)
            rid = await app.start("idle", {})
            async with running(app.worker(poll_interval=600)):
                assert (await finished(app, rid)).status == "completed"
        finally:
            await app.close()


async def _true(v: bool) -> bool:
    return v


# ---------------------------------------------------------------------------------------
# 3./4. the role model and the clock
# ---------------------------------------------------------------------------------------

async def test_app_role_runs_the_lifecycle_through_functions_only(dsn: str) -> None:
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        grant(dsn, owner, app_role, ro)
        app_dsn = as_role(dsn, app_role)
        app = Durable(app_dsn)

        @app.task("lifecycle", revision="1")
        async def lifecycle(ctx: RunContext, state: dict[str, Any]) -> Any:
            if ctx.step == 0:  # a checkpoint and a recorded side effect
                async def act() -> str:
                    return "sent"

                return Continue({**state, "mail": await ctx.effect("mail", act)})
            if ctx.step == 1:
                return Wait(signal=("approval", state["ref"]), timeout=timedelta(hours=1))
            return Done({"approved": (ctx.wake or {}).get("payload"), "mail": state["mail"]})

        try:
            rid = await app.start("lifecycle", {"ref": "x"})
            async with running(app.worker(poll_interval=0.2)):
                async def parked() -> bool:
                    return (await app.get_run(rid)).status == "waiting"

                await until(parked, "the run to park")
                await app.signal("approval", "x", {"by": "alice"})
                info = await finished(app, rid)
            assert info.status == "completed", info.error
            assert info.result == {"approved": {"by": "alice"}, "mail": "sent"}
        finally:
            await app.close()
        with psycopg.connect(app_dsn, autocommit=True) as c:
            # leases through functions
            c.execute("SELECT * FROM pgdurable.acquire_lease('k', 'me', 10000)")
            assert c.execute("SELECT pgdurable.release_lease('k', 'me')").fetchone() == (True,)
            # no table DML
            for stmt in ("UPDATE pgdurable.runs SET status = 'completed'",
                         "DELETE FROM pgdurable.runs",
                         "INSERT INTO pgdurable.runs (task, revision) VALUES ('t', '1')",
                         "UPDATE pgdurable.leases SET owner = 'me'",
                         "TRUNCATE pgdurable.signals"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(stmt)
            # no completion without the token
            c.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, "
                      "NULL, NULL, NULL)")
            row = c.execute("SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', "
                            "'{t}', '{1}', 1, '1 min')").fetchone()
            assert row is not None
            with pytest.raises(psycopg.Error) as e:
                c.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', '1')", (row[0], row[1] + 1))
            assert e.value.sqlstate == LeaseLost.sqlstate
            # nor the administrative functions
            for stmt in ("SELECT pgdurable.set_test_clock(true)", "SELECT pgdurable.secure_schema()"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(stmt)
        with psycopg.connect(dsn) as c:
            owners = c.execute("""
                SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class
                 WHERE relnamespace = 'pgdurable'::regnamespace
                UNION SELECT pg_get_userbyid(proowner) FROM pg_proc
                 WHERE pronamespace = 'pgdurable'::regnamespace
                UNION SELECT pg_get_userbyid(nspowner) FROM pg_namespace
                 WHERE nspname = 'pgdurable'""").fetchall()
            assert owners == [(owner,)]


def test_readonly_role_selects_the_views_only(dsn: str) -> None:
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        grant(dsn, owner, app_role, ro)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, "
                      "NULL, NULL, NULL)")
            c.execute("SELECT * FROM pgdurable.acquire_lease('k', 'o', 60000)")
            views = [r[0] for r in c.execute(
                "SELECT c.oid::regclass::text FROM pg_class c WHERE c.relkind = 'v' "
                "AND c.relnamespace = 'pgdurable'::regnamespace").fetchall()]
        assert "pgdurable.run_overview" in views and "pgdurable.active_leases" in views
        with psycopg.connect(as_role(dsn, ro), autocommit=True) as c:
            for v in views:
                c.execute(sql.SQL("SELECT * FROM {}").format(sql.SQL(v))).fetchall()
            for stmt in ("SELECT * FROM pgdurable.runs", "SELECT * FROM pgdurable.leases",
                         "SELECT pgdurable.cancel_run(gen_random_uuid())",
                         "SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, "
                         "NULL, NULL, NULL, NULL)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(stmt)
            # a read-only dashboard announces itself on the watch-only channels
            c.execute("SELECT pgdurable.listen_presence('pgdurable_steps', 60)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("UPDATE pgdurable.listeners SET until = 'infinity'")
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT until > now() FROM pgdurable.listeners "
                             "WHERE channel = 'pgdurable_steps'").fetchone() == (True,)


def test_functions_of_a_later_migration_follow_the_role_model(dsn: str) -> None:
    """A function added after grant (as a later migration would, by a superuser)
    is handed to the owner and pinned by secure_schema, and executable by the
    app role only once it is on the allow-list (pgdurable.security_api)."""
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        grant(dsn, owner, app_role, ro)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE FUNCTION pgdurable.later_one() RETURNS int LANGUAGE sql "
                      "AS 'SELECT 1'")
            c.execute("SELECT pgdurable.secure_schema()")
            row = c.execute("SELECT pg_get_userbyid(proowner), prosecdef, proconfig FROM pg_proc "
                            "WHERE oid = 'pgdurable.later_one()'::regprocedure").fetchone()
        assert row == (owner, True, [PINNED])
        for who in (app_role, ro):  # internal until listed
            with psycopg.connect(as_role(dsn, who)) as c, pytest.raises(
                    psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pgdurable.later_one()")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO pgdurable.security_api VALUES ('pgdurable.later_one()', false)")
            c.execute("SELECT pgdurable.secure_schema()")
        with psycopg.connect(as_role(dsn, app_role)) as c:
            assert c.execute("SELECT pgdurable.later_one()").fetchone() == (1,)
        with psycopg.connect(as_role(dsn, ro)) as c, pytest.raises(
                psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT pgdurable.later_one()")
        # a listed function that does not exist (a renamed one): refused, nothing changes
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO pgdurable.security_api VALUES ('pgdurable.gone(int)', false)")
            with pytest.raises(psycopg.Error, match="gone"):
                c.execute("SELECT pgdurable.secure_schema()")
            c.execute("DELETE FROM pgdurable.security_api WHERE routine = 'pgdurable.gone(int)'")


def test_the_runs_check_function_of_0025_after_grant_is_the_roles_not_publics(
        empty_dsn: str) -> None:
    """0025 applied (as the owner) after grant_roles: the app and read-only roles may
    execute _runs_check, another role may not, so a role given DML on runs by hand
    cannot write it until it is granted EXECUTE too."""
    with roles(empty_dsn, "NOLOGIN", "LOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro, other):
        migrate_released(empty_dsn, 24)
        pgdurable.grant_roles(empty_dsn, owner_role=owner, app_role=app_role, readonly_role=ro)
        with psycopg.connect(empty_dsn, autocommit=True, options=f"-c role={owner}") as c:
            assert [m.version for m in pgdurable.migrate(c)][:2] == [25, 26]
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            granted = {r: c.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                    (r, RUNS_CHECK)).fetchone() for r in (app_role, ro, other)}
            assert granted == {app_role: (True,), ro: (True,), other: (False,)}
            c.execute(sql.SQL("GRANT USAGE ON SCHEMA pgdurable TO {0}; "
                              "GRANT INSERT ON pgdurable.runs TO {0}").format(sql.Identifier(other)))
        with psycopg.connect(as_role(empty_dsn, other), autocommit=True) as c, pytest.raises(
                psycopg.errors.InsufficientPrivilege, match="_runs_check"):
            c.execute("INSERT INTO pgdurable.runs (task, revision, queue) VALUES ('t', '1', 'q')")
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)


def test_migrations_run_as_the_owner_role(dsn: str) -> None:
    """Documented: a login member of the owner role migrates with SET ROLE."""
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro, dba):
        grant(dsn, owner, app_role, ro)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(dba)))
        with psycopg.connect(as_role(dsn, dba), autocommit=True, options=f"-c role={owner}") as c:
            assert pgdurable.migrate(c) == []
            migrations.check_schema(c)
        # a role that is not a member of the owner role: nothing to do is fine, but
        # it may not apply anything (not its schema)
        with psycopg.connect(as_role(dsn, app_role), autocommit=True) as c:
            assert pgdurable.migrate(c) == []
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM pgdurable.schema_migrations WHERE version = "
                      "(SELECT max(version) FROM pgdurable.schema_migrations)")
        with psycopg.connect(as_role(dsn, app_role), autocommit=True) as c, pytest.raises(
            MigrationError, match="owned by"
        ):
            pgdurable.migrate(c)


def test_grant_rejects_unknown_roles_and_changes_nothing(dsn: str) -> None:
    r = cli("grant", "--dsn", dsn, "--app-role", f"pgd_nobody_{uuid.uuid4().hex}")
    assert r.returncode == 2 and "no such role" in r.stderr
    with pytest.raises(ValueError):
        pgdurable.grant_roles(dsn)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pgdurable.security_roles").fetchone() == (0,)


def test_app_role_cannot_take_a_live_lease_by_setting_the_clock(dsn: str) -> None:
    """In a database where nobody enabled the test clock, SET pgdurable.now is
    ignored: the app role cannot make a live lease look expired."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgdurable.set_test_clock(false)")  # a production database
        c.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, "
                  "NULL, NULL, NULL)")
        c.execute("SELECT * FROM pgdurable.claim_runs('honest', '{default}', '{t}', '{1}', 1, "
                  "'1 min')")
        c.execute("SELECT * FROM pgdurable.acquire_lease('k', 'honest', 60000)")
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        grant(dsn, owner, app_role, ro)
        with psycopg.connect(as_role(dsn, app_role), autocommit=True) as c:
            c.execute("SET pgdurable.now = '2100-01-01 00:00:00+00'")
            stolen = c.execute("SELECT id FROM pgdurable.claim_runs('thief', '{default}', '{t}', "
                               "'{1}', 1, '1 min')").fetchall()
            assert stolen == []
            row = c.execute("SELECT acquired FROM pgdurable.acquire_lease('k', 'thief', 60000)"
                            ).fetchone()
            assert row == (False,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT pgdurable.set_test_clock(true)")


def test_the_test_clock_works_in_test_databases(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        conn.execute("SET LOCAL pgdurable.now = '2030-01-01 00:00:00+00'")
        row = conn.execute("SELECT pgdurable.now()").fetchone()
    assert row is not None and row[0].year == 2030
    row = conn.execute("SELECT pgdurable.now() = pg_catalog.now()").fetchone()
    assert row == (True,)


# ---------------------------------------------------------------------------------------
# 5. migrate adoption
# ---------------------------------------------------------------------------------------

_SQUAT = """
CREATE SCHEMA pgdurable;
CREATE TABLE public.pwned (by_role text, at timestamptz DEFAULT now());
GRANT INSERT ON public.pwned TO PUBLIC;
CREATE TABLE pgdurable.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
  sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION pgdurable.gotcha() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.pwned (by_role) VALUES (current_user); RETURN NEW; END $$;
CREATE TRIGGER gotcha BEFORE INSERT ON pgdurable.schema_migrations
  FOR EACH ROW EXECUTE FUNCTION pgdurable.gotcha();
"""


def test_migrate_refuses_a_schema_a_squatter_created(empty_dsn: str) -> None:
    with roles(empty_dsn, "LOGIN") as (squatter,):
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            c.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(c.info.dbname), sql.Identifier(squatter)))
            c.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(squatter)))
        with psycopg.connect(as_role(empty_dsn, squatter), autocommit=True) as c:
            c.execute(_SQUAT)
        r = cli("migrate", "--dsn", empty_dsn)  # the superuser
        assert r.returncode == 2 and "owned by" in r.stderr and "--adopt" in r.stderr, r.stderr
        with psycopg.connect(empty_dsn) as c:
            assert c.execute("SELECT count(*) FROM public.pwned").fetchone() == (0,)
            assert c.execute("SELECT to_regclass('pgdurable.runs')").fetchone() == (None,)
            owner = c.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace "
                              "WHERE nspname = 'pgdurable'").fetchone()
            assert owner == (squatter,)
            # check_schema trusts nothing there either
            with pytest.raises(SchemaVersionMismatch):
                migrations.check_schema(c)


@pytest.mark.parametrize("plant", [
    "CREATE SCHEMA pgdurable",  # an unrelated schema of the same name
    "CREATE SCHEMA pgdurable; CREATE TABLE pgdurable.schema_migrations (version integer "
    "PRIMARY KEY, name text, sha256 text, applied_at timestamptz DEFAULT now()); "
    "INSERT INTO pgdurable.schema_migrations VALUES (1, 'something_else.sql', 'x')",
    "CREATE SCHEMA pgdurable; CREATE TABLE pgdurable.schema_migrations (version integer "
    "PRIMARY KEY, name text, sha256 text, applied_at timestamptz DEFAULT now()); "
    "CREATE RULE r AS ON INSERT TO pgdurable.schema_migrations DO ALSO NOTIFY x",
])
def test_migrate_refuses_a_foreign_schema_of_its_own_role_unless_adopt(
    empty_dsn: str, plant: str
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(plant)
    with pytest.raises(MigrationError, match="--adopt"):
        pgdurable.migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regclass('pgdurable.runs')").fetchone() == (None,)
    if "RULE" in plant or "something_else" in plant:
        return
    r = cli("migrate", "--adopt", "--dsn", empty_dsn)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(empty_dsn) as c:
        migrations.check_schema(c)


def test_check_schema_distrusts_a_schema_migrations_planted_by_another_role(
    empty_dsn: str,
) -> None:
    with roles(empty_dsn, "LOGIN") as (planter,):
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            c.execute("CREATE SCHEMA pgdurable")
            c.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA pgdurable TO {}").format(
                sql.Identifier(planter)))
        rows = [(m.version, m.name, m.sha256) for m in migrations.load_migrations()]
        with psycopg.connect(as_role(empty_dsn, planter), autocommit=True) as c:
            c.execute("CREATE TABLE pgdurable.schema_migrations (version integer PRIMARY KEY, "
                      "name text, sha256 text, applied_at timestamptz DEFAULT now())")
            with c.cursor() as cur:
                cur.executemany("INSERT INTO pgdurable.schema_migrations VALUES (%s, %s, %s)", rows)
            c.execute("GRANT SELECT ON pgdurable.schema_migrations TO PUBLIC")
        with psycopg.connect(empty_dsn) as c, pytest.raises(SchemaVersionMismatch, match="owner"):
            migrations.check_schema(c)


def test_check_schema_distrusts_recorded_names_that_are_not_ours(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE pgdurable.schema_migrations SET name = 'evil.sql' WHERE version = 2")
        with pytest.raises(SchemaVersionMismatch, match="evil"):
            migrations.check_schema(c)


# ---------------------------------------------------------------------------------------
# 6. (task, revision) are pairs
# ---------------------------------------------------------------------------------------

def test_task_and_revision_are_matched_as_pairs(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT * FROM pgdurable.start_run(%s, 'c', '{}', 'default', 0, 3, NULL, "
                 "NULL, NULL, NULL)", ("a\x1fb",))
    claimed = conn.execute("SELECT id FROM pgdurable.claim_runs('w', '{default}', %s, %s, 5, "
                           "'1 min')", (["a"], ["b\x1fc"])).fetchall()
    assert claimed == []
    due = conn.execute("SELECT pgdurable.next_wakeup('{default}', %s, %s)",
                       (["a"], ["b\x1fc"])).fetchone()
    assert due == (None,)
    # the true pair is claimed, with its own max_reclaims bound
    claimed = conn.execute("SELECT task, revision FROM pgdurable.claim_runs('w', '{default}', "
                           "%s, %s, 5, '1 min', '{7, 9}')",
                           (["a", "a\x1fb"], ["b\x1fc", "c"])).fetchall()
    assert claimed == [("a\x1fb", "c")]


def test_wake_limiter_spends_defers_and_refunds() -> None:
    from pgdurable.foundation.hints import WakeLimiter

    lim = WakeLimiter(rate=0.001, burst=3)  # refills a token in ~17 minutes
    assert [lim.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.take() > 0  # the 4th is deferred (its token reserved)
    lim.refund()
    lim.refund()  # two claims found work
    assert lim.take() == 0.0
    with pytest.raises(ValueError):
        WakeLimiter(rate=0, burst=1)


def test_a_role_that_may_not_announce_still_reads_the_outcome(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A role set up by hand without EXECUTE on listen_presence: result() logs that
    it cannot announce itself and still gets the outcome (by reading)."""
    from pgdurable.runs.results import result_sync

    caplog.set_level(logging.DEBUG, logger="pgdurable")  # warned once per process, then debug
    with psycopg.connect(dsn, autocommit=True) as c:
        rid = c.execute("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, "
                        "NULL, NULL, NULL, NULL)").fetchone()[0]  # type: ignore[index]
        c.execute("SELECT pgdurable.cancel_run(%s)", (rid,))
    with roles(dsn, "LOGIN") as (who,):
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("GRANT USAGE ON SCHEMA pgdurable TO {}").format(sql.Identifier(who)))
            c.execute(sql.SQL("GRANT SELECT ON pgdurable.runs TO {}").format(sql.Identifier(who)))
        mine = as_role(dsn, who)
        with pytest.raises(pgdurable.RunCancelled):
            result_sync(mine, rid, 5, listen_to=mine)
    assert "cannot announce a listener" in caplog.text
