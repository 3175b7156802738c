"""The scripted answers of the token-stream tests (no app, no database)."""

from __future__ import annotations


def script(prompt: str, words: int = 60) -> str:
    """The scripted answer to ``prompt``: deterministic, ``words`` words long."""
    out = [f"<{prompt}>"]
    for i in range(words):
        out.append(f"w{i}-{len(prompt) * 7 + i * 13 % 97}")
    return " ".join(out) + "."


def tokens(text: str) -> list[str]:
    """The tokens of a text: words with their leading space, some split in two."""
    parts: list[str] = []
    for i, word in enumerate(text.split(" ")):
        piece = word if i == 0 else " " + word
        if len(piece) > 4 and i % 3 == 0:
            parts += [piece[:3], piece[3:]]
        else:
            parts.append(piece)
    return parts
