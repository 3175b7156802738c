"""Serve tests/_mcp_app.py's MCP server over Streamable HTTP (stateless, JSON responses).

``python tests/_mcp_server.py PORT`` with ``PGDURABLE_DSN`` set: many such
processes behind one load balancer are the same server (no sticky sessions).
With ``MCP_STATEFUL=1`` it keeps sessions (``Mcp-Session-Id``, a standalone GET
stream): what a 2025-11-25 client needs to hear ``notifications/tasks/status``.
"""

from __future__ import annotations

import os
import sys

import uvicorn
from _mcp_app import server

if __name__ == "__main__":
    port = int(sys.argv[1])
    stateful = os.environ.get("MCP_STATEFUL") == "1"
    asgi = server.streamable_http_app(stateless_http=not stateful, json_response=True)
    uvicorn.run(asgi, host="127.0.0.1", port=port, log_level="warning")
