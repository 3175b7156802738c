"""``python -m _stream_http PORT [STATIC_DIR]``: serve pgdurable.http.create_app for
the app of tests/_stream_app.py (PGDURABLE_DSN, PGDURABLE_STREAM_SECRETS) with
uvicorn on 127.0.0.1:PORT; with STATIC_DIR, its files under /page/ (the browser
test's page and bundle). ``authorize`` allows what carries the header
``X-Test-Auth: yes`` (the tests' stand-in for a session)."""

from __future__ import annotations

import sys

import uvicorn
from _stream_app import app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from pgdurable.http import Access, create_app


def authorize(request: Request, access: Access) -> bool:
    return request.headers.get("x-test-auth") == "yes"


def main() -> None:
    port = int(sys.argv[1])
    routes = [Mount("/agent", create_app(app, authorize=authorize, heartbeat=1.0))]
    if len(sys.argv) > 2:
        routes.append(Mount("/page", StaticFiles(directory=sys.argv[2], html=True)))
    uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
