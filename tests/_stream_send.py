"""``python -m _stream_send DSN THREAD TEXT STRATEGY GO_FILE``: one racing sender
(tests/test_streams.py): waits until GO_FILE exists, sends TEXT to THREAD with
double_text=STRATEGY (``default``: none, the thread's or its route's), prints ``sent <action> <run id>`` or ``busy``."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from pgdurable import ThreadBusy


def spin(path: str) -> None:
    """Busy-wait for the start signal (both senders go within a millisecond)."""
    while not os.path.exists(path):
        time.sleep(0.001)


async def main() -> None:
    dsn, thread, text, strategy, go = sys.argv[1:6]
    os.environ["PGDURABLE_DSN"] = dsn
    from _stream_app import app

    async with app:
        await app.fetchone("SELECT 1", ())  # connected before the start signal
        print("ready", flush=True)
        spin(go)
        try:
            d = await app.send(thread, {"text": text}, message_id=text,
                               double_text=None if strategy == "default"
                               else strategy)  # type: ignore[arg-type]
            print("sent", d.action, d.run_id, flush=True)
        except ThreadBusy:
            print("busy", flush=True)


asyncio.run(main())
