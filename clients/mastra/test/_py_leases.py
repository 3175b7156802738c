"""Python side of the interop tests: pgdurable's own lease provider driven by JSON lines.

Reads one JSON request per stdin line ({"op": ..., "args": [...]}) and answers
one JSON line; keys and owners travel as JSON strings (NUL included).
"""

import json
import sys

from pgdurable import PostgresLeaseProvider


def main() -> None:
    with PostgresLeaseProvider(sys.argv[1]) as p:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            op, args = req["op"], req.get("args", [])
            if op == "acquire":
                g = p.acquire_lease(*args)
                out = {"acquired": g.acquired, "owner": g.owner, "token": g.token}
            elif op == "owner":
                out = {"owner": p.get_lease_owner(*args)}
            elif op == "lease":
                g2 = p.get_lease(*args)
                out = {"owner": g2.owner if g2 else None, "token": g2.token if g2 else None}
            elif op == "release":
                p.release_lease(*args)
                out = {}
            elif op == "renew":
                out = {"renewed": p.renew_lease(*args)}
            elif op == "transfer":
                out = {"transferred": p.transfer_lease(*args)}
            else:
                out = {"error": f"unknown op {op}"}
            print(json.dumps({"reply": out}), flush=True)


if __name__ == "__main__":
    main()
