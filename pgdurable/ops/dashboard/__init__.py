"""The pgdurable web dashboard (optional: ``pip install 'pgdurable[dashboard]'``).

``pgdurable dashboard --dsn ... --port 8080`` serves it; :func:`create_app`
returns the ASGI app to mount in FastAPI/Starlette. Server-rendered (Jinja2),
assets shipped in the package (no build step, no CDN), live over SSE from one
LISTEN connection per server. With a token (a login form, then a session
cookie) or an ``authorize`` hook, every route is guarded; without either it
belongs on loopback. Only trusted hosts are served (loopback by default).
See docs/dashboard.md.
"""

from __future__ import annotations

from .app import Authorize, create_app, exposure_warnings, serve

__all__ = ["Authorize", "create_app", "exposure_warnings", "serve"]
