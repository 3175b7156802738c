"""A stdio MCP server for tests/test_contrib_pydantic_ai.py: one tool, ``lookup``, that
records each real call in ``test_ledger`` (the database in ``PGDURABLE_DSN``)."""

from __future__ import annotations

import os

import psycopg
from mcp.server.mcpserver import MCPServer

server = MCPServer("lookup")


@server.tool()
def lookup(code: str) -> str:
    """Look up a booking code."""
    with psycopg.connect(os.environ["PGDURABLE_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO test_ledger (event, pid, tag) VALUES ('mcp', %s, %s)",
                     (os.getpid(), code))
    return f"booking {code}: confirmed"


if __name__ == "__main__":
    server.run("stdio")
