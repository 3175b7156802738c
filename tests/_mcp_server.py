"""Serve tests/_mcp_app.py's MCP server over Streamable HTTP (stateless, JSON responses).

``python tests/_mcp_server.py PORT`` with ``PGDURABLE_DSN`` set: many such
processes behind one load balancer are the same server (no sticky sessions).
"""

from __future__ import annotations

import sys

import uvicorn
from _mcp_app import server

if __name__ == "__main__":
    port = int(sys.argv[1])
    asgi = server.streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(asgi, host="127.0.0.1", port=port, log_level="warning")
