"""HTTP endpoints for browsers: start runs, send to threads, stream them as SSE.

``pgdurable.http.create_app(app, authorize=...)`` (this package; needs
``pgdurable[dashboard]`` for Starlette). See :mod:`pgdurable.ops.http.app`.
"""

from .app import Access, create_app

__all__ = ["Access", "create_app"]
