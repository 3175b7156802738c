"""Text from the database (or argv) made safe to show an operator.

Error messages, refs, worker names and keys are data: anyone who can write a
run can put ``[/]`` (Rich markup), ``[link=...]`` or ESC sequences in them.
The CLI prints them through :func:`plain`, which Rich never parses as markup,
after :func:`escape_controls` has made every control character visible
(``\\x1b``) so that none reaches the terminal.
"""

from __future__ import annotations

import re

from rich.text import Text

__all__ = ["escape_controls", "escape_json_controls", "plain"]

# C0 controls, DEL, C1 controls (CSI is \x9b), and the bidirectional overrides
# and isolates that reorder what a terminal shows ("Trojan Source")
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# what JSON output must still escape: json.dumps already escapes C0 (< 0x20)
_JSON_CONTROLS = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` / ``\\uNNNN``."""
    return _CONTROLS.sub(_visible, text)


def escape_json_controls(text: str) -> str:
    """JSON ``text`` with DEL, C1 and bidi controls as ``\\uNNNN`` escapes (still
    the same JSON value)."""
    return _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def plain(value: object, style: str = "") -> Text:
    """``value`` as Rich text: never parsed as markup, controls escaped."""
    return Text(escape_controls("" if value is None else str(value)), style=style)


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
