"""A webhook sender that signs by hand, with the standard library only.

This is what a CI system, a chat bot or a script in any language does to
call ``POST /signals/{kind}/{ref}`` on the pgdurable webhook app
(``docs/webhooks.md``). Port :func:`signed_headers` to your language; in
Python you can also call ``pgdurable.webhooks.sign_request``, which computes
the same headers.

Run as a script, it checks the hand-made headers against
``sign_request``, then serves ``examples/webhook_app.py`` and delivers the CI
callback with ``urllib`` (including one retry of the same delivery, which the
app deduplicates).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from urllib.parse import quote


def signed_headers(secret: str, kind: str, ref: str, body: bytes,
                   signal_id: str | None = None, timestamp: int | None = None) -> dict[str, str]:
    """The headers of a v1-signed ``POST /signals/{kind}/{ref}`` with ``body``."""
    ts = int(time.time()) if timestamp is None else timestamp
    # 1. the path: kind and ref as UTF-8, every byte but A-Z a-z 0-9 - . _ ~ as %XX
    path = "/signals/" + quote(kind, safe="") + "/" + quote(ref, safe="")
    # 2. the canonical string: six parts joined by "\n", the raw body last
    head = "\n".join(["v1", str(ts), "POST", path, signal_id or ""])
    canonical = head.encode("utf-8") + b"\n" + body
    # 3. HMAC-SHA256 with the kind's secret, lower-case hex, prefixed "v1="
    digest = hmac.new(secret.encode("utf-8"), canonical, hashlib.sha256).hexdigest()
    headers = {"X-Pgdurable-Timestamp": str(ts), "X-Pgdurable-Signature": "v1=" + digest,
               "Content-Type": "application/json"}
    if signal_id is not None:  # strongly advised: retries are then delivered once
        headers["Idempotency-Key"] = signal_id
    return headers


def deliver(base_url: str, secret: str, kind: str, ref: str, payload: object,
            signal_id: str) -> tuple[int, dict[str, object]]:
    """POST ``payload`` as a signal; return (status, JSON answer).

    On a 5xx (or no answer at all) the outcome is unknown: retry the same
    delivery with the same ``signal_id``; it is stored and delivered once.
    """
    body = json.dumps(payload).encode("utf-8")
    url = base_url + "/signals/" + quote(kind, safe="") + "/" + quote(ref, safe="")
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers=signed_headers(secret, kind, ref, body, signal_id))
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def main() -> None:
    from webhook_app import CI_SECRET, deploy_and_wait, serving

    from pgdurable import webhooks

    for signal_id, ref in ((None, "build-7"), ("gh-1", "feature/ü x")):
        by_hand = signed_headers(CI_SECRET, "ci", ref, b'{"a": 1}', signal_id, 1700000000)
        helper = webhooks.sign_request(CI_SECRET, "ci", ref, b'{"a": 1}', signal_id=signal_id,
                                       timestamp=1700000000)
        assert {k: v for k, v in by_hand.items() if k != "Content-Type"} == helper
    print("hand-made headers match pgdurable.webhooks.sign_request")

    async with serving() as base:
        async def post(run_id: str) -> None:
            for attempt in (1, 2):  # the second is a retry of the same delivery
                status, answer = await asyncio.to_thread(
                    deliver, base, CI_SECRET, "ci", "build/42", {"conclusion": "success"},
                    "ci-delivery-42")
                print(f"delivery {attempt}:", status, answer)
                assert status == 200 and answer["woken"] == [run_id]

        await deploy_and_wait(post)


if __name__ == "__main__":
    asyncio.run(main())
