"""The role model: a NOLOGIN owner, an app role without table DML, a read-only role.

Run as a superuser against a migrated database (PGDURABLE_DSN). It creates three
roles with unique names, sets them up with pgdurable.grant_roles, shows what each
may do, and drops them again (roles are cluster-wide). See docs/security.md.
"""

from __future__ import annotations

import os
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgdurable

dsn = os.environ.get("PGDURABLE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
suffix = uuid.uuid4().hex[:8]
owner, app_role, ro = f"ex_owner_{suffix}", f"ex_app_{suffix}", f"ex_ro_{suffix}"


def ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


with psycopg.connect(dsn, autocommit=True) as admin:
    admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(ident(owner)))
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(app_role)))
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(ro)))
    try:
        # the same as: pgdurable grant --owner-role ... --app-role ... --readonly-role ...
        pgdurable.grant_roles(admin, owner_role=owner, app_role=app_role, readonly_role=ro)

        with psycopg.connect(make_conninfo(dsn, user=app_role), autocommit=True) as app:
            run = app.execute("SELECT run_id FROM pgdurable.start_run('hello', '1', '{}', "
                              "'default', 0, 3, NULL, NULL, NULL, NULL)").fetchone()
            print("app role started run", run[0] if run else None)
            try:
                app.execute("UPDATE pgdurable.runs SET status = 'completed'")
            except psycopg.errors.InsufficientPrivilege:
                print("app role: no UPDATE on pgdurable.runs (only the fenced functions)")
            try:  # an internal helper: not on the allow-list (pgdurable.security_api)
                app.execute("SELECT pgdurable._end(%s, 'completed', NULL, 0)", (run[0] if run else None,))
            except psycopg.errors.InsufficientPrivilege:
                print("app role: internal helpers are off the allow-list (permission denied)")

        with psycopg.connect(make_conninfo(dsn, user=ro), autocommit=True) as ops:
            for queue, runnable in ops.execute("SELECT queue, runnable FROM pgdurable.queue_stats"):
                print(f"read-only role sees queue {queue}: {runnable} runnable")
            try:
                ops.execute("SELECT state FROM pgdurable.runs")
            except psycopg.errors.InsufficientPrivilege:
                print("read-only role: views only, no run states")
    finally:
        # give everything back and drop the example's roles (to the admin role by its
        # name: `TO CURRENT_USER` crashes a Citus 13.2 coordinator)
        me = admin.execute("SELECT current_user").fetchone()
        assert me is not None
        admin.execute(sql.SQL("REASSIGN OWNED BY {} TO {}").format(ident(owner), ident(me[0])))
        for name in (owner, app_role, ro):
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident(name)))
