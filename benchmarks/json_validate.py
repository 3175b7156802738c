"""What checking a state before it is written costs: ``_json.validate``'s fast
check against the walk that keeps every path, and against encoding the JSON.

One command (no database)::

    .venv/bin/python benchmarks/json_validate.py

Every Continue/Done state, signal payload and effect result is validated
before any SQL runs (NaN, NUL, lone surrogates, tuples, non-str keys, too deep,
circular: refused with the path of the offending value). ``validate`` first
runs a fast check without paths (``_json._plain``) and walks the value with
its paths (``_json._validate``, what ``validate`` always did before) only when
the fast check is unsure. Printed per state: µs per call of each, and the
ratio fast / walk; the baseline is the walk, and the encoding that follows
validation in ``dumps`` is shown for scale.
"""

from __future__ import annotations

import timeit
from typing import Any

from pgdurable.foundation import jsonb as _json

STATES: dict[str, Any] = {
    "a counter {'i': 1}": {"i": 1},
    "an agent's state (50 messages with tool calls)": {
        "messages": [
            {"role": "user" if i % 2 else "assistant", "content": "lorem ipsum dolor sit " * 8,
             "tool_calls": [{"id": f"call_{i}", "name": "search",
                             "args": {"q": "x" * 40, "k": 5}}]}
            for i in range(50)
        ],
        "plan": ["search", "read", "summarize"], "step": 3, "score": 0.75, "note": "café",
    },
}


def per_call(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    print(f"{'state':<48} {'validate':>9} {'walk':>9} {'encode':>9} {'validate/walk':>14}")
    for name, state in STATES.items():
        number = 20_000 if len(str(state)) < 100 else 500
        fast = per_call(lambda s=state: _json.validate(s, "state"), number)
        walk = per_call(lambda s=state: _json._validate(s, "state"), number)
        enc = per_call(lambda s=state: _json._ENCODER.encode(s), number)
        print(f"{name:<48} {fast:7.1f}µs {walk:7.1f}µs {enc:7.1f}µs {fast / walk:14.2f}")


if __name__ == "__main__":
    main()
